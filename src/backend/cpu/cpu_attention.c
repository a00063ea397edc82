/* cpu_attention.c - causal (optionally windowed) multi-head attention,
 * forward and backward, keeping the probabilities P as the saved state.
 *
 * Work is parallel over the B*NH (batch, head) pairs; inside one pair the
 * products are single-threaded cblas_sgemm calls (the OpenMP OpenBLAS runs
 * one thread inside a parallel region).  Query rows go in blocks of
 * CPU_ATT_BLOCK; a block only multiplies against the keys its rows can see
 * (k0 = first key of the block's first row, up to the block's last row),
 * which halves the work for causal attention and skips far more with a
 * window.  Masked positions get exactly zero probability.
 */
#include <math.h>
#include <omp.h>

#include <cblas.h>

#include "backend/cpu/cpu_internal.h"

/* First key query t may see (window W > 0), or 0 (full causal). */
static inline int cpu_att_lo(int t, int W) {
    return W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
}

size_t cpu_attention_state_bytes(be_backend *be, int B, int T, int NH) {
    return (size_t)B * NH * T * T * sizeof(float);
}

/* Softmax in place of row x (T) over columns [lo, t]; every other column
 * of the row becomes 0. */
static void cpu_att_softmax_row(float *restrict x, int lo, int t, int T) {
    int n = t - lo + 1;
    float *restrict s = x + lo;
    float m = cpu_max_f(s, n);
    for (int j = 0; j < n; j++)
        s[j] = cpu_expf(s[j] - m);
    float inv = 1.0f / cpu_sum_f(s, n);
    for (int j = 0; j < n; j++)
        s[j] *= inv;
    memset(x, 0, (size_t)lo * sizeof(float));
    memset(x + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
}

/* One (b,h) pair.  q/k/v (T,hs) with row stride ld = 3C; P (T,T);
 * o (T,hs) with row stride C. */
static void cpu_att_fwd_head(float *o, float *P, const float *q, const float *k, const float *v,
                             int T, int hs, int C, int W) {
    int ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int r0 = 0; r0 < T; r0 += CPU_ATT_BLOCK) {
        int r1 = r0 + CPU_ATT_BLOCK < T ? r0 + CPU_ATT_BLOCK : T;
        int rb = r1 - r0, k0 = cpu_att_lo(r0, W), kb = r1 - k0;
        float *Pb = P + (size_t)r0 * T + k0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, kb, hs, scale, q + (size_t)r0 * ld,
                    ld, k + (size_t)k0 * ld, ld, 0.0f, Pb, T);
        for (int t = r0; t < r1; t++)
            cpu_att_softmax_row(P + (size_t)t * T, cpu_att_lo(t, W), t, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, kb, 1.0f, Pb, T,
                    v + (size_t)k0 * ld, ld, 0.0f, o + (size_t)r0 * C, C);
    }
}

/* out (B,T,C) =, state P (B,NH,T,T) =, from qkv (B,T,3C). */
void cpu_attention_fwd(be_backend *be, void *out, void *state, const void *qkv, int B, int T, int C,
                       int NH, int W) {
    MS_CHECKF(NH > 0 && C % NH == 0, "attention: C=%d not divisible by NH=%d", C, NH);
    int hs = C / NH;
    float *o = out, *P = state;
    const float *x = qkv;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = x + (size_t)b * T * 3 * C + (size_t)h * hs;
        cpu_att_fwd_head(o + (size_t)b * T * C + (size_t)h * hs, P + (size_t)bh * T * T, q, q + C,
                         q + 2 * C, T, hs, C, W);
    }
}

/* dS = P * (dP - rowsum(dP * P)) in place of dP for rows r0..r1-1; dP rows
 * (stride T) hold columns k0..r1-1; columns a row cannot see become 0. */
