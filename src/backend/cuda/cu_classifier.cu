/* cu_classifier.cu - the fused tied classifier + softmax cross-entropy and
 * its gradient, whole-vocabulary and vocabulary-parallel.
 *
 * Per chunk of R rows (R bounded so the bf16 logits chunk stays within
 * CU_CLS_CHUNK_BYTES):
 *   logits (R,Vp) bf16 = x @ wte^T                      (cuBLASLt)
 *   one pass per row (one block per row): online max / sum of exp in fp32
 *   over the first V columns, the loss, and the gradient written over the
 *   logits in place: dloss * (softmax - onehot), 0 on the padded columns
 *   dx (R,C) = dlogits @ wte, dwte (Vp,C) f32 += dlogits^T @ x  (cuBLASLt)
 * The logits are read twice (stats, then gradient) and never leave the
 * chunk; no probabilities are stored.  Each row is reduced by a fixed tree
 * (per-thread strided loop, then cu_block_* in warp order), so results are
 * bitwise reproducible.
 */
#include "cu_internal.h"

#define CU_CLS_THREADS 512
#define CU_CLS_CHUNK_BYTES ((size_t)512 << 20)

/* Rows per chunk for a padded vocabulary Vp and at most N rows. */
static int cls_chunk_rows(int Vp, size_t N) {
    size_t r = CU_CLS_CHUNK_BYTES / ((size_t)Vp * sizeof(bf16));
    if (r > 256) r = r / 64 * 64;
    if (r < 1) r = 1;
    return (int)(r < N ? r : N);
}

size_t cu_classifier_scratch_bytes(const be_limits *lim) {
    if (lim->Vp <= 0) return 0;
    size_t N = (size_t)lim->B * lim->T;
    return (size_t)cls_chunk_rows(lim->Vp, N ? N : 1) * lim->Vp * sizeof(bf16);
}

/* Online (max, sum of exp) of one thread's strided share of l[0..n). */
__device__ static inline void row_online(const bf16 *l, int n, float *mo, float *so) {
    float m = -FLT_MAX, s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float v = bf2f(l[j]);
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    *mo = m;
    *so = s;
}

/* Block-wide (max, sum) from every thread's online pair. */
__device__ static inline void row_combine(float m, float s, float *buf, float *M, float *S) {
    float bm = cu_block_max(m, buf);
    /* a NaN logit made this thread's sum NaN: kept (s > 0 is false for
     * NaN, which dropped it and the thread's other logits: a finite loss
     * where the CPU gives NaN) */
    float t = isnan(s) ? s : s > 0.0f ? s * expf(m - bm) : 0.0f;
    *S = cu_block_sum(t, buf);
    *M = bm;
}

/* One block per row r of logits (R,Vp): losses[r] and, if grad, dlogits in
 * place. */
__global__ void cls_xent_kernel(float *losses, bf16 *logits, const int32_t *targets, int V, int Vp,
                                float dloss, int grad) {
    __shared__ float buf[32];
    int r = blockIdx.x;
    bf16 *l = logits + (size_t)r * Vp;
    int tg = targets[r];
    float m, s, M, S;
    row_online(l, V, &m, &s);
    row_combine(m, s, buf, &M, &S);
    float lse = M + logf(S);
    /* a target outside [0, V) (the loader refuses such tokens; the CPU
     * aborts): a NaN loss and no one-hot term, never a read past the row */
    bool bad = (unsigned)tg >= (unsigned)V;
    if (threadIdx.x == 0) losses[r] = bad ? __int_as_float(0x7fc00000) : lse - bf2f(l[tg]);
    if (bad) tg = -1;
    if (!grad) return;
    __syncthreads(); /* every thread has read l[tg] before it is overwritten */
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        float p = j < V ? expf(bf2f(l[j]) - lse) : 0.0f;
        l[j] = f2bf(dloss * (p - (j == tg ? 1.0f : 0.0f)));
    }
}

void cu_classifier_fwd_bwd(be_backend *be, float *losses, void *dx, float *dwte, const void *x,
                           const void *wte, const int32_t *targets, int N, int C, int V, int Vp,
                           float dloss) {
    cu_ctx *c = cu_of(be);
    int R = cls_chunk_rows(Vp, (size_t)N);
    MS_CHECKF((size_t)R * Vp * sizeof(bf16) <= c->scratch_bytes,
              "classifier: scratch %zu B too small for %d rows of %d (call reserve)",
              c->scratch_bytes, R, Vp);
    bf16 *logits = (bf16 *)c->scratch;
    const bf16 *xb = (const bf16 *)x;
    for (int r0 = 0; r0 < N; r0 += R) {
        int rows = N - r0 < R ? N - r0 : R;
        const bf16 *xr = xb + (size_t)r0 * C;
        cu_gemm(be, 0, 1, rows, Vp, C, 1.0f, xr, C, wte, C, 0.0f, logits, Vp, 0, NULL,
                BE_EPI_NONE, NULL);
        MS_LAUNCH(cls_xent_kernel, rows, CU_CLS_THREADS, 0, c->stream, losses + r0, logits,
                  targets + r0, V, Vp, dloss, dx != NULL);
        CU_CHECK_LAUNCH();
        if (!dx) continue;
        cu_gemm(be, 0, 0, rows, C, Vp, 1.0f, logits, Vp, wte, C, 0.0f,
                (bf16 *)dx + (size_t)r0 * C, C, 0, NULL, BE_EPI_NONE, NULL);
        cu_gemm(be, 1, 0, Vp, C, rows, 1.0f, logits, Vp, xr, C, 1.0f, dwte, C, 1, NULL,
                BE_EPI_NONE, NULL);
    }
}

