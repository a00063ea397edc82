/* cu_internal.h - the CUDA backend's private context and the op functions
 * each source file provides (they have the exact signatures of the
 * be_backend table in backend/backend.h and are assigned in cu_backend.cu).
 *
 * Every op enqueues work on ctx->stream and returns without waiting, except
 * those that return a value on the host (sum, sum_squares, has_nonfinite,
 * lamb_moments) and to_host, which wait for the stream.
 * Scratch: ops never allocate; each module reports the scratch it needs for
 * given limits (cu_*_scratch_bytes) and be->reserve sizes ctx->scratch to the
 * largest.  Only one op runs at a time (one stream), so they share it.
 */
#ifndef CU_INTERNAL_H
#define CU_INTERNAL_H

/* The kernels' limits on a model (be_backend.max_head_size, max_dim). */
#define CU_MAX_HEAD_SIZE 128 /* the attention's tiles (cu_attention.cu) */
#define CU_MAX_DIM 16384     /* the LayerNorm's dw/db in shared memory: 8C bytes (cu_norm.cu) */

#include "cu_common.cuh"

#include <cublasLt.h>

extern "C" {
#include "backend/backend.h"
}

/* ---- cu_lt.cu: cuBLASLt, loaded when the first backend is created ---- */

/* The cuBLASLt functions the backend calls, as cu_lt.NAME for cublasLtNAME. */
#define CU_LT_FUNCTIONS(X)                                                                         \
    X(Create)                                                                                      \
    X(Destroy)                                                                                     \
    X(GetVersion)                                                                                  \
    X(GetStatusString)                                                                             \
    X(MatmulDescCreate)                                                                            \
    X(MatmulDescDestroy)                                                                           \
    X(MatmulDescSetAttribute)                                                                      \
    X(MatrixLayoutCreate)                                                                          \
    X(MatrixLayoutDestroy)                                                                         \
    X(MatmulPreferenceCreate)                                                                      \
    X(MatmulPreferenceDestroy)                                                                     \
    X(MatmulPreferenceSetAttribute)                                                                \
    X(MatmulAlgoGetHeuristic)                                                                      \
    X(Matmul)

typedef struct {
#define CU_LT_MEMBER(name) decltype(&cublasLt##name) name;
    CU_LT_FUNCTIONS(CU_LT_MEMBER)
#undef CU_LT_MEMBER
} cu_lt_api;

extern cu_lt_api cu_lt; /* valid once cu_lt_load returned MS_OK */

/* Load cuBLASLt (once per process; later calls return the first's result).
 * MS_ERR_NOTFOUND, saying what to install, where it is missing. */
ms_status cu_lt_load(void);

typedef struct cu_ctx {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws; /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    void *scratch; /* shared op scratch (see above) */
    size_t scratch_bytes;
    double *host; /* pinned host doubles for results read back */
    int sm_count;
    void *gemm_cache; /* cu_gemm.cu's descriptor/algorithm cache */
    void *profile;    /* cu_profile.cu's state with be_options.cuda_profile, else NULL */
    void *events;     /* cu_events.cu's timer pool */
    int fuse_gelu;    /* GeLU as cuBLASLt's GELU_AUX epilogue (1) or our kernel after a
                         bias-epilogue GEMM (0): be_options.cuda_fuse_gelu */
    be_limits lim;    /* largest limits reserved so far */
} cu_ctx;

static inline cu_ctx *cu_of(be_backend *be) {
    return (cu_ctx *)be->ctx;
}

/* The GEMM of the table (cu_gemm.cu), and the typed form the classifier
 * uses: A, B in bf16, C in bf16 or f32 (c_f32), row-major as in backend.h. */
void cu_gemm(be_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
             int lda, const void *Bm, int ldb, float beta, void *C, int ldc, int c_f32,
             const void *bias, be_epilogue epi, void *pre);

void cu_gemm_cache_free(cu_ctx *c);

/* ---- cu_profile.cu: per-op device times (be_options.cuda_profile) ---- */
ms_status cu_profile_install(be_backend *be);
void cu_profile_report(be_backend *be); /* at exit: the table, largest first */
void cu_profile_free(be_backend *be);

