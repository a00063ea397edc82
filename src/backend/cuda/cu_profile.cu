/* cu_profile.cu - an op-level profile of the CUDA backend (MS_CUDA_PROFILE=1):
 * every op of the table is timed with a pair of CUDA events and the totals
 * are printed, largest first, when the backend is destroyed (GEMMs per
 * shape, so the table says which product dominates).
 *
 * It wraps the op pointers of the table (the originals are kept in the
 * profiler), so it costs nothing when off.  Events are recorded without
 * waiting; the pending pairs are read when the pool is full (one stream
 * synchronisation per CU_PROF_PAIRS ops) and at the end.  Profiling mode
 * therefore adds a few synchronisations per step: use it to find where the
 * time goes, not to measure the step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_internal.h"

extern "C" {
#include "base/log.h"
}

#define CU_PROF_PAIRS 2048
#define CU_PROF_KEYS 256

typedef struct {
    char name[64];
    double ms;
    long calls;
} prof_key;

typedef struct {
    be_backend orig; /* the unwrapped table */
    cudaEvent_t ev[2 * CU_PROF_PAIRS];
    int key_of[CU_PROF_PAIRS];
    int n_pending;
    prof_key keys[CU_PROF_KEYS];
    int n_keys;
} cu_prof;

static cu_prof *prof_of(be_backend *be) {
    return (cu_prof *)cu_of(be)->profile;
}

static int prof_key_index(cu_prof *p, const char *name) {
    for (int i = 0; i < p->n_keys; i++)
        if (!strcmp(p->keys[i].name, name)) return i;
    if (p->n_keys < CU_PROF_KEYS - 1) {
        snprintf(p->keys[p->n_keys].name, sizeof p->keys[0].name, "%s", name);
        return p->n_keys++;
    }
    if (p->n_keys == CU_PROF_KEYS - 1) /* the last key collects the rest */
        snprintf(p->keys[p->n_keys++].name, sizeof p->keys[0].name, "(other shapes)");
    return CU_PROF_KEYS - 1;
}

/* Read every pending pair (waits for the stream). */
static void prof_flush(be_backend *be) {
    cu_prof *p = prof_of(be);
    if (!p->n_pending) return;
    CU_CHECK(cudaStreamSynchronize(cu_of(be)->stream));
    for (int i = 0; i < p->n_pending; i++) {
        float ms = 0;
        CU_CHECK(cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]));
        p->keys[p->key_of[i]].ms += ms;
        p->keys[p->key_of[i]].calls++;
    }
    p->n_pending = 0;
}

static int prof_begin(be_backend *be, const char *name) {
    cu_prof *p = prof_of(be);
    if (p->n_pending == CU_PROF_PAIRS) prof_flush(be);
    int i = p->n_pending++;
    p->key_of[i] = prof_key_index(p, name);
    CU_CHECK(cudaEventRecord(p->ev[2 * i], cu_of(be)->stream));
    return i;
}

static void prof_end(be_backend *be, int i) {
    CU_CHECK(cudaEventRecord(prof_of(be)->ev[2 * i + 1], cu_of(be)->stream));
}