/* stats (R,3) of one vocabulary slice: max, sum of exp(l - max), target
 * logit (0 if the target is not in the slice). */
__global__ void cls_slice_stats_kernel(float *stats, const bf16 *logits, const int32_t *targets,
                                       int Vs, int v0) {
    __shared__ float buf[32];
    int r = blockIdx.x;
    const bf16 *l = logits + (size_t)r * Vs;
    float m, s, M, S;
    row_online(l, Vs, &m, &s);
    row_combine(m, s, buf, &M, &S);
    if (threadIdx.x == 0) {
        int tg = targets[r] - v0;
        stats[(size_t)r * 3] = M;
        stats[(size_t)r * 3 + 1] = S;
        stats[(size_t)r * 3 + 2] = tg >= 0 && tg < Vs ? bf2f(l[tg]) : 0.0f;
    }
}

__global__ void cls_slice_empty_kernel(float *stats, int R) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < R) {
        stats[(size_t)r * 3] = -FLT_MAX;
        stats[(size_t)r * 3 + 1] = 0.0f;
        stats[(size_t)r * 3 + 2] = 0.0f;
    }
}

void cu_classifier_slice_stats(be_backend *be, float *stats, void *logits, const void *x,
                               const void *wte, const int32_t *targets, int R, int C, int Vs,
                               int v0) {
    cu_ctx *c = cu_of(be);
    MS_CHECKF(R >= 0 && Vs >= 0 && v0 >= 0, "classifier slice: bad R=%d Vs=%d v0=%d", R, Vs, v0);
    if (R == 0) return;
    if (Vs == 0) {
        MS_LAUNCH(cls_slice_empty_kernel, cu_div_up(R, 256), 256, 0, c->stream, stats, R);
        CU_CHECK_LAUNCH();
        return;
    }
    cu_gemm(be, 0, 1, R, Vs, C, 1.0f, x, C, wte, C, 0.0f, logits, Vs, 0, NULL, BE_EPI_NONE, NULL);
    MS_LAUNCH(cls_slice_stats_kernel, R, CU_CLS_THREADS, 0, c->stream, stats,
              (const bf16 *)logits, targets, Vs, v0);
    CU_CHECK_LAUNCH();
}

/* Row r: the global log-sum-exp from stats (P,R,3) in slice order (as the
 * CPU: max first, then sum of s_p * exp(m_p - M) in double), the loss, and
 * the gradient over this slice's logits in place. */
__global__ void cls_slice_finish_kernel(float *losses, bf16 *logits, const int32_t *targets,
                                        const float *stats, int P, int R, int Vs, int v0,
                                        float dloss, int grad) {
    int r = blockIdx.x;
    float M = -FLT_MAX;
    for (int p = 0; p < P; p++)
        M = fmaxf(M, stats[((size_t)p * R + r) * 3]);
    double S = 0.0, lt = 0.0;
    int nan = 0; /* a NaN logit makes the row's sum NaN, as the CPU (not a skipped slice) */
    for (int p = 0; p < P; p++) {
        const float *st = stats + ((size_t)p * R + r) * 3;
        nan |= isnan(st[1]);
        if (st[1] > 0.0f) S += (double)st[1] * exp((double)st[0] - (double)M);
        lt += (double)st[2];
    }
    if (nan) S = (double)__int_as_float(0x7fc00000);
    double lse = (double)M + log(S);
    if (threadIdx.x == 0) losses[r] = (float)(lse - lt);
    if (!grad || Vs == 0) return;
    bf16 *l = logits + (size_t)r * Vs;
    float lsef = (float)lse;
    int tg = targets[r] - v0;
    for (int j = threadIdx.x; j < Vs; j += blockDim.x) {
        float p = expf(bf2f(l[j]) - lsef);
        l[j] = f2bf(dloss * (p - (j == tg ? 1.0f : 0.0f)));
    }
}

void cu_classifier_slice_finish(be_backend *be, float *losses, void *dx, float *dwte,
                                void *logits, const void *x, const void *wte,
                                const int32_t *targets, const float *stats, int P, int R, int C,
                                int Vs, int v0, float dloss) {
    cu_ctx *c = cu_of(be);
    MS_CHECKF(P >= 1 && R >= 0 && Vs >= 0, "classifier slice: bad P=%d R=%d Vs=%d", P, R, Vs);
    if (R == 0) return;
    MS_LAUNCH(cls_slice_finish_kernel, R, CU_CLS_THREADS, 0, c->stream, losses, (bf16 *)logits,
              targets, stats, P, R, Vs, v0, dloss, dx != NULL);
    CU_CHECK_LAUNCH();
    if (!dx) return;
    if (Vs == 0) { /* this slice contributes nothing to dx */
        CU_CHECK(cudaMemsetAsync(dx, 0, (size_t)R * C * sizeof(bf16), c->stream));
        return;
    }
    cu_gemm(be, 0, 0, R, C, Vs, 1.0f, logits, Vs, wte, C, 0.0f, dx, C, 0, NULL, BE_EPI_NONE,
            NULL);
    cu_gemm(be, 1, 0, Vs, C, R, 1.0f, logits, Vs, x, C, 1.0f, dwte, C, 1, NULL, BE_EPI_NONE,
            NULL);
}
