/* backend.h - the compute interface: device memory, copies and every op of
 * the model with its forward and backward (a table of function pointers plus
 * a context, like ggml's backend).
 *
 * Callers: the model (src/model), the optimiser (src/optim), the trainer.
 * Memory: be->alloc returns device memory owned by the caller, released with
 * be->free.  Ops never allocate in the step loop; scratch they need is sized
 * once by be_reserve() (called by the model at creation).
 *
 * Conventions for every op:
 *  - row-major tensors; N = B*T rows; shapes are written in the comment of
 *    each op, e.g. out (N,C).
 *  - dtypes: "act" arguments are in the backend's compute dtype
 *    (be->act_dtype: fp32 on the CPU, bf16 on CUDA); "f32" arguments are
 *    always fp32 (master weights, gradients, optimiser state, statistics).
 *    Integer token arrays are int32 in device memory.
 *  - "+=" marks an output that is accumulated into; "=" one that is
 *    overwritten.
 *  - determinism: the same inputs and thread count give bitwise-equal
 *    results run after run (no atomics, fixed reduction orders).
 * Thread-safety: one backend instance is used by one thread at a time.
 */
#ifndef BE_BACKEND_H
#define BE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum { BE_F32 = 0, BE_BF16 = 1 } be_dtype;

typedef enum {
    BE_EPI_NONE = 0, /* C = alpha*op(A)op(B) + beta*C (+ bias)            */
    BE_EPI_GELU = 1, /* pre = alpha*op(A)op(B) + bias ; C = gelu(pre)     */
} be_epilogue;

/* Scratch requirements the model announces before the step loop. */
typedef struct {
    int B, T, C, NH; /* largest attention shapes used */
    int Vp;          /* padded vocabulary (classifier) */
    size_t max_n;    /* largest element count passed to a reduction op */
} be_limits;

typedef struct be_backend be_backend;

struct be_backend {
    const char *name;      /* "cpu", "cuda" */
    char device_name[128]; /* the processor's own name ("NVIDIA H200", the CPU model) */
    be_dtype act_dtype;
    int threads; /* compute threads (CPU) */
    /* the kernels' limits on a model (0: none): the attention's head size,
     * the LayerNorm's width; a model past them is refused when it is made */
    int max_head_size, max_dim;
    void *ctx; /* backend-private */

