/* cpu_internal.h - private to the CPU backend (the src/backend/cpu files): the
 * backend context, the scratch it owns, small vectorisable math helpers and
 * the op entry points each cpu_*.c file contributes to the table.
 *
 * `void *` act arguments are `float *` (act dtype fp32, the default) or
 * bf16 halves (`uint16_t *`) in the bf16 mode (be_cpu_create_dtype,
 * cpu_bf16.c, whose ops are the cpu16_* entry points).
 * Scratch is sized by cpu_reserve() only; ops check that it is big enough.
 * Parallel loops use OpenMP with schedule(static) and the backend's thread
 * count, so the partition of work (and every reduction order) depends only
 * on the inputs and the thread count.
 */
#ifndef BE_CPU_INTERNAL_H
#define BE_CPU_INTERNAL_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"

/* Attention processes query rows in blocks of this many rows, so a block
 * only touches the keys its window can see. */
#define CPU_ATT_BLOCK 64
/* Most floats of one classifier logits chunk: 256 MB, ~1300 rows of GPT-2's
 * vocabulary (1024 in two equal chunks of a 2048-token batch).  On 2 AVX2
 * cores OpenBLAS runs the three chunk GEMMs (K = 384) at 122 / 123 / 114
 * GFLOP/s with 1024 rows, 102 / 115 / 116 with 293 (64 MB), 87 / 96 / 93
 * with 128; the d6 step was 6-16% faster with 256 MB than with 64 MB
 * (docs/perf.md). */
#define CPU_CLS_CHUNK_FLOATS ((size_t)64 << 20)
/* Floats per cache line; per-thread slices are padded to this. */
#define CPU_LINE_FLOATS 16

#define CPU_EV_POOL 1024 /* device timer handles (be->ev_record) */

/* The own fp32 GEMM (cpu_sgemm.c, with the microkernels of
 * cpu_sgemm_avx512.c and cpu_sgemm_avx2.c): built on x86-64 with GCC or
 * Clang, run where the CPU has AVX2 and FMA (be_cpu_gemm_runs).  Blocks:
 * KC rows of op(B) a panel (fixed: the order of every sum depends on it and
 * on K only); with more rows than MC (MT when op(A) is transposed) the
 * threads pack NC columns of op(B) at a time and take MC rows of op(A) a
 * block (docs/perf.md measures the choices). */
#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_SGEMM_OWN 1
#else
#define CPU_SGEMM_OWN 0
#endif
#define CPU_SGEMM_MR_MAX 8  /* the most rows of op(A) in a kernel's tile */
#define CPU_SGEMM_NR_MAX 48 /* the most columns of op(B) in it: a panel's width */
#define CPU_SGEMM_KC 384
#define CPU_SGEMM_NC 3072
#define CPU_SGEMM_MC 512
#define CPU_SGEMM_MT 1024
/* Where a panel and a strip fit L1 together, few_rows packs a block of panels at once whose
 * rows of op(B) span at least this many bytes: 6 cache lines, so that the weights' rows
 * come from memory in runs the prefetcher follows (AVX2's 24-column panels read 1.5 lines a
 * row, one panel at a time; docs/perf.md) */
#define CPU_SGEMM_ROW_BYTES 384
/* Most floats of op(A) read in place for few_rows to take each panel
 * through all of K: 256 K floats, 1 MB, which holds GPT-2 124M's 256 tokens
 * x 768 (the classifier's logits) */
#define CPU_SGEMM_A_CACHED ((size_t)256 * 1024)
/* per-thread floats of packed op(A): a block of MC rows and one more strip */
#define CPU_SGEMM_A_FLOATS ((size_t)(CPU_SGEMM_MC + CPU_SGEMM_MR_MAX) * CPU_SGEMM_KC)

/* A microkernel for one vector width: an mr x nr tile of C from a panel bp
 * of op(B) ([k][nr], 32-byte aligned) and mr rows of op(A), over kc steps
 * of k, stored as cpu_sgemm.c's "Bits" says (first: the k-block starting
 * at 0).  rows: A row-major in place (row stride lda), all mr rows; packed:
 * A packed [k][mr], m <= mr valid rows; both store n <= nr columns.
 * pack_b fills np whole panels (nr columns each from j0, one after the
 * other, nr*kb floats apart) from rows [k0, k0+kb) of op(B) and returns how
 * many rows of each it packed (the driver packs the rest, and panels of
 * fewer columns, itself). */