static void cpu_att_dsoftmax(float *dP, const float *P, int r0, int r1, int k0, int T, int W) {
    int kb = r1 - k0;
    for (int t = r0; t < r1; t++) {
        float *restrict d = dP + (size_t)(t - r0) * T;
        const float *restrict p = P + (size_t)t * T + k0;
        int lo = cpu_att_lo(t, W) - k0, hi = t - k0; /* visible: [lo, hi] */
        float acc[16] = {0}, dot = 0.0f;
        int j = lo;
        for (; j + 16 <= hi + 1; j += 16)
            for (int l = 0; l < 16; l++)
                acc[l] += p[j + l] * d[j + l];
        for (int l = 0; l < 16; l++)
            dot += acc[l];
        for (; j <= hi; j++)
            dot += p[j] * d[j];
        for (j = lo; j <= hi; j++)
            d[j] = p[j] * (d[j] - dot);
        memset(d, 0, (size_t)lo * sizeof(float));
        memset(d + hi + 1, 0, (size_t)(kb - hi - 1) * sizeof(float));
    }
}

/* One (b,h) pair of the backward.  q,k,v,dq,dk,dv (T,hs) with row stride
 * 3C; dout (T,hs) with row stride C; P (T,T); S scratch (CPU_ATT_BLOCK,T). */
static void cpu_att_bwd_head(float *dq, float *dk, float *dv, const float *dout, const float *P,
                             const float *q, const float *k, const float *v, float *S, int T,
                             int hs, int C, int W) {
    int ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int t = 0; t < T; t++) {
        memset(dk + (size_t)t * ld, 0, (size_t)hs * sizeof(float));
        memset(dv + (size_t)t * ld, 0, (size_t)hs * sizeof(float));
    }
    for (int r0 = 0; r0 < T; r0 += CPU_ATT_BLOCK) {
        int r1 = r0 + CPU_ATT_BLOCK < T ? r0 + CPU_ATT_BLOCK : T;
        int rb = r1 - r0, k0 = cpu_att_lo(r0, W), kb = r1 - k0;
        const float *Pb = P + (size_t)r0 * T + k0, *dob = dout + (size_t)r0 * C;
        /* dP = dO V^T ; dV += P^T dO */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, kb, hs, 1.0f, dob, C,
                    v + (size_t)k0 * ld, ld, 0.0f, S, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kb, hs, rb, 1.0f, Pb, T, dob, C, 1.0f,
                    dv + (size_t)k0 * ld, ld);
        cpu_att_dsoftmax(S, P, r0, r1, k0, T, W);
        /* dQ = scale dS K ; dK += scale dS^T Q */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, kb, scale, S, T,
                    k + (size_t)k0 * ld, ld, 0.0f, dq + (size_t)r0 * ld, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kb, hs, rb, scale, S, T,
                    q + (size_t)r0 * ld, ld, 1.0f, dk + (size_t)k0 * ld, ld);
    }
}

/* dqkv (B,T,3C) =, from dout (B,T,C), qkv (B,T,3C) and the state P. */
void cpu_attention_bwd(be_backend *be, void *dqkv, const void *dout, const void *out,
                       const void *qkv, const void *state, int B, int T, int C, int NH, int W) {
    cpu_ctx *cx = cpu_ctx_of(be);
    MS_CHECKF(NH > 0 && C % NH == 0, "attention: C=%d not divisible by NH=%d", C, NH);
    MS_CHECKF(T <= cx->att_T, "attention_bwd: T=%d exceeds reserved %d (call reserve)", T,
              cx->att_T);
    int hs = C / NH;
    float *dx = dqkv;
    const float *x = qkv, *dy = dout, *P = state;
#pragma omp parallel for schedule(static) num_threads(cx->threads)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t off = (size_t)b * T * 3 * C + (size_t)h * hs;
        float *S = cx->att + (size_t)omp_get_thread_num() * cx->att_stride;
        cpu_att_bwd_head(dx + off, dx + off + C, dx + off + 2 * C,
                         dy + (size_t)b * T * C + (size_t)h * hs, P + (size_t)bh * T * T, x + off,
                         x + off + C, x + off + 2 * C, S, T, hs, C, W);
    }
}
