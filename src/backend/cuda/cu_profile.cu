/* cu_profile.cu - an op-level profile of the CUDA backend (--cuda-profile 1):
 * every op of the table is timed on the device, each op becomes a span on
 * the event recorder's "device" lane (base/events.h: the merged timeline
 * shows every kernel's device time), and the totals are printed, largest
 * first, when the backend is destroyed (GEMMs per shape, so the table says
 * which product dominates).
 *
 * It wraps the op pointers of the table (the originals are kept in the
 * profiler), so it costs nothing when off.  Timestamps come from the
 * backend's device timer pool (cu_events.cu): recorded without waiting, the
 * pending pairs are read as they complete (polled, oldest first, at each
 * op), and only when the pool runs dry does the profiler wait for the
 * stream.  Use it to find where the time goes, not to measure the step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_internal.h"
#include "backend/backend_ops.h"

extern "C" {
#include "base/events.h"
#include "base/log.h"
}

#define CU_PROF_PAIRS 1024 /* ops in flight (2 timer handles each) */
#define CU_PROF_KEYS 256

typedef struct {
    char name[64];
    uint16_t ev_name; /* interned for the recorder */
    double ms;
    long calls;
} prof_key;

typedef struct {
    int h0, h1, key;
    int64_t t0; /* h0's time once polled (-1 before) */
} prof_pair;

typedef struct {
    be_backend orig; /* the unwrapped table */
    prof_pair pend[CU_PROF_PAIRS]; /* a ring: oldest at head */
    int head, n_pending;
    prof_key keys[CU_PROF_KEYS];
    int n_keys;
    uint16_t lane;
} cu_prof;

static cu_prof *prof_of(be_backend *be) {
    return (cu_prof *)cu_of(be)->profile;
}

static int prof_key_index(cu_prof *p, const char *name) {
    for (int i = 0; i < p->n_keys; i++)
        if (!strcmp(p->keys[i].name, name)) return i;
    if (p->n_keys < CU_PROF_KEYS - 1) {
        snprintf(p->keys[p->n_keys].name, sizeof p->keys[0].name, "%s", name);
        p->keys[p->n_keys].ev_name = ms_ev_intern(name);
        return p->n_keys++;
    }
    if (p->n_keys == CU_PROF_KEYS - 1) { /* the last key collects the rest */
        snprintf(p->keys[p->n_keys].name, sizeof p->keys[0].name, "(other shapes)");
        p->keys[p->n_keys].ev_name = ms_ev_intern("(other shapes)");
        p->n_keys++;
    }
    return CU_PROF_KEYS - 1;
}

/* Read the completed pairs, oldest first; stop at the first still pending
 * (one stream: later ones are pending too). */
static void prof_poll(be_backend *be) {
    cu_prof *p = prof_of(be);
    while (p->n_pending) {
        prof_pair *q = &p->pend[p->head];
        int64_t t1 = 0;
        if (q->h1 < 0) return; /* the op being timed now */
        if (q->t0 < 0 && !cu_ev_poll(be, q->h0, &q->t0)) {
            q->t0 = -1;
            return;
        }
        if (!cu_ev_poll(be, q->h1, &t1)) return;
        prof_key *k = &p->keys[q->key];
        k->ms += (double)(t1 - q->t0) / 1e6;
        k->calls++;
        ms_ev_span(k->ev_name, p->lane, q->t0, t1, NULL);
        p->head = (p->head + 1) % CU_PROF_PAIRS;
        p->n_pending--;
    }
}

/* Wait for the stream and read every pending pair. */
static void prof_flush(be_backend *be) {
    if (!prof_of(be)->n_pending) return;
    CU_CHECK(cudaStreamSynchronize(cu_of(be)->stream));
    prof_poll(be);
}

static int prof_begin(be_backend *be, const char *name) {
    cu_prof *p = prof_of(be);
    prof_poll(be);
    int h0 = p->n_pending < CU_PROF_PAIRS ? cu_ev_record(be) : -1;
    if (h0 < 0) { /* the pool (or the ring) is full: wait once */
        prof_flush(be);
        h0 = cu_ev_record(be);
    }
    MS_CHECKF(h0 >= 0, "cuda profile: no timer handle free after a flush");
    int i = (p->head + p->n_pending++) % CU_PROF_PAIRS;
    p->pend[i] = (prof_pair){h0, -1, prof_key_index(p, name), -1};
    return i;
}

static void prof_end(be_backend *be, int i) {
    cu_prof *p = prof_of(be);
    int h1 = cu_ev_record(be);
    if (h1 < 0) { /* the pool is dry: wait, and give back the pairs before i */
        CU_CHECK(cudaStreamSynchronize(cu_of(be)->stream));
        prof_poll(be);
        h1 = cu_ev_record(be);
    }
    MS_CHECKF(h1 >= 0, "cuda profile: no timer handle free");
    p->pend[i].h1 = h1;
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
    free(p);
    cu_of(be)->profile = NULL;
}

/* Wrappers: PW_VOID(op, (params), (args)) times be->op under its name (backend_ops.h lists
 * the ops both profilers time). */
#define PW_VOID(op, params, args)                                                                  \
    static void prof_##op params {                                                                 \
        int i_ = prof_begin(be, #op);                                                              \
        prof_of(be)->orig.op args;                                                                 \
        prof_end(be, i_);                                                                          \
    }

BE_VOID_OPS(PW_VOID)
PW_VOID(to_act, (be_backend * be, void *dst, const float *src, size_t n), (be, dst, src, n))
PW_VOID(classifier_fwd_bwd,
        (be_backend * be, float *losses, void *dx, float *dwte, const void *x, const void *wte,
         const int32_t *targets, int N, int C, int V, int Vp, float dloss),
        (be, losses, dx, dwte, x, wte, targets, N, C, V, Vp, dloss))

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

/* Replace the op pointers by the timed wrappers (be_options.cuda_profile:
 * --cuda-profile, env MS_CUDA_PROFILE).  Returns an error only when the
 * events cannot be made. */
ms_status cu_profile_install(be_backend *be) {
    cu_prof *p = (cu_prof *)calloc(1, sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "cuda profile: out of host memory");
    p->lane = ms_ev_intern("device");
    p->orig = *be;
    cu_of(be)->profile = p;
    BE_VOID_OPS(BE_OP_INSTALL)
#define PW_SET(op) be->op = prof_##op
    PW_SET(gemm);
    PW_SET(to_act);
    PW_SET(classifier_fwd_bwd);
#undef PW_SET
    ms_info("cuda profile: timing every op on the device (--cuda-profile / MS_CUDA_PROFILE): a "
            "table at exit, and each op on the trace's device lane");
    return MS_OK;
}