typedef struct {
    int kind; /* BE_CPU_GEMM_AVX512, BE_CPU_GEMM_AVX2 */
    int mr, nr;
    void (*rows)(int kc, const float *a, long lda, const float *bp, float *C, long ldc, int n,
                 float alpha, float beta, int first);
    void (*packed)(int kc, const float *ap, const float *bp, float *C, long ldc, int m, int n,
                   float alpha, float beta, int first);
    int (*pack_b)(float *bp, const float *B, long ldb, int tb, int j0, int np, int k0, int kb);
} cpu_sgemm_kern;
#if CPU_SGEMM_OWN
extern const cpu_sgemm_kern cpu_sgemm_kern_avx512, cpu_sgemm_kern_avx2;
#endif

typedef struct {
    int threads; /* the most threads the buffers serve */
    float *b;    /* op(B): NC columns of panels (shared), or a block a thread */
    float *at;   /* op(A) transposed, up to MT rows packed once, shared */
    float *a;    /* per thread: threads x A_FLOATS */
    /* the core's caches (cpu_sgemm.c's loop order and blocks): the bytes
     * of its L1 data cache, and the floats of packed op(B) a thread keeps
     * in its L2 (half of it) */
    size_t l1_bytes, b_block;
    size_t l1_sys, b_block_max; /* the machine's, and the most b holds */
} cpu_sgemm_scratch;

/* oneDNN's matmul for the bf16 mode (cpu_dnnl.c) */
typedef struct cpu_dnnl cpu_dnnl;

typedef struct {
    int threads;
    /* per-thread partial sums: threads * part_stride floats (layernorm dw/db) */
    float *part;
    size_t part_stride; /* floats per thread, a multiple of CPU_LINE_FLOATS */
    int part_C;         /* largest C the partials hold */
    /* per-thread doubles for the host-side reductions: threads * 16 */
    double *dpart;
    /* attention dS scratch: threads * att_stride floats (CPU_ATT_BLOCK x T) */
    float *att;
    size_t att_stride;
    int att_T;
    /* classifier logits chunk */
    float *cls;
    size_t cls_floats;
    int cls_max_rows; /* test hook: cap on rows per chunk (0 = none) */
    /* the bf16 mode (act dtype bf16; all NULL / 0 in the fp32 mode) */
    cpu_dnnl *dnnl;
    float *x[3]; /* fp32 copies of act tensors: x_floats each (B*T*4C) */
    size_t x_floats;
    float *wb; /* a layer norm's weight and bias in fp32: 2 * wb_C */
    size_t wb_have;
    int wb_C;
    uint16_t *cls16; /* dlogits of a classifier chunk in bf16: cls_floats */
    size_t cls16_n;
    void *profile; /* cpu_profile.c's state with --cpu-profile, else NULL */
    /* fp32 GEMMs: an own kernel (cpu_sgemm.c, scratch sg), NULL on OpenBLAS */
    const cpu_sgemm_kern *gemm_kern;
    cpu_sgemm_scratch sg;
    /* memory accounting (cpu_mem_peak): the live be->alloc blocks, their bytes
     * plus the op scratch above (part, att, cls and the bf16 mode's), the most
     * held at once */
    struct cpu_block {
        void *p;
        size_t n;
    } * blocks;
    int n_blocks, cap_blocks;
    size_t bytes, peak, scratch_bytes;
    /* device timers: ops run synchronously, so a timestamp is the host clock */
    int64_t ev_t[CPU_EV_POOL];
    int ev_free[CPU_EV_POOL], ev_nfree;
} cpu_ctx;

static inline cpu_ctx *cpu_ctx_of(be_backend *be) {
    return (cpu_ctx *)be->ctx;
}

/* The half-open slice [*lo, *hi) of n items that thread tid of nthr owns. */
static inline void cpu_split(size_t n, int nthr, int tid, size_t *lo, size_t *hi) {
    *lo = n * (size_t)tid / (size_t)nthr;
    *hi = n * (size_t)(tid + 1) / (size_t)nthr;
}

/* exp(x) for x in [-87, 88], ~1 ulp (Cephes polynomial), written with
 * plain arithmetic so loops that call it vectorise; with nan_guard a NaN x
 * gives NaN (without, x must not be NaN: its conversion to int is then
 * undefined).  cpu_expf's core; GeLU calls it directly, its argument
 * already clamped, and loses the clamps' selects (a third of its time). */