static int cmp_ms(const void *a, const void *b) {
    double x = ((const prof_key *)a)->ms, y = ((const prof_key *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

void cu_profile_report(be_backend *be) {
    cu_prof *p = prof_of(be);
    if (!p) return;
    prof_flush(be);
    qsort(p->keys, (size_t)p->n_keys, sizeof *p->keys, cmp_ms);
    double total = 0;
    for (int i = 0; i < p->n_keys; i++)
        total += p->keys[i].ms;
    ms_info("cuda profile (MS_CUDA_PROFILE): %.1f ms of device time in ops", total);
    ms_info("  %-40s %8s %12s %7s %10s", "op", "calls", "total ms", "share", "avg us");
    for (int i = 0; i < p->n_keys; i++) {
        const prof_key *k = &p->keys[i];
        ms_info("  %-40s %8ld %12.2f %6.1f%% %10.1f", k->name, k->calls, k->ms,
                total > 0 ? 100 * k->ms / total : 0, k->calls ? 1e3 * k->ms / k->calls : 0);
    }
}

void cu_profile_free(be_backend *be) {
    cu_prof *p = prof_of(be);
    if (!p) return;
    for (int i = 0; i < 2 * CU_PROF_PAIRS; i++)
        if (p->ev[i]) cudaEventDestroy(p->ev[i]);
    free(p);
    cu_of(be)->profile = NULL;
}

/* Wrappers: PW_VOID(op, (params), (args)) times be->op under its name. */
#define PW_VOID(op, params, args)                                                                  \
    static void prof_##op params {                                                                 \
        int i_ = prof_begin(be, #op);                                                              \
        prof_of(be)->orig.op args;                                                                 \
        prof_end(be, i_);                                                                          \
    }

PW_VOID(embedding_fwd,
        (be_backend * be, void *out, const int32_t *tok, const void *wte, const void *wpe, int B,
         int T, int C),
        (be, out, tok, wte, wpe, B, T, C))
PW_VOID(embedding_bwd,
        (be_backend * be, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B,
         int T, int C),
        (be, dwte, dwpe, dout, tok, B, T, C))
PW_VOID(layernorm_fwd,
        (be_backend * be, void *out, float *mean, float *rstd, const void *inp, const void *w,
         const void *b, int N, int C),
        (be, out, mean, rstd, inp, w, b, N, C))
PW_VOID(layernorm_bwd,
        (be_backend * be, void *dinp, float *dw, float *db, const void *dout, const void *inp,
         const void *w, const float *mean, const float *rstd, int N, int C),
        (be, dinp, dw, db, dout, inp, w, mean, rstd, N, C))
PW_VOID(bias_bwd, (be_backend * be, float *dbias, const void *dout, int M, int N),
        (be, dbias, dout, M, N))
PW_VOID(attention_fwd,
        (be_backend * be, void *out, void *state, const void *qkv, int B, int T, int C, int NH,
         int W),
        (be, out, state, qkv, B, T, C, NH, W))
PW_VOID(attention_bwd,
        (be_backend * be, void *dqkv, const void *dout, const void *out, const void *qkv,
         const void *state, int B, int T, int C, int NH, int W),
        (be, dqkv, dout, out, qkv, state, B, T, C, NH, W))
PW_VOID(gelu_fwd, (be_backend * be, void *out, const void *inp, size_t n), (be, out, inp, n))
PW_VOID(gelu_bwd, (be_backend * be, void *dinp, const void *inp, const void *dout, size_t n),
        (be, dinp, inp, dout, n))
PW_VOID(residual_add, (be_backend * be, void *out, const void *a, const void *b, size_t n),
        (be, out, a, b, n))
PW_VOID(bias_add, (be_backend * be, void *out, const void *bias, int M, int N),
        (be, out, bias, M, N))
PW_VOID(add_f32, (be_backend * be, float *y, const float *x, size_t n), (be, y, x, n))
PW_VOID(to_act, (be_backend * be, void *dst, const float *src, size_t n), (be, dst, src, n))
PW_VOID(classifier_fwd_bwd,
        (be_backend * be, float *losses, void *dx, float *dwte, const void *x, const void *wte,
         const int32_t *targets, int N, int C, int V, int Vp, float dloss),
        (be, losses, dx, dwte, x, wte, targets, N, C, V, Vp, dloss))
PW_VOID(adamw_step,
        (be_backend * be, float *w, void *w_act, const float *g, float *m, float *v, size_t n,
         float lr, float b1, float b2, float eps, float wd, int t, float gscale),
        (be, w, w_act, g, m, v, n, lr, b1, b2, eps, wd, t, gscale))

/* GEMMs are keyed by shape: "gemm NT 768x3072x65536 bf16" etc. */
static void prof_gemm(be_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                      const void *A, int lda, const void *Bm, int ldb, float beta, void *C, int ldc,
                      int c_f32, const void *bias, be_epilogue epi, void *pre) {
    char name[64];
    snprintf(name, sizeof name, "gemm %c%c %dx%dx%d%s%s%s", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N,
             K, c_f32 ? " f32" : "", epi == BE_EPI_GELU ? " +gelu" : bias ? " +bias" : "",
             beta != 0.0f ? " +=" : "");
    int i = prof_begin(be, name);
    prof_of(be)->orig.gemm(be, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, C, ldc, c_f32, bias,
                           epi, pre);
    prof_end(be, i);
}

/* Replace the op pointers by the timed wrappers when MS_CUDA_PROFILE is set
 * (and not "0").  Returns an error only when the events cannot be made. */
ms_status cu_profile_install(be_backend *be) {
    const char *env = getenv("MS_CUDA_PROFILE");
    if (!env || !*env || !strcmp(env, "0")) return MS_OK;
    cu_prof *p = (cu_prof *)calloc(1, sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "cuda profile: out of host memory");
    for (int i = 0; i < 2 * CU_PROF_PAIRS; i++)
        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            cu_of(be)->profile = p;
            cu_profile_free(be);
            return ms_error(MS_ERR_INTERNAL, "cuda profile: cannot create events");
        }
    p->orig = *be;
    cu_of(be)->profile = p;
#define PW_SET(op) be->op = prof_##op
    PW_SET(embedding_fwd);
    PW_SET(embedding_bwd);
    PW_SET(layernorm_fwd);
    PW_SET(layernorm_bwd);
    PW_SET(gemm);
    PW_SET(bias_bwd);
    PW_SET(attention_fwd);
    PW_SET(attention_bwd);
    PW_SET(gelu_fwd);
    PW_SET(gelu_bwd);
    PW_SET(residual_add);
    PW_SET(bias_add);
    PW_SET(add_f32);
    PW_SET(to_act);
    PW_SET(classifier_fwd_bwd);
    PW_SET(adamw_step);
#undef PW_SET
    ms_info("cuda profile: timing every op with CUDA events (MS_CUDA_PROFILE=%s)", env);
    return MS_OK;
}
