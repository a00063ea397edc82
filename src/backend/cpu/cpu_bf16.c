/* cpu_bf16.c - the CPU backend's bf16 mode (--cpu-dtype bf16): activations
 * and the act copy of the weights in bf16, master weights, gradients and
 * optimiser state in fp32 (the CUDA backend's contract, backend.h).
 *
 * The GEMMs are bf16 x bf16 with fp32 accumulation (oneDNN, cpu_dnnl.c),
 * rounded once to the output's dtype.  Every other op computes in fp32 and
 * rounds its act outputs to bf16 (nearest even):
 *  - the element-wise ops (GeLU, residual and bias adds, the embedding
 *    lookup) convert as they go;
 *  - layer norm, attention, the embedding and bias gradients convert their
 *    act inputs into fp32 scratch (sized by reserve: B*T*4C floats, three
 *    buffers), run the fp32 op and round its act outputs;
 *  - the classifier keeps its logits chunk in fp32, rounds dlogits to bf16
 *    for the two backward GEMMs; the vocabulary-parallel classifier's
 *    logits are act (bf16), as on CUDA, converted as they are read.
 * The GEMMs are where a step spends its time: the conversions add a pass
 * over activations to ops that are memory-bound anyway. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "base/bf16.h"

typedef uint16_t bf16;

/* y (n) f32 = x (n) bf16, parallel. */
static void load(const cpu_ctx *c, float *restrict y, const void *x, size_t n) {
    const bf16 *restrict h = x;
#pragma omp parallel for schedule(static) num_threads(c->threads)
    for (size_t i = 0; i < n; i++)
        y[i] = ms_bf16_to_f32(h[i]);
}

/* y (n) bf16 = x (n) f32 rounded to nearest even, parallel. */
static void store(const cpu_ctx *c, void *y, const float *restrict x, size_t n) {
    bf16 *restrict h = y;
#pragma omp parallel for schedule(static) num_threads(c->threads)
    for (size_t i = 0; i < n; i++)
        h[i] = ms_f32_to_bf16(x[i]);
}

/* The fp32 scratch buffer k (0..2) for n floats. */
static float *scratch(cpu_ctx *c, int k, size_t n, const char *op) {
    MS_CHECKF(n <= c->x_floats, "cpu bf16 %s: %zu floats exceed the %zu of scratch (call reserve)",
              op, n, c->x_floats);
    return c->x[k];
}

void cpu16_to_act(be_backend *be, void *dst, const float *src, size_t n) {
    store(cpu_ctx_of(be), dst, src, n);
}

/* ---- embedding ---- */

static void emb16_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                      const void *wpe, int B, int T, int C, int v0, int Vs) {
    bf16 *o = out;
    const bf16 *te = wte, *pe = wpe;
    long rows = (long)B * T;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (long r = 0; r < rows; r++) {
        int32_t id = tok[r];
        MS_CHECKF(id >= 0, "embedding: negative token id %d at row %ld", (int)id, r);
        bf16 *restrict y = o + (size_t)r * C;
        int in = id - v0 >= 0 && id - v0 < Vs;
        const bf16 *restrict a = te + (size_t)(in ? id - v0 : 0) * C;
        const bf16 *restrict p = pe ? pe + (size_t)(r % T) * C : NULL;
        for (int c = 0; c < C; c++) {
            float s = (in ? ms_bf16_to_f32(a[c]) : 0.0f) + (p ? ms_bf16_to_f32(p[c]) : 0.0f);
            y[c] = ms_f32_to_bf16(s);
        }
    }
}

void cpu16_embedding_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                         const void *wpe, int B, int T, int C) {
    emb16_fwd(be, out, tok, wte, wpe, B, T, C, 0, 0x7fffffff);
}

void cpu16_embedding_slice_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                               const void *wpe, int B, int T, int C, int v0, int Vs) {
    MS_CHECKF(v0 >= 0 && Vs >= 0, "embedding slice: bad slice v0=%d Vs=%d", v0, Vs);
    emb16_fwd(be, out, tok, wte, wpe, B, T, C, v0, Vs);
}

