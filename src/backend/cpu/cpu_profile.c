/* cpu_profile.c - an op-level profile of the CPU backend (--cpu-profile 1):
 * every op of the table is timed on the host clock (the ops run
 * synchronously), and the totals are printed, largest first, when the
 * backend is destroyed: GEMMs per shape and layout with their GFLOP/s, so
 * the table says which product dominates and how far each runs from the
 * machine's sgemm rate (issue 15: per-op rates against the GEMM).
 *
 * It wraps the op pointers of the table (the originals are kept in the
 * profiler), so it costs nothing when off, and two clock reads and a table
 * lookup an op when on.
 * The op spans are not put on the trace: on the CPU they are the host's
 * own time, which the trace's compute lane already shows.  Use it to find
 * where the time goes, not to measure the step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_ops.h"
#include "backend/cpu/cpu_internal.h"
#include "base/log.h"
#include "base/timeutil.h"

#define CPU_PROF_KEYS 256

typedef struct {
    char name[64];
    double sec, flops;
    long calls;
} prof_key;

typedef struct {
    be_backend orig; /* the unwrapped table */
    prof_key keys[CPU_PROF_KEYS];
    int n_keys;
} cpu_prof;

static cpu_prof *prof_of(be_backend *be) {
    return cpu_ctx_of(be)->profile;
}

/* The key of `name`; the last key collects the shapes past the table. */
static prof_key *prof_key_of(cpu_prof *p, const char *name) {
    for (int i = 0; i < p->n_keys; i++)
        if (!strcmp(p->keys[i].name, name)) return &p->keys[i];
    if (p->n_keys < CPU_PROF_KEYS - 1) {
        snprintf(p->keys[p->n_keys].name, sizeof p->keys[0].name, "%s", name);
        return &p->keys[p->n_keys++];
    }
    if (p->n_keys == CPU_PROF_KEYS - 1)
        snprintf(p->keys[p->n_keys++].name, sizeof p->keys[0].name, "(other shapes)");
    return &p->keys[CPU_PROF_KEYS - 1];
}

static void prof_add(be_backend *be, const char *name, double t0, double flops) {
    prof_key *k = prof_key_of(prof_of(be), name);
    k->sec += ms_now() - t0;
    k->flops += flops;
    k->calls++;
}

static int cmp_sec(const void *a, const void *b) {
    double x = ((const prof_key *)a)->sec, y = ((const prof_key *)b)->sec;
    return x < y ? 1 : x > y ? -1 : 0;
}

void cpu_profile_report(be_backend *be) {
    cpu_prof *p = prof_of(be);
    if (!p) return;
    qsort(p->keys, (size_t)p->n_keys, sizeof *p->keys, cmp_sec);
    double total = 0;
    for (int i = 0; i < p->n_keys; i++)
        total += p->keys[i].sec;
    ms_info("cpu profile (--cpu-profile, %d threads): %.1f ms in ops", cpu_ctx_of(be)->threads,
            total * 1e3);
    ms_info("  %-40s %8s %12s %7s %10s %8s", "op", "calls", "total ms", "share", "avg us",
            "GFLOP/s");
    for (int i = 0; i < p->n_keys; i++) {
        const prof_key *k = &p->keys[i];
        char rate[16] = "";
        /* more decimals below 10, so a slow run's tiny GEMM (sanitizers, a loaded core)
         * never reads 0.0 */
        if (k->flops > 0 && k->sec > 0) {
            double g = k->flops / k->sec / 1e9;
            snprintf(rate, sizeof rate, "%.*f", g >= 10 ? 1 : g >= 0.01 ? 3 : 6, g);
        }
        ms_info("  %-40s %8ld %12.2f %6.1f%% %10.1f %8s", k->name, k->calls, k->sec * 1e3,
                total > 0 ? 100 * k->sec / total : 0, k->calls ? 1e6 * k->sec / k->calls : 0, rate);
    }
}

void cpu_profile_free(be_backend *be) {
    free(prof_of(be));
    cpu_ctx_of(be)->profile = NULL;
}

/* Wrappers: PW_VOID(op, (params), (args)) times be->op under its name (backend_ops.h lists
 * the ops both profilers time). */
#define PW_VOID(op, params, args)                                                                  \
    static void prof_##op params {                                                                 \
        double t0_ = ms_now();                                                                     \
        prof_of(be)->orig.op args;                                                                 \
        prof_add(be, #op, t0_, 0);                                                                 \
    }

BE_VOID_OPS(PW_VOID)
PW_VOID(zero, (be_backend * be, void *ptr, size_t bytes), (be, ptr, bytes))
PW_VOID(lamb_moments,
        (be_backend * be, float *g_to_u, const float *w, float *m, float *v, size_t n, float b1,
         float b2, float eps, float wd, int t, float gscale, double *w_sq, double *u_sq),
        (be, g_to_u, w, m, v, n, b1, b2, eps, wd, t, gscale, w_sq, u_sq))
PW_VOID(lamb_apply, (be_backend * be, float *w, void *w_act, float *u, size_t n, float step),
        (be, w, w_act, u, n, step))

static double prof_sum_squares(be_backend *be, const float *x, size_t n) {
    double t0 = ms_now(), s = prof_of(be)->orig.sum_squares(be, x, n);
    prof_add(be, "sum_squares", t0, 0);
    return s;
}

/* The fused classifier: its three GEMMs' FLOPs (logits, dx, dwte), or the
 * first one's without the gradient. */
static void prof_classifier_fwd_bwd(be_backend *be, float *losses, void *dx, float *dwte,
                                    const void *x, const void *wte, const int32_t *targets, int N,
                                    int C, int V, int Vp, float dloss) {
    double t0 = ms_now();
    prof_of(be)->orig.classifier_fwd_bwd(be, losses, dx, dwte, x, wte, targets, N, C, V, Vp, dloss);
    char name[64];
    snprintf(name, sizeof name, "classifier %dx%dx%d%s", N, V, C, dx ? " fwd+bwd" : " fwd");
    prof_add(be, name, t0, (dx ? 3.0 : 1.0) * 2.0 * N * (double)V * C);
}

/* GEMMs are keyed by shape and layout: "gemm NT 256x2304x768 +bias" etc. */
static void prof_gemm(be_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                      const void *A, int lda, const void *Bm, int ldb, float beta, void *C, int ldc,
                      int c_f32, const void *bias, be_epilogue epi, void *pre) {
    double t0 = ms_now();
    prof_of(be)->orig.gemm(be, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, C, ldc, c_f32, bias,
                           epi, pre);
    char name[64];
    snprintf(name, sizeof name, "gemm %c%c %dx%dx%d%s%s", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
             epi == BE_EPI_GELU ? " +gelu"
             : bias             ? " +bias"
                                : "",
             beta != 0.0f ? " +=" : "");
    prof_add(be, name, t0, 2.0 * M * (double)N * K);
}

/* Replace the op pointers by the timed wrappers (be_options.cpu_profile). */
ms_status cpu_profile_install(be_backend *be) {
    cpu_prof *p = calloc(1, sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "cpu profile: out of memory");
    p->orig = *be;
    cpu_ctx_of(be)->profile = p;
    BE_VOID_OPS(BE_OP_INSTALL)
#define PW_SET(op) be->op = prof_##op
    PW_SET(gemm);
    PW_SET(zero);
    PW_SET(classifier_fwd_bwd);
    PW_SET(lamb_moments);
    PW_SET(lamb_apply);
    PW_SET(sum_squares);
#undef PW_SET
    ms_info("cpu profile: timing every op of the CPU backend (--cpu-profile): a table at exit");
    return MS_OK;
}
