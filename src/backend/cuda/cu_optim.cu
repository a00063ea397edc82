/* cu_optim.cu - optimiser updates on f32 master weights: AdamW and the two
 * phases of LAMB, with the formulas and operation order of cpu_optim.c (in
 * fp32; the bias corrections are computed on the host in double exactly as
 * the CPU does).
 *
 * Launch: AdamW and lamb_apply are element-wise, one thread per group of 4
 * elements (16-byte loads when every pointer is aligned), blocks of 256.
 * lamb_moments runs the reduction shape of cu_reduce.cu: a fixed grid of
 * cu_reduce_blocks(n) blocks in a grid-stride loop over groups of 4, double
 * accumulators per thread for sum w^2 and sum u^2, a fixed-tree block sum
 * into scratch partials, then cu_reduce_finish (one block, fixed order).
 * Deterministic: element-wise updates have no cross-element arithmetic; the
 * sums' order depends only on n and the device; no atomics.
 */
#include "cu_ops.cuh"

#define OPT_THREADS 256

/* Constants of one Adam step (as cpu_adam_k). */
struct adam_k {
    float b1, b2, a1, a2; /* betas and 1 - betas */
    float ibc1, ibc2;     /* 1 / (1 - beta^t) */
    float eps, gscale;
};

static adam_k adam_consts(float b1, float b2, float eps, int t, float gscale) {
    MS_CHECKF(t >= 1, "adam: step t must be >= 1, got %d", t);
    adam_k k = {b1, b2, 1.0f - b1, 1.0f - b2, 0.0f, 0.0f, eps, gscale};
    k.ibc1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    k.ibc2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
    return k;
}

/* Updates the moments m, v and returns mhat / (sqrt(vhat) + eps). */
__device__ static inline float adam_dir(const adam_k &k, float g, float &m, float &v) {
    float gs = g * k.gscale;
    float mi = k.b1 * m + k.a1 * gs;
    float vi = k.b2 * v + k.a2 * gs * gs;
    m = mi;
    v = vi;
    return (mi * k.ibc1) / (sqrtf(vi * k.ibc2) + k.eps);
}

/* Loads 4 f32 at x + 4*grp (one 16-byte load if vec, else the first cnt). */
__device__ static inline cu_f32x4 opt_ld4(const float *x, size_t grp, int cnt, int vec) {
    cu_f32x4 r;
    if (vec && cnt == 4) return ((const cu_f32x4 *)x)[grp];
    for (int j = 0; j < 4; j++)
        r.v[j] = j < cnt ? x[4 * grp + j] : 0.0f;
    return r;
}
__device__ static inline void opt_st4(float *x, size_t grp, int cnt, int vec, const cu_f32x4 &r) {
    if (vec && cnt == 4) {
        ((cu_f32x4 *)x)[grp] = r;
        return;
    }
    for (int j = 0; j < cnt; j++)
        x[4 * grp + j] = r.v[j];
}
__device__ static inline void opt_st4_bf(bf16 *x, size_t grp, int cnt, int vec, const cu_f32x4 &r) {
    if (vec && cnt == 4) {
        cu_bf16x4 o;
        for (int j = 0; j < 4; j++)
            o.v[j] = f2bf(r.v[j]);
        ((cu_bf16x4 *)x)[grp] = o;
        return;
    }
    for (int j = 0; j < cnt; j++)
        x[4 * grp + j] = f2bf(r.v[j]);
}

/* w, g, m, v (n) f32; wa (n) bf16 or NULL receives w; g = 0. */
__global__ void adamw_kernel(float *w, bf16 *wa, float *g, float *m, float *v, size_t n,
                             adam_k k, float lr, float decay, int vec) {
    size_t grp = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (grp * 4 >= n) return;
    int cnt = n - grp * 4 < 4 ? (int)(n - grp * 4) : 4;
    cu_f32x4 W = opt_ld4(w, grp, cnt, vec), G = opt_ld4(g, grp, cnt, vec);
    cu_f32x4 M = opt_ld4(m, grp, cnt, vec), V = opt_ld4(v, grp, cnt, vec);
    for (int j = 0; j < 4; j++)
        W.v[j] = W.v[j] * decay - lr * adam_dir(k, G.v[j], M.v[j], V.v[j]);
    opt_st4(w, grp, cnt, vec, W);
    opt_st4(m, grp, cnt, vec, M);
    opt_st4(v, grp, cnt, vec, V);
    opt_st4(g, grp, cnt, vec, cu_f32x4{});
    if (wa) opt_st4_bf(wa, grp, cnt, vec, W);
}

/* AdamW: m, v (n) updated; w = w*(1 - lr*wd) - lr*mhat/(sqrt(vhat)+eps);
 * g (n) = 0 (the update consumes it); w_act (n) bf16, if given, receives w. */