void cpu16_embedding_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                         const int32_t *tok, int B, int T, int C) {
    cpu_ctx *c = cpu_ctx_of(be);
    size_t n = (size_t)B * T * C;
    float *d = scratch(c, 0, n, "embedding_bwd");
    load(c, d, dout, n);
    cpu_embedding_bwd(be, dwte, dwpe, d, tok, B, T, C);
}

void cpu16_embedding_slice_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                               const int32_t *tok, int B, int T, int C, int v0, int Vs) {
    cpu_ctx *c = cpu_ctx_of(be);
    size_t n = (size_t)B * T * C;
    float *d = scratch(c, 0, n, "embedding_slice_bwd");
    load(c, d, dout, n);
    cpu_embedding_slice_bwd(be, dwte, dwpe, d, tok, B, T, C, v0, Vs);
}

/* ---- layer norm: the weights (C) come in through the small wb scratch ---- */

void cpu16_layernorm_fwd(be_backend *be, void *out, float *mean, float *rstd, const void *inp,
                         const void *w, const void *b, int N, int C) {
    cpu_ctx *c = cpu_ctx_of(be);
    size_t n = (size_t)N * C;
    MS_CHECKF(C <= c->wb_C, "cpu bf16 layernorm: C=%d above the reserved %d", C, c->wb_C);
    float *x = scratch(c, 0, n, "layernorm_fwd"), *y = scratch(c, 1, n, "layernorm_fwd");
    load(c, x, inp, n);
    load(c, c->wb, w, (size_t)C);
    load(c, c->wb + C, b, (size_t)C);
    cpu_layernorm_fwd(be, y, mean, rstd, x, c->wb, c->wb + C, N, C);
    store(c, out, y, n);
}

void cpu16_layernorm_bwd(be_backend *be, void *dinp, float *dw, float *db, const void *dout,
                         const void *inp, const void *w, const float *mean, const float *rstd,
                         int N, int C) {
    cpu_ctx *c = cpu_ctx_of(be);
    size_t n = (size_t)N * C;
    MS_CHECKF(C <= c->wb_C, "cpu bf16 layernorm: C=%d above the reserved %d", C, c->wb_C);
    float *dx = scratch(c, 0, n, "layernorm_bwd"), *dy = scratch(c, 1, n, "layernorm_bwd");
    float *x = scratch(c, 2, n, "layernorm_bwd");
    load(c, dx, dinp, n); /* accumulated into */
    load(c, dy, dout, n);
    load(c, x, inp, n);
    load(c, c->wb, w, (size_t)C);
    cpu_layernorm_bwd(be, dx, dw, db, dy, x, c->wb, mean, rstd, N, C);
    store(c, dinp, dx, n);
}

/* ---- GEMM ---- */