    /* ---- memory ---- */
    void *(*alloc)(be_backend *be, size_t bytes); /* zeroed, 64-aligned; NULL on OOM */
    void (*free)(be_backend *be, void *p);
    void (*to_device)(be_backend *be, void *dst, const void *src, size_t bytes);
    void (*to_host)(be_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(be_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(be_backend *be, void *p, size_t bytes);
    void (*sync)(be_backend *be);
    /* Size internal scratch for the given limits; may be called again with
     * larger limits (grows, never shrinks). */
    ms_status (*reserve)(be_backend *be, const be_limits *lim);
    void (*destroy)(be_backend *be);

    /* ---- host interop and timers ---- */
    /* 1 if p is device memory the host cannot address (always 0 on the
     * CPU).  Used by the MPI communicator to stage device buffers. */
    int (*is_device)(be_backend *be, const void *p);
    /* Page-locked host memory for staging copies (plain memory on the CPU);
     * NULL on failure.  Released with host_free. */
    void *(*host_alloc)(be_backend *be, size_t bytes);
    void (*host_free)(be_backend *be, void *p);
    /* The stream every op runs on (CUDA: a cudaStream_t; NULL on the CPU),
     * for libraries that enqueue work after the ops (NCCL). */
    void *stream;
    /* Device timers, an event pool (monitor/devtime.h builds spans on it).
     * ev_record enqueues a timestamp in the op stream (a CUDA event; the
     * host clock, read at once, on the CPU) and returns its handle, or -1
     * when every handle of the pool is in flight; it never waits.
     * ev_poll(h): if the timestamp has been reached, *t_ns = when, on the
     * host's monotonic clock (base/events.h ms_ev_now), the handle goes back
     * to the pool and 1 is returned; 0 while it is pending (never waits).
     * ev_anchor: call where the stream is likely idle (right after a
     * synchronous read-back): if it is, device times are re-aligned to the
     * host clock there (the two clocks drift); it never waits.  One thread,
     * like the rest of the backend. */
    int (*ev_record)(be_backend *be);
    int (*ev_poll)(be_backend *be, int h, int64_t *t_ns);
    void (*ev_anchor)(be_backend *be);
    /* The most device memory held at once so far, in bytes: the blocks of
     * be->alloc and the ops' scratch (be->reserve); not a GEMM library's own
     * workspace nor the runtime's.  The CPU counts the same host blocks. */
    double (*mem_peak)(be_backend *be);

    /* ---- ops ---- */

    /* out (B,T,C) act = wte[tok[b,t]] + wpe[t];  tok (B,T) int32,
     * wte (Vp,C) act, wpe (Tmax,C) act. */
    void (*embedding_fwd)(be_backend *be, void *out, const int32_t *tok, const void *wte,
                          const void *wpe, int B, int T, int C);
    /* dwte (Vp,C) f32 +=, dwpe (Tmax,C) f32 +=, from dout (B,T,C) act. */
    void (*embedding_bwd)(be_backend *be, float *dwte, float *dwpe, const void *dout,
                          const int32_t *tok, int B, int T, int C);
    /* Vocabulary-parallel embedding over one slice of the vocabulary (token
     * ids v0..v0+Vs-1, held as wte (Vs,C) act):
     *   out (B,T,C) act = (v0 <= tok < v0+Vs ? wte[tok-v0] : 0) [+ wpe[t]]
     * wpe (Tmax,C) act may be NULL (no position term).  Summed over the
     * slices of a partition of the vocabulary, with wpe on one slice only,
     * this is embedding_fwd exactly (every other term is 0). */
    void (*embedding_slice_fwd)(be_backend *be, void *out, const int32_t *tok, const void *wte,
                                const void *wpe, int B, int T, int C, int v0, int Vs);
    /* dwte (Vs,C) f32 += the rows of dout (B,T,C) act whose token is in the
     * slice; dwpe (Tmax,C) f32 += dout when dwpe != NULL. */
    void (*embedding_slice_bwd)(be_backend *be, float *dwte, float *dwpe, const void *dout,
                                const int32_t *tok, int B, int T, int C, int v0, int Vs);

    /* out (N,C) act =, mean/rstd (N) f32 = ; eps 1e-5. */
    void (*layernorm_fwd)(be_backend *be, void *out, float *mean, float *rstd, const void *inp,
                          const void *w, const void *b, int N, int C);
    /* dinp (N,C) act +=, dw/db (C) f32 +=. */
    void (*layernorm_bwd)(be_backend *be, void *dinp, float *dw, float *db, const void *dout,
                          const void *inp, const void *w, const float *mean, const float *rstd,
                          int N, int C);

    /* General matrix multiply, row-major:
     *   C (M,N) = alpha * op(A) op(B) + beta * C  [+ bias (N) broadcast over rows]
     * op(A) is (M,K): A is (M,K) with row stride lda, or (K,M) if ta.
     * op(B) is (K,N): B is (K,N) with row stride ldb, or (N,K) if tb.
     * A, B, bias: act.  C: act, or f32 when c_f32 (weight gradients).
     * With BE_EPI_GELU: pre (M,N) act = the matmul + bias (beta must be 0),
     * and C = gelu_tanh(pre); pre may be NULL only for BE_EPI_NONE. */
    void (*gemm)(be_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                 int lda, const void *Bm, int ldb, float beta, void *C, int ldc, int c_f32,
                 const void *bias, be_epilogue epi, void *pre);
    /* dbias (N) f32 += column sums of dout (M,N) act. */
    void (*bias_bwd)(be_backend *be, float *dbias, const void *dout, int M, int N);

    /* Bytes of per-layer state attention_fwd saves for attention_bwd
     * (the CPU keeps the probabilities, (B,NH,T,T); CUDA keeps log-sum-exp). */
    size_t (*attention_state_bytes)(be_backend *be, int B, int T, int NH);
    /* Causal multi-head attention; window W > 0 lets query t see keys
     * max(0, t-W+1)..t, W <= 0 means full causal.
     * qkv (B,T,3C) act: [q | k | v], head h at columns h*hs..(h+1)*hs-1 of
     * each third (hs = C/NH).  out (B,T,C) act =, state = saved for bwd. */
    void (*attention_fwd)(be_backend *be, void *out, void *state, const void *qkv, int B, int T,
                          int C, int NH, int W);
    /* dqkv (B,T,3C) act =, from dout (B,T,C) act, the forward's output
     * out (B,T,C) act (flash attention's backward needs rowsum(dout*out);
     * the CPU, which keeps the probabilities, ignores it), qkv and state. */
    void (*attention_bwd)(be_backend *be, void *dqkv, const void *dout, const void *out,
                          const void *qkv, const void *state, int B, int T, int C, int NH, int W);

    /* out = gelu_tanh(inp), n elements act. */
    void (*gelu_fwd)(be_backend *be, void *out, const void *inp, size_t n);
    /* dinp = gelu'(inp) * dout (act, =). */
    void (*gelu_bwd)(be_backend *be, void *dinp, const void *inp, const void *dout, size_t n);
    /* out = a + b (act; out may alias a or b). */
    void (*residual_add)(be_backend *be, void *out, const void *a, const void *b, size_t n);
    /* out (M,N) act += bias (N) act, broadcast over the rows. */
    void (*bias_add)(be_backend *be, void *out, const void *bias, int M, int N);
    /* y (n) f32 += x (n) f32. */
    void (*add_f32)(be_backend *be, float *y, const float *x, size_t n);
    /* dst (n) act = src (n) f32, rounded to nearest even (the act copy of
     * the master weights); a copy when the act dtype is f32 (dst may equal
     * src). */
    void (*to_act)(be_backend *be, void *dst, const float *src, size_t n);

    /* Fused tied classifier + softmax cross-entropy (+ gradient):
     *   logits (N,Vp) = x (N,C) @ wte (Vp,C)^T, only the first V columns
     *   take part in the softmax (padded rows never do).
     *   losses (N) f32 = -log softmax(logits)[target].
     *   If dx != NULL: dx (N,C) act = dlogits @ wte and dwte (Vp,C) f32 +=
     *   dlogits^T @ x, where dlogits = dloss * (softmax - onehot(target)).
     * Never materialises more than a bounded chunk of logits at a time. */
    void (*classifier_fwd_bwd)(be_backend *be, float *losses, void *dx, float *dwte, const void *x,
                               const void *wte, const int32_t *targets, int N, int C, int V, int Vp,
                               float dloss);
    /* Vocabulary-parallel classifier, in two phases per chunk of R rows, for
     * one slice of the vocabulary: ids v0..v0+Vs-1 held as wte (Vs,C) act,
     * all < V (padded ids belong to no slice; Vs may be 0).  Between the
     * phases the caller gathers the stats of all P slices (a partition of
     * [0,V)) in slice order.
     * Phase 1:  logits (R,Vs) act = x (R,C) @ wte^T;  stats (R,3) f32 = per
     *   row: max of its logits, sum of exp(logit - max), and the logit of
     *   targets[i] if it lies in the slice, else 0 (Vs = 0: -FLT_MAX, 0, 0). */
    void (*classifier_slice_stats)(be_backend *be, float *stats, void *logits, const void *x,
                                   const void *wte, const int32_t *targets, int R, int C, int Vs,
                                   int v0);
    /* Phase 2, from stats (P,R,3) f32 of all slices:  lse = log-sum-exp over
     * the slices (combined in slice order, so every slice gets bitwise the
     * same value), losses (R) f32 = lse - logit[target] (the same on every
     * slice).  If dx != NULL: logits become dlogits = dloss * (softmax -
     * onehot(target)) in place, dx (R,C) act = dlogits @ wte (this slice's
     * share of the gradient: the sum over slices is the full dx) and dwte
     * (Vs,C) f32 += dlogits^T @ x. */
    void (*classifier_slice_finish)(be_backend *be, float *losses, void *dx, float *dwte,
                                    void *logits, const void *x, const void *wte,
                                    const int32_t *targets, const float *stats, int P, int R, int C,
                                    int Vs, int v0, float dloss);

    /* AdamW (PyTorch's): g' = g*gscale; m = b1 m + (1-b1) g';
     * v = b2 v + (1-b2) g'^2; w -= lr*wd*w; w -= lr * mhat/(sqrt(vhat)+eps)
     * with bias corrections 1-b^t (t >= 1).  w,g,m,v (n) f32.  If w_act is
     * non-NULL (backends whose act dtype is not f32) it receives w.  The
     * update consumes the gradient: g is 0 on return, so the next step's
     * accumulation needs no zeroing pass of its own (the store goes to a
     * line the update has just read). */
    void (*adamw_step)(be_backend *be, float *w, void *w_act, float *g, float *m, float *v,
                       size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                       float gscale);
    /* LAMB phase 1: update m, v as AdamW and write the update direction
     * u = mhat/(sqrt(vhat)+eps) + wd*w into g (in place).  Returns on the
     * host the sums of squares of w and of u (for the trust ratio, which
     * the caller assembles across shards). */
    void (*lamb_moments)(be_backend *be, float *g_to_u, const float *w, float *m, float *v,
                         size_t n, float b1, float b2, float eps, float wd, int t, float gscale,
                         double *w_sq, double *u_sq);
    /* w -= step * u (step = lr * trust ratio); u (the gradient's buffer) is
     * 0 on return, as adamw_step leaves g. */
    void (*lamb_apply)(be_backend *be, float *w, void *w_act, float *u, size_t n, float step);

    /* Sum of squares of x (n) f32, as a double on the host (deterministic). */
    double (*sum_squares)(be_backend *be, const float *x, size_t n);
    /* Sum of x (n) f32 (losses), as a double on the host. */
    double (*sum)(be_backend *be, const float *x, size_t n);
    /* 1 if any of x (n) f32 is NaN or Inf. */
    int (*has_nonfinite)(be_backend *be, const float *x, size_t n);
};

/* Element size of a dtype. */
static inline size_t be_dtype_size(be_dtype d) {
    return d == BE_BF16 ? 2 : 4;
}

/* How a backend is created (a plain struct: start from be_options_default()
 * and set what differs; the trainer fills it from its options). */
typedef struct {
    int threads;        /* CPU: OpenMP threads (0 = all cores); CUDA: unused */
    int cuda_profile;   /* CUDA: 1 times every op with CUDA events, a table at exit
                           (--cuda-profile, env MS_CUDA_PROFILE) */
    int cuda_fuse_gelu; /* CUDA: 1 fuses bias + GeLU into the GEMM epilogue, 0 runs
                           them as a kernel of their own (--cuda-fuse-gelu) */
    int cpu_profile;    /* CPU: 1 times every op on the host clock, a table at exit
                           (--cpu-profile, env MS_CPU_PROFILE) */
    be_dtype cpu_dtype; /* CPU: the act dtype, BE_F32 (default) or BE_BF16
                           (--cpu-dtype, env MS_CPU_DTYPE) */
} be_options;

/* --cpu-dtype's value (NULL or "fp32": BE_F32, "bf16": BE_BF16) into *out;
 * MS_ERR_ARG names the choices, says that bf16 asked of a device other than
 * the CPU has no effect there (the CUDA backend is always bf16), or why the
 * CPU cannot run it (be_cpu_bf16_missing). */
ms_status be_dtype_parse(const char *s, const char *device, be_dtype *out);

/* Defaults: all cores, no profile, GeLU fused. */
be_options be_options_default(void);

/* Warn of each option in o that the backend `device` does nothing with
 * (--cuda-profile or --cuda-fuse-gelu 0 on the CPU, --cpu-profile on CUDA):
 * a profile table that never prints looked like a bug.  Returns how many. */
int be_warn_ignored(const char *device, const be_options *o);

/* Create the CPU backend with `threads` OpenMP threads (0 = all cores).
 * Always available. */
ms_status be_cpu_create(be_backend **out, int threads);
/* The same with act dtype dt: BE_BF16 is the bf16 mode (activations and
 * the act copy of the weights in bf16, bf16 GEMMs through oneDNN with fp32
 * accumulation; master weights, gradients and optimiser state fp32): the
 * CUDA backend's numerics on the CPU.  MS_ERR_ARG with
 * be_cpu_bf16_missing()'s reason where it cannot run. */
ms_status be_cpu_create_dtype(be_backend **out, int threads, be_dtype dt);
/* NULL if the bf16 mode can run here, else why not: the program was built
 * without oneDNN, or the CPU has neither AVX512-BF16 nor AMX-BF16 (the
 * products would be emulated, slower than fp32). */
const char *be_cpu_bf16_missing(void);
/* The host's physical memory in bytes (sysconf: pages x page size; 0 when
 * unknown).  Physical, not MemAvailable: a fixed bound that refuses only
 * what can never fit, whatever else runs at the moment. */
double be_cpu_host_memory(void);
/* Buffers of need bytes in all on the host (what: who allocates them, as
 * "model"; parts: what they are, in words) against be_cpu_host_memory():
 * MS_OK when they fit (or the memory is unknown), else MS_ERR_NOMEM
 * naming what, the need in GB and the host's.  Call before allocating: a
 * model larger than the host is refused, not killed by the kernel's OOM
 * killer when its pages are touched. */
ms_status be_cpu_check_host_memory(const char *what, double need, const char *parts);
/* Tests: refuse the bf16 mode as on a CPU without it (main() calls it when
 * MS_CPU_BF16_DENY is set).  Call before any thread starts. */
void be_cpu_bf16_deny(int on);
/* Time every op of a CPU backend from now on, and print a table of them when
 * it is destroyed (be_options.cpu_profile). */
ms_status be_cpu_profile(be_backend *be);

/* The OpenBLAS kernel set the CPU backend's GEMMs run on (OpenBLAS's
 * openblas_get_corename(): "SkylakeX", "Haswell", "Prescott", ...).  A
 * DYNAMIC_ARCH OpenBLAS picks it when the library loads, from the CPU's
 * model number; a release older than the CPU falls back to old kernels
 * (Debian 12's picks the SSE3 "Prescott" set on an Emerald Rapids Xeon, a
 * fifth of the speed of its AVX-512 set there).  Only the environment
 * variable OPENBLAS_CORETYPE, read at load, changes it, so the program's
 * main() asks be_cpu_blas_core_suggest() and, when it names a core, sets the
 * variable and executes itself again (src/cli/main.c). */
const char *be_cpu_blas_core(void);
/* The core to ask for (OPENBLAS_CORETYPE) on this CPU, or NULL when the
 * one OpenBLAS chose already uses the best instruction set it has kernels
 * for (AVX-512: "SkylakeX", AVX2 with FMA: "Haswell"). */
const char *be_cpu_blas_core_suggest(void);
/* The decision itself, pure: the core to ask for when OpenBLAS chose
 * `chosen` on a CPU with (has_avx512: F, CD, BW, DQ and VL) and
 * (has_avx2_fma), or NULL.  Only a known older core is replaced, never a
 * name this code does not know (a newer OpenBLAS's); AVX2 kernels are kept
 * where the CPU splits each 512-bit operation in two (avx512_split: AMD's
 * Zen 4), whose AVX-512 kernels are no faster. */
const char *be_cpu_blas_core_for(const char *chosen, int has_avx512, int avx512_split,
                                 int has_avx2_fma);
/* main() says where the core came from ("OPENBLAS_CORETYPE", or "set by
 * megascale: OpenBLAS detected Prescott"); call before any thread starts. */
void be_cpu_blas_set_origin(const char *origin);
/* "OpenBLAS core SkylakeX (origin)" into buf, for start-up lines; buf. */
const char *be_cpu_blas_describe(char *buf, size_t n);

/* The CPU backend's fp32 GEMMs: OpenBLAS, or megascale's own GEMM
 * (src/backend/cpu/cpu_sgemm.c) with the microkernel for one vector width. */
typedef enum {
    BE_CPU_GEMM_OPENBLAS = 0,
    BE_CPU_GEMM_AVX2 = 1,   /* own, AVX2 + FMA: 4 x 24 tiles */
    BE_CPU_GEMM_AVX512 = 2, /* own, AVX-512: 8 x 48 tiles */
} be_cpu_gemm_kind;
/* Whether this CPU (and build) runs `kind` (OpenBLAS: always). */
int be_cpu_gemm_runs(int kind);
/* The own kernel for this CPU: AVX512 where it has full-width AVX-512, AVX2
 * where it has AVX2 and FMA (Zen 4, which splits 512-bit operations in two,
 * included), else OPENBLAS. */
int be_cpu_gemm_best(void);
/* The decision itself, pure: the kernel for a CPU with (has_avx512:
 * AVX-512 F), whose 512-bit units are half-width (avx512_split: Zen 4), with
 * (has_avx2_fma). */
int be_cpu_gemm_for(int has_avx512, int avx512_split, int has_avx2_fma);
/* The choice of the environment variable MS_CPU_GEMM, read into the run
 * context (ms_ctx.cpu_gemm): "auto" (unset: the default, be_cpu_gemm_best),
 * "own" (the same, but an error where there is none), "own-avx512",
 * "own-avx2" or "openblas".  Sets *kind, or fails with MS_ERR_ARG naming
 * the variable (an unknown value; a kernel this CPU cannot run). */
ms_status be_cpu_gemm_pick(int *kind);
/* "own AVX-512 kernel", "own AVX2 kernel" or "OpenBLAS". */
const char *be_cpu_gemm_name(int kind);
/* The MS_CPU_GEMM value that names kind ("own-avx512", "own-avx2",
 * "openblas"): the metrics' cpu_gemm. */
const char *be_cpu_gemm_value(int kind);
/* "fp32 GEMMs: own AVX-512 kernel" (or OpenBLAS, and why) into buf; buf. */
const char *be_cpu_gemm_describe(char *buf, size_t n);
/* The kind this CPU backend's fp32 GEMMs run on (0 = OpenBLAS: false). */
int be_cpu_gemm_own(const be_backend *be);
/* Switch them (tests, benchmarks; the peak probe tries OpenBLAS too):
 * MS_ERR_ARG where the kind cannot run here, MS_ERR_NOMEM without its
 * buffers. */
ms_status be_cpu_gemm_set(be_backend *be, int kind);

/* Create the CUDA backend on GPU `device` (< 0: the process's local MPI
 * rank modulo the number of GPUs, so ranks sharing a node share its GPUs);
 * o NULL: be_options_default().  Built when the CUDA toolkit was found
 * (MS_HAVE_CUDA); MS_ERR_NOTFOUND with the runtime's reason when there is
 * no usable GPU. */
ms_status be_cuda_create(be_backend **out, int device, const be_options *o);

/* Create a backend by name ("cpu"; "cuda" when built with CUDA); o NULL:
 * be_options_default(). */
ms_status be_create(be_backend **out, const char *name, const be_options *o);
void be_destroy(be_backend *be);

#endif