void cu_adamw_step(be_backend *be, float *w, void *w_act, float *g, float *m, float *v,
                   size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                   float gscale) {
    adam_k k = adam_consts(b1, b2, eps, t, gscale);
    if (n == 0) return;
    if (w_act == (void *)w) w_act = NULL; /* as the CPU: no separate act copy */
    float decay = 1.0f - lr * wd;
    int vec = cu_al16(w) && cu_al16(g) && cu_al16(m) && cu_al16(v) && ((uintptr_t)w_act & 7) == 0;
    MS_LAUNCH(adamw_kernel, cu_div_up(n, 4 * OPT_THREADS), OPT_THREADS, 0, cu_of(be)->stream, w,
              (bf16 *)w_act, g, m, v, n, k, lr, decay, vec);
    CU_CHECK_LAUNCH();
}

/* LAMB phase 1 over a fixed grid: u into g, partials of sum w^2 in part[0..G)
 * and of sum u^2 in part[G..2G). */
__global__ void lamb_moments_kernel(double *part, float *g, const float *w, float *m, float *v,
                                    size_t n, adam_k k, float wd, int vec) {
    __shared__ double buf[CU_RED_THREADS];
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, ngrp = (n + 3) / 4;
    double aw = 0.0, au = 0.0;
    for (size_t grp = tid; grp < ngrp; grp += stride) {
        int cnt = n - grp * 4 < 4 ? (int)(n - grp * 4) : 4;
        cu_f32x4 W = opt_ld4(w, grp, cnt, vec), G = opt_ld4(g, grp, cnt, vec);
        cu_f32x4 M = opt_ld4(m, grp, cnt, vec), V = opt_ld4(v, grp, cnt, vec);
        for (int j = 0; j < cnt; j++) {
            float u = adam_dir(k, G.v[j], M.v[j], V.v[j]) + wd * W.v[j];
            G.v[j] = u;
            aw += (double)W.v[j] * W.v[j];
            au += (double)u * u;
        }
        opt_st4(g, grp, cnt, vec, G);
        opt_st4(m, grp, cnt, vec, M);
        opt_st4(v, grp, cnt, vec, V);
    }
    double sw = cu_block_sum_d(aw, buf), su = cu_block_sum_d(au, buf);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = sw;
        part[gridDim.x + blockIdx.x] = su;
    }
}

/* LAMB phase 1: m, v (n) updated; g_to_u (n) = mhat/(sqrt(vhat)+eps) + wd*w
 * in place of the gradient; *w_sq = sum w^2, *u_sq = sum u^2 (doubles, read
 * back to the host: waits for the stream). */
void cu_lamb_moments(be_backend *be, float *g_to_u, const float *w, float *m, float *v, size_t n,
                     float b1, float b2, float eps, float wd, int t, float gscale, double *w_sq,
                     double *u_sq) {
    cu_ctx *cx = cu_of(be);
    adam_k k = adam_consts(b1, b2, eps, t, gscale);
    double r[2] = {0.0, 0.0};
    if (n > 0) {
        MS_CHECKF(cx->scratch_bytes >= CU_RED_SCRATCH_BYTES(2),
                  "lamb: scratch %zu bytes < %zu (call reserve)", cx->scratch_bytes,
                  CU_RED_SCRATCH_BYTES(2));
        int G = cu_reduce_blocks(be, n);
        int vec = cu_al16(g_to_u) && cu_al16(w) && cu_al16(m) && cu_al16(v);
        double *part = (double *)cx->scratch;
        MS_LAUNCH(lamb_moments_kernel, G, CU_RED_THREADS, 0, cx->stream, part, g_to_u, w, m, v, n,
                  k, wd, vec);
        CU_CHECK_LAUNCH();
        cu_reduce_finish(be, part, G, 2, r);
    }
    *w_sq = r[0];
    *u_sq = r[1];
}

/* w (n) -= step * u (n), u = 0; wa (n) bf16 or NULL receives w. */
__global__ void lamb_apply_kernel(float *w, bf16 *wa, float *u, size_t n, float step, int vec) {
    size_t grp = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (grp * 4 >= n) return;
    int cnt = n - grp * 4 < 4 ? (int)(n - grp * 4) : 4;
    cu_f32x4 W = opt_ld4(w, grp, cnt, vec), U = opt_ld4(u, grp, cnt, vec);
    for (int j = 0; j < 4; j++)
        W.v[j] = W.v[j] - step * U.v[j];
    opt_st4(w, grp, cnt, vec, W);
    opt_st4(u, grp, cnt, vec, cu_f32x4{});
    if (wa) opt_st4_bf(wa, grp, cnt, vec, W);
}

/* LAMB phase 2: w (n) -= step * u (n), u = 0; w_act (n) bf16, if given,
 * receives w. */
void cu_lamb_apply(be_backend *be, float *w, void *w_act, float *u, size_t n, float step) {
    if (n == 0) return;
    if (w_act == (void *)w) w_act = NULL;
    int vec = cu_al16(w) && cu_al16(u) && ((uintptr_t)w_act & 7) == 0;
    MS_LAUNCH(lamb_apply_kernel, cu_div_up(n, 4 * OPT_THREADS), OPT_THREADS, 0, cu_of(be)->stream,
              w, (bf16 *)w_act, u, n, step, vec);
    CU_CHECK_LAUNCH();
}

size_t cu_optim_scratch_bytes(const be_limits *lim) {
    (void)lim;
    return CU_RED_SCRATCH_BYTES(2);
}