void cpu16_gemm(be_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                int lda, const void *Bm, int ldb, float beta, void *C, int ldc, int c_f32,
                const void *bias, be_epilogue epi, void *pre) {
    cpu_ctx *cx = cpu_ctx_of(be);
    if (M <= 0 || N <= 0) return;
    MS_CHECKF(K > 0, "cpu bf16 gemm: K=%d", K);
    void *dst = C;
    if (epi == BE_EPI_GELU) {
        MS_CHECKF(pre != NULL && beta == 0.0f && !c_f32,
                  "gemm: the GeLU epilogue needs pre, beta 0 and an act output");
        dst = pre;
    }
    /* oneDNN adds the bias after the product; with alpha != 1 (never with a
     * bias in the model) it is added here, after the rounding */
    const bf16 *b_in = alpha == 1.0f ? bias : NULL;
    cpu_blas_threads(cx);
    cpu_dnnl_gemm(cx->dnnl, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, dst, ldc, c_f32, b_in);
    const bf16 *bs = bias;
    if (bs && !b_in) {
        MS_CHECKF(!c_f32, "cpu bf16 gemm: a bias on an f32 output");
#pragma omp parallel for schedule(static) num_threads(cx->threads)
        for (int r = 0; r < M; r++) {
            bf16 *restrict y = (bf16 *)dst + (size_t)r * ldc;
            for (int j = 0; j < N; j++)
                y[j] = ms_f32_to_bf16(ms_bf16_to_f32(y[j]) + ms_bf16_to_f32(bs[j]));
        }
    }
    if (epi == BE_EPI_GELU) {
#pragma omp parallel for schedule(static) num_threads(cx->threads)
        for (int r = 0; r < M; r++) {
            const bf16 *restrict p = (const bf16 *)pre + (size_t)r * ldc;
            bf16 *restrict y = (bf16 *)C + (size_t)r * ldc;
            for (int j = 0; j < N; j++)
                y[j] = ms_f32_to_bf16(cpu_gelu(ms_bf16_to_f32(p[j])));
        }
    }
}

void cpu16_bias_bwd(be_backend *be, float *dbias, const void *dout, int M, int N) {
    cpu_ctx *c = cpu_ctx_of(be);
    size_t n = (size_t)M * N;
    float *d = scratch(c, 0, n, "bias_bwd");
    load(c, d, dout, n);
    cpu_bias_bwd(be, dbias, d, M, N);
}

/* ---- attention: fp32 inside, the probabilities (state) in fp32 ---- */

void cpu16_attention_fwd(be_backend *be, void *out, void *state, const void *qkv, int B, int T,
                         int C, int NH, int W) {
    cpu_ctx *c = cpu_ctx_of(be);
    size_t n = (size_t)B * T * C;
    float *x = scratch(c, 0, 3 * n, "attention_fwd"), *y = scratch(c, 1, n, "attention_fwd");
    load(c, x, qkv, 3 * n);
    cpu_attention_fwd(be, y, state, x, B, T, C, NH, W);
    store(c, out, y, n);
}

void cpu16_attention_bwd(be_backend *be, void *dqkv, const void *dout, const void *out,
                         const void *qkv, const void *state, int B, int T, int C, int NH, int W) {
    cpu_ctx *c = cpu_ctx_of(be);
    size_t n = (size_t)B * T * C;
    float *x = scratch(c, 0, 3 * n, "attention_bwd"), *dy = scratch(c, 1, n, "attention_bwd");
    float *dx = scratch(c, 2, 3 * n, "attention_bwd");
    load(c, x, qkv, 3 * n);
    load(c, dy, dout, n);
    cpu_attention_bwd(be, dx, dy, NULL, x, state, B, T, C, NH, W); /* out: unused on the CPU */
    store(c, dqkv, dx, 3 * n);
}

/* ---- element-wise ---- */

void cpu16_gelu_fwd(be_backend *be, void *out, const void *inp, size_t n) {
    bf16 *restrict y = out;
    const bf16 *restrict x = inp;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++)
        y[i] = ms_f32_to_bf16(cpu_gelu(ms_bf16_to_f32(x[i])));
}

void cpu16_gelu_bwd(be_backend *be, void *dinp, const void *inp, const void *dout, size_t n) {
    bf16 *dx = dinp; /* may alias dout */
    const bf16 *x = inp, *dy = dout;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++)
        dx[i] = ms_f32_to_bf16(cpu_gelu_grad(ms_bf16_to_f32(x[i])) * ms_bf16_to_f32(dy[i]));
}

void cpu16_residual_add(be_backend *be, void *out, const void *a, const void *b, size_t n) {
    bf16 *y = out;
    const bf16 *p = a, *q = b;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++)
        y[i] = ms_f32_to_bf16(ms_bf16_to_f32(p[i]) + ms_bf16_to_f32(q[i]));
}