static inline float cpu_expf_in(float x, int nan_guard) {
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* a NaN stays NaN (in p), but never reaches the int conversion */
    if (nan_guard) n = n == n ? n : 0.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* expf for x in any range: clamped to [-87, 88] (exp(-87) ~ 1.6e-38 stands
 * in for smaller results); NaN gives NaN. */
static inline float cpu_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    return cpu_expf_in(x, 1);
}

/* Sum of x[0..n) with 16 fixed lanes (vectorises; order fixed by n). */
static inline float cpu_sum_f(const float *restrict x, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += x[i + j];
    float s = 0.0f;
    for (int j = 0; j < 16; j++)
        s += acc[j];
    for (; i < n; i++)
        s += x[i];
    return s;
}

/* Maximum of x[0..n), n >= 1.  omp simd: without it GCC 12 kept the 16
 * lanes scalar (16 vmaxss a block of 16), and the classifier's rows spent
 * 30% of their time here. */
static inline float cpu_max_f(const float *restrict x, int n) {
    float acc[16];
    for (int j = 0; j < 16; j++)
        acc[j] = x[0];
    int i = 0;
    for (; i + 16 <= n; i += 16)
#pragma omp simd
        for (int j = 0; j < 16; j++)
            acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    float m = acc[0];
    for (int j = 1; j < 16; j++)
        m = acc[j] > m ? acc[j] : m;
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* GeLU (tanh approximation) and its derivative, via
 * 0.5*(1+tanh(u)) = 1/(1+exp(-2u)), u = sqrt(2/pi)*(x+0.044715x^3). */
#define CPU_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define CPU_GELU_A 0.044715f

static inline float cpu_gelu_2u(float x) {
    return 2.0f * CPU_GELU_K * (x + CPU_GELU_A * x * x * x);
}

/* 2u clamped to [-80, 80] for exp (beyond, 1/(1+exp(-2u)) is 0 or 1 in
 * fp32); a NaN becomes -80, so that exp's argument is never NaN. */
static inline float cpu_gelu_clamp(float u2) {
    u2 = u2 > -80.0f ? u2 : -80.0f;
    return u2 < 80.0f ? u2 : 80.0f;
}

/* Past the clamp the limits themselves: gelu = x * 0 below (exp(80) alone
 * left x * 1.8e-35, -18 for x = -1e36) and x above; x * 0 carries a NaN. */
static inline float cpu_gelu(float x) {
    float u2 = cpu_gelu_2u(x), g = x / (1.0f + cpu_expf_in(-cpu_gelu_clamp(u2), 0));
    return u2 >= -80.0f ? g : x * 0.0f;
}

/* The derivative; past the clamp 0 below and 1 above (its x^2 term grew
 * against the clamped exp: -3.86 for x = -1e12, 4.86 for +1e12). */
static inline float cpu_gelu_grad(float x) {
    float u2 = cpu_gelu_2u(x);
    float e = cpu_expf_in(-cpu_gelu_clamp(u2), 0);
    float s = 1.0f / (1.0f + e); /* 0.5*(1+tanh u) */
    float du = CPU_GELU_K * (1.0f + 3.0f * CPU_GELU_A * x * x);
    /* 0.5*x*(1-tanh^2 u)*du = 2*x*s*(1-s)*du, with 1-s = e*s */
    float d = s + 2.0f * x * s * (e * s) * du;
    d = u2 <= 80.0f ? d : 1.0f;
    return u2 >= -80.0f ? d : x * 0.0f; /* a NaN: both tests fail, x * 0 is NaN */
}

/* Make sure OpenBLAS (OpenMP flavour) uses the backend's thread count in
 * calls made from outside our parallel regions. */
void cpu_blas_threads(const cpu_ctx *c);

/* The fp32 GEMM every op but attention's small products calls, with
 * cblas_sgemm's row-major arguments: the own kernel when c->gemm_own, else
 * OpenBLAS.  C (M,N) = alpha op(A) op(B) + beta C; C is not read when beta
 * is 0. */
void cpu_sgemm(cpu_ctx *c, int ta, int tb, int M, int N, int K, float alpha, const float *A,
               int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* cpu_sgemm.c: the own kernel (CPU_SGEMM_OWN builds only); s sized for at
 * least `threads` threads (cpu_sgemm_scratch_init). */
void cpu_sgemm_own(const cpu_sgemm_kern *kn, cpu_sgemm_scratch *s, int threads, int ta, int tb,
                   int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc);
ms_status cpu_sgemm_scratch_init(cpu_sgemm_scratch *s, int threads);
void cpu_sgemm_scratch_free(cpu_sgemm_scratch *s);

/* Test hook: cap the rows of one classifier chunk (0 = no cap), so tests
 * can run several chunks on small shapes. */
void cpu_set_cls_chunk_rows(be_backend *be, int rows);
/* Test hook: the L1 data cache (bytes) and the floats of packed op(B) a
 * thread keeps in L2 that the own GEMM plans its loops for (0: the
 * machine's; the block is kept within one panel and what was allocated),
 * so that tests run both loop orders on any CPU.  The bits do not change. */
void cpu_set_sgemm_caches(be_backend *be, size_t l1_bytes, size_t block_floats);

/* ---- op entry points, one group per file ---- */

/* cpu_embedding.c */
void cpu_embedding_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                       const void *wpe, int B, int T, int C);
void cpu_embedding_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                       const int32_t *tok, int B, int T, int C);
void cpu_embedding_slice_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                             const void *wpe, int B, int T, int C, int v0, int Vs);
void cpu_embedding_slice_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                             const int32_t *tok, int B, int T, int C, int v0, int Vs);