/* ---- cu_events.cu: the device timer pool (be->ev_record / ev_poll / ev_anchor) ---- */
ms_status cu_events_init(be_backend *be); /* the stream exists and is idle */
void cu_events_free(be_backend *be);
int cu_ev_record(be_backend *be);
int cu_ev_poll(be_backend *be, int h, int64_t *t_ns);
void cu_ev_anchor(be_backend *be);

/* ---- cu_cast.cu ---- */
void cu_to_act(be_backend *be, void *dst, const float *src, size_t n);

/* ---- cu_embedding.cu ---- */
void cu_embedding_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                      const void *wpe, int B, int T, int C);
void cu_embedding_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                      const int32_t *tok, int B, int T, int C);
void cu_embedding_slice_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                            const void *wpe, int B, int T, int C, int v0, int Vs);
void cu_embedding_slice_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                            const int32_t *tok, int B, int T, int C, int v0, int Vs);
size_t cu_embedding_scratch_bytes(const be_limits *lim);

/* ---- cu_norm.cu ---- */
void cu_layernorm_fwd(be_backend *be, void *out, float *mean, float *rstd, const void *inp,
                      const void *w, const void *b, int N, int C);
void cu_layernorm_bwd(be_backend *be, void *dinp, float *dw, float *db, const void *dout,
                      const void *inp, const void *w, const float *mean, const float *rstd, int N,
                      int C);
size_t cu_norm_scratch_bytes(const be_limits *lim);

/* ---- cu_elementwise.cu ---- */
void cu_gelu_fwd(be_backend *be, void *out, const void *inp, size_t n);
void cu_gelu_bwd(be_backend *be, void *dinp, const void *inp, const void *dout, size_t n);
void cu_residual_add(be_backend *be, void *out, const void *a, const void *b, size_t n);
void cu_bias_add(be_backend *be, void *out, const void *bias, int M, int N);
void cu_add_f32(be_backend *be, float *y, const float *x, size_t n);
void cu_bias_bwd(be_backend *be, float *dbias, const void *dout, int M, int N);
size_t cu_elementwise_scratch_bytes(const be_limits *lim);

/* ---- cu_attention.cu ---- */
size_t cu_attention_state_bytes(be_backend *be, int B, int T, int NH);
void cu_attention_fwd(be_backend *be, void *out, void *state, const void *qkv, int B, int T, int C,
                      int NH, int W);
void cu_attention_bwd(be_backend *be, void *dqkv, const void *dout, const void *out,
                      const void *qkv, const void *state, int B, int T, int C, int NH, int W);
size_t cu_attention_scratch_bytes(const be_limits *lim);

/* ---- cu_classifier.cu ---- */
void cu_classifier_fwd_bwd(be_backend *be, float *losses, void *dx, float *dwte, const void *x,
                           const void *wte, const int32_t *targets, int N, int C, int V, int Vp,
                           float dloss);
void cu_classifier_slice_stats(be_backend *be, float *stats, void *logits, const void *x,
                               const void *wte, const int32_t *targets, int R, int C, int Vs,
                               int v0);
void cu_classifier_slice_finish(be_backend *be, float *losses, void *dx, float *dwte, void *logits,
                                const void *x, const void *wte, const int32_t *targets,
                                const float *stats, int P, int R, int C, int Vs, int v0,
                                float dloss);
size_t cu_classifier_scratch_bytes(const be_limits *lim);

/* ---- cu_optim.cu ---- */
void cu_adamw_step(be_backend *be, float *w, void *w_act, float *g, float *m, float *v, size_t n,
                   float lr, float b1, float b2, float eps, float wd, int t, float gscale);
void cu_lamb_moments(be_backend *be, float *g_to_u, const float *w, float *m, float *v, size_t n,
                     float b1, float b2, float eps, float wd, int t, float gscale, double *w_sq,
                     double *u_sq);
void cu_lamb_apply(be_backend *be, float *w, void *w_act, float *u, size_t n, float step);
size_t cu_optim_scratch_bytes(const be_limits *lim);

/* ---- cu_reduce.cu ---- */
double cu_sum_squares(be_backend *be, const float *x, size_t n);
double cu_sum(be_backend *be, const float *x, size_t n);
int cu_has_nonfinite(be_backend *be, const float *x, size_t n);
size_t cu_reduce_scratch_bytes(const be_limits *lim);

#endif