void cpu16_bias_add(be_backend *be, void *out, const void *bias, int M, int N) {
    bf16 *y = out;
    const bf16 *b = bias;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (long r = 0; r < (long)M; r++) {
        bf16 *restrict yr = y + (size_t)r * N;
        for (int c = 0; c < N; c++)
            yr[c] = ms_f32_to_bf16(ms_bf16_to_f32(yr[c]) + ms_bf16_to_f32(b[c]));
    }
}

/* ---- the classifier ---- */

/* losses (N) =; if dx: dx (N,C) act =, dwte (Vp,C) f32 += (rows < V only).
 * Per chunk: logits (fp32) = x_chunk @ wte^T, the softmax rows, dlogits
 * rounded to bf16 (the chunk's bf16 scratch), then the two GEMMs. */
void cpu16_classifier_fwd_bwd(be_backend *be, float *losses, void *dx, float *dwte, const void *x,
                              const void *wte, const int32_t *targets, int N, int C, int V, int Vp,
                              float dloss) {
    cpu_ctx *cx = cpu_ctx_of(be);
    MS_CHECKF(V > 0 && V <= Vp, "classifier: V=%d must be in [1, Vp=%d]", V, Vp);
    size_t R = cpu_cls_rows(cx, N, V);
    const bf16 *xs = x, *w = wte;
    bf16 *dxs = dx, *L16 = cx->cls16;
    float *L = cx->cls;
    int grad = dx != NULL;
    for (int r0 = 0; r0 < N; r0 += (int)R) {
        int rb = N - r0 < (int)R ? N - r0 : (int)R;
        const bf16 *xc = xs + (size_t)r0 * C;
        cpu_blas_threads(cx);
        cpu_dnnl_gemm(cx->dnnl, 0, 1, rb, V, C, 1.0f, xc, C, w, C, 0.0f, L, V, 1, NULL);
#pragma omp parallel for schedule(static) num_threads(cx->threads)
        for (int i = 0; i < rb; i++) {
            int tgt = targets[r0 + i];
            MS_CHECKF(tgt >= 0 && tgt < V, "classifier: target %d at row %d outside [0,%d)", tgt,
                      r0 + i, V);
            float *l = L + (size_t)i * V;
            losses[r0 + i] = cpu_cls_row(l, V, tgt, grad, dloss, i + 1 < rb ? l + V : NULL);
            if (grad)
                for (int j = 0; j < V; j++)
                    L16[(size_t)i * V + j] = ms_f32_to_bf16(l[j]);
        }
        if (!grad) continue;
        cpu_dnnl_gemm(cx->dnnl, 0, 0, rb, C, V, 1.0f, L16, V, w, C, 0.0f, dxs + (size_t)r0 * C, C,
                      0, NULL);
        cpu_dnnl_gemm(cx->dnnl, 1, 0, V, C, rb, 1.0f, L16, V, xc, C, 1.0f, dwte, C, 1, NULL);
    }
}

/* Max and sum of exp(l[j] - max) of a bf16 row l (n >= 1), converting as
 * it reads (the sum in double with 8 fixed lanes). */
static float row_max16(const bf16 *restrict l, int n) {
    float acc[16];
    for (int k = 0; k < 16; k++)
        acc[k] = ms_bf16_to_f32(l[0]);
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int k = 0; k < 16; k++) {
            float v = ms_bf16_to_f32(l[j + k]);
            acc[k] = v > acc[k] ? v : acc[k];
        }
    float m = acc[0];
    for (int k = 1; k < 16; k++)
        m = acc[k] > m ? acc[k] : m;
    for (; j < n; j++) {
        float v = ms_bf16_to_f32(l[j]);
        m = v > m ? v : m;
    }
    return m;
}

static double sum_exp16(const bf16 *restrict l, int n, float m) {
    double acc[8] = {0}, sum = 0.0;
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += (double)cpu_expf(ms_bf16_to_f32(l[j + k]) - m);
    for (int k = 0; k < 8; k++)
        sum += acc[k];
    for (; j < n; j++)
        sum += (double)cpu_expf(ms_bf16_to_f32(l[j]) - m);
    return sum;
}