/* cpu_norm.c */
void cpu_layernorm_fwd(be_backend *be, void *out, float *mean, float *rstd, const void *inp,
                       const void *w, const void *b, int N, int C);
void cpu_layernorm_bwd(be_backend *be, void *dinp, float *dw, float *db, const void *dout,
                       const void *inp, const void *w, const float *mean, const float *rstd, int N,
                       int C);

/* cpu_gemm.c */
void cpu_gemm(be_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
              int lda, const void *Bm, int ldb, float beta, void *C, int ldc, int c_f32,
              const void *bias, be_epilogue epi, void *pre);
void cpu_bias_bwd(be_backend *be, float *dbias, const void *dout, int M, int N);

/* cpu_attention.c */
size_t cpu_attention_state_bytes(be_backend *be, int B, int T, int NH);
void cpu_attention_fwd(be_backend *be, void *out, void *state, const void *qkv, int B, int T, int C,
                       int NH, int W);
void cpu_attention_bwd(be_backend *be, void *dqkv, const void *dout, const void *out,
                       const void *qkv, const void *state, int B, int T, int C, int NH, int W);

/* cpu_elementwise.c */
void cpu_gelu_fwd(be_backend *be, void *out, const void *inp, size_t n);
void cpu_gelu_bwd(be_backend *be, void *dinp, const void *inp, const void *dout, size_t n);
void cpu_residual_add(be_backend *be, void *out, const void *a, const void *b, size_t n);
void cpu_bias_add(be_backend *be, void *out, const void *bias, int M, int N);
void cpu_add_f32(be_backend *be, float *y, const float *x, size_t n);

/* cpu_classifier.c; cpu_cls_row: one row of logits in place, its loss;
 * cpu_cls_rows: the rows of each of the equal chunks N rows of V logits
 * are split into (the scratch's capacity, the test hook's cap) */
float cpu_cls_row(float *restrict l, int V, int tgt, int grad, float dloss, const float *next);
size_t cpu_cls_rows(const cpu_ctx *cx, int N, int V);
void cpu_classifier_fwd_bwd(be_backend *be, float *losses, void *dx, float *dwte, const void *x,
                            const void *wte, const int32_t *targets, int N, int C, int V, int Vp,
                            float dloss);

/* cpu_classifier_slice.c; of phase 2, for row i of stats (P,R,3): the
 * global max (*mx) and sum of exp(logit - max) over all slices, combined
 * in slice order, and the loss lse - the target's logit */
double cpu_cls_row_sum_exp(const float *stats, int P, int R, int i, float *mx);
float cpu_cls_slice_loss(const float *stats, int P, int R, int i, float M, double S);
void cpu_classifier_slice_stats(be_backend *be, float *stats, void *logits, const void *x,
                                const void *wte, const int32_t *targets, int R, int C, int Vs,
                                int v0);