/* The vocabulary-parallel classifier, phase 1: logits (R,Vs) act =
 * x @ wte^T (rounded to bf16 once), stats (R,3) from the bf16 logits. */
void cpu16_classifier_slice_stats(be_backend *be, float *stats, void *logits, const void *x,
                                  const void *wte, const int32_t *targets, int R, int C, int Vs,
                                  int v0) {
    cpu_ctx *cx = cpu_ctx_of(be);
    MS_CHECKF(R >= 0 && Vs >= 0 && v0 >= 0, "classifier slice: bad R=%d Vs=%d v0=%d", R, Vs, v0);
    bf16 *L = logits;
    if (Vs > 0 && R > 0) {
        cpu_blas_threads(cx);
        cpu_dnnl_gemm(cx->dnnl, 0, 1, R, Vs, C, 1.0f, x, C, wte, C, 0.0f, L, Vs, 0, NULL);
    }
#pragma omp parallel for schedule(static) num_threads(cx->threads)
    for (int i = 0; i < R; i++) {
        float *st = stats + (size_t)i * 3;
        const bf16 *l = L + (size_t)i * Vs;
        int tg = targets[i] - v0;
        MS_CHECKF(targets[i] >= 0, "classifier slice: negative target %d at row %d", targets[i], i);
        if (Vs == 0) {
            st[0] = -FLT_MAX, st[1] = 0.0f, st[2] = 0.0f;
            continue;
        }
        float m = row_max16(l, Vs);
        st[0] = m;
        st[1] = (float)sum_exp16(l, Vs, m);
        st[2] = tg >= 0 && tg < Vs ? ms_bf16_to_f32(l[tg]) : 0.0f;
    }
}

/* Phase 2: losses (R) =; if dx: logits (R,Vs) act -> dlogits (bf16),
 * dx (R,C) act =, dwte (Vs,C) f32 +=. */
void cpu16_classifier_slice_finish(be_backend *be, float *losses, void *dx, float *dwte,
                                   void *logits, const void *x, const void *wte,
                                   const int32_t *targets, const float *stats, int P, int R, int C,
                                   int Vs, int v0, float dloss) {
    cpu_ctx *cx = cpu_ctx_of(be);
    MS_CHECKF(P >= 1 && R >= 0 && Vs >= 0, "classifier slice: bad P=%d R=%d Vs=%d", P, R, Vs);
    bf16 *L = logits;
    int grad = dx != NULL;
#pragma omp parallel for schedule(static) num_threads(cx->threads)
    for (int i = 0; i < R; i++) {
        float M;
        double S = cpu_cls_row_sum_exp(stats, P, R, i, &M);
        losses[i] = cpu_cls_slice_loss(stats, P, R, i, M, S);
        if (!grad || Vs == 0) continue;
        bf16 *restrict l = L + (size_t)i * Vs; /* softmax = exp(l - M) / S */
        float s = (float)((double)dloss / S);
        int tg = targets[i] - v0;
        for (int j = 0; j < Vs; j++) {
            float d = cpu_expf(ms_bf16_to_f32(l[j]) - M) * s;
            if (j == tg) d -= dloss;
            l[j] = ms_f32_to_bf16(d);
        }
    }
    if (!grad) return;
    if (Vs == 0 || R == 0) {
        memset(dx, 0, (size_t)R * C * sizeof(bf16));
        return;
    }
    cpu_blas_threads(cx);
    cpu_dnnl_gemm(cx->dnnl, 0, 0, R, C, Vs, 1.0f, L, Vs, wte, C, 0.0f, dx, C, 0, NULL);
    cpu_dnnl_gemm(cx->dnnl, 1, 0, Vs, C, R, 1.0f, L, Vs, x, C, 1.0f, dwte, C, 1, NULL);
}