void cpu_classifier_slice_finish(be_backend *be, float *losses, void *dx, float *dwte, void *logits,
                                 const void *x, const void *wte, const int32_t *targets,
                                 const float *stats, int P, int R, int C, int Vs, int v0,
                                 float dloss);

/* cpu_optim.c */
void cpu_adamw_step(be_backend *be, float *w, void *w_act, float *g, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, float wd, int t, float gscale);
void cpu_lamb_moments(be_backend *be, float *g_to_u, const float *w, float *m, float *v, size_t n,
                      float b1, float b2, float eps, float wd, int t, float gscale, double *w_sq,
                      double *u_sq);
void cpu_lamb_apply(be_backend *be, float *w, void *w_act, float *u, size_t n, float step);

/* cpu_dnnl.c: C (M,N) = alpha op(A) op(B) + beta C [+ bias (N)], A, B
 * and bias bf16 (row-major, strides as cblas), C bf16 or f32 (c_f32) */
ms_status cpu_dnnl_create(cpu_dnnl **out);
void cpu_dnnl_free(cpu_dnnl *d);
void cpu_dnnl_gemm(cpu_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                   int lda, const uint16_t *B, int ldb, float beta, void *C, int ldc, int c_f32,
                   const uint16_t *bias);
/* NULL when this build has oneDNN, else why the bf16 mode is missing */
const char *cpu_dnnl_available(void);

/* cpu_bf16.c: the bf16 mode's ops (same contracts as the fp32 ones) */
void cpu16_to_act(be_backend *be, void *dst, const float *src, size_t n);
void cpu16_embedding_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                         const void *wpe, int B, int T, int C);
void cpu16_embedding_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                         const int32_t *tok, int B, int T, int C);
void cpu16_embedding_slice_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                               const void *wpe, int B, int T, int C, int v0, int Vs);
void cpu16_embedding_slice_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                               const int32_t *tok, int B, int T, int C, int v0, int Vs);
void cpu16_layernorm_fwd(be_backend *be, void *out, float *mean, float *rstd, const void *inp,
                         const void *w, const void *b, int N, int C);
void cpu16_layernorm_bwd(be_backend *be, void *dinp, float *dw, float *db, const void *dout,
                         const void *inp, const void *w, const float *mean, const float *rstd,
                         int N, int C);
void cpu16_gemm(be_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                int lda, const void *Bm, int ldb, float beta, void *C, int ldc, int c_f32,
                const void *bias, be_epilogue epi, void *pre);
void cpu16_bias_bwd(be_backend *be, float *dbias, const void *dout, int M, int N);
void cpu16_attention_fwd(be_backend *be, void *out, void *state, const void *qkv, int B, int T,
                         int C, int NH, int W);
void cpu16_attention_bwd(be_backend *be, void *dqkv, const void *dout, const void *out,
                         const void *qkv, const void *state, int B, int T, int C, int NH, int W);
void cpu16_gelu_fwd(be_backend *be, void *out, const void *inp, size_t n);
void cpu16_gelu_bwd(be_backend *be, void *dinp, const void *inp, const void *dout, size_t n);
void cpu16_residual_add(be_backend *be, void *out, const void *a, const void *b, size_t n);
void cpu16_bias_add(be_backend *be, void *out, const void *bias, int M, int N);
void cpu16_classifier_fwd_bwd(be_backend *be, float *losses, void *dx, float *dwte, const void *x,
                              const void *wte, const int32_t *targets, int N, int C, int V, int Vp,
                              float dloss);
void cpu16_classifier_slice_stats(be_backend *be, float *stats, void *logits, const void *x,
                                  const void *wte, const int32_t *targets, int R, int C, int Vs,
                                  int v0);
void cpu16_classifier_slice_finish(be_backend *be, float *losses, void *dx, float *dwte,
                                   void *logits, const void *x, const void *wte,
                                   const int32_t *targets, const float *stats, int P, int R, int C,
                                   int Vs, int v0, float dloss);

/* cpu_profile.c: per-op host times (be_options.cpu_profile) */
ms_status cpu_profile_install(be_backend *be);
void cpu_profile_report(be_backend *be);
void cpu_profile_free(be_backend *be);

/* cpu_reduce.c */
double cpu_sum_squares(be_backend *be, const float *x, size_t n);
double cpu_sum(be_backend *be, const float *x, size_t n);
int cpu_has_nonfinite(be_backend *be, const float *x, size_t n);

#endif
