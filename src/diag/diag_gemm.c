/* diag_gemm.c - the gemm check: the backend's GEMM against a naive product
 * in double on the host, then its speed against this node's history. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/bf16.h"
#include "base/ctx.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "diag/diag_internal.h"
#include "monitor/monitor.h"

/* The layouts the model uses: C = A B, A B^T (activations x weights), A^T B
 * (weight gradients). */
static const struct {
    int ta, tb;
    const char *name;
} layouts[] = {{0, 0, "NN"}, {0, 1, "NT"}, {1, 0, "TN"}};

/* ref (n,n) = op(A) op(B) in double; a, b (n,n) as the device sees them. */
static void reference(double *ref, const float *a, const float *b, int n, int ta, int tb) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) {
                double x = ta ? a[(size_t)k * n + i] : a[(size_t)i * n + k];
                double y = tb ? b[(size_t)j * n + k] : b[(size_t)k * n + j];
                s += x * y;
            }
            ref[(size_t)i * n + j] = s;
        }
}

/* Host floats -> the device's act dtype in dev (staging through tmp);
 * rounds the floats themselves to bf16 when the act dtype is bf16, so the
 * reference sees the same inputs. */
static void upload(be_backend *be, void *dev, float *h, uint16_t *tmp, size_t n) {
    if (be->act_dtype == BE_BF16) {
        for (size_t i = 0; i < n; i++) {
            tmp[i] = ms_f32_to_bf16(h[i]);
            h[i] = ms_bf16_to_f32(tmp[i]);
        }
        be->to_device(be, dev, tmp, n * 2);
    } else {
        be->to_device(be, dev, h, n * 4);
    }
}

static void download(be_backend *be, float *h, const void *dev, uint16_t *tmp, size_t n) {
    if (be->act_dtype == BE_BF16) {
        be->to_host(be, tmp, dev, n * 2);
        for (size_t i = 0; i < n; i++)
            h[i] = ms_bf16_to_f32(tmp[i]);
    } else {
        be->to_host(be, h, dev, n * 4);
    }
}

/* The worse of two errors: a NaN (a result that is not a number) is the
 * worst and stays, whatever comes after it.  (`!(e <= err)` alone let the
 * next finite error replace a NaN: a GEMM that wrote NaN passed.) */
static double worse(double err, double e) {
    return isnan(err) || e <= err ? err : e;
}

/* Relative max error max|c - ref| / max|ref| of one layout.  corrupt:
 * the injected fault, 1 (diag:gemm) an element off by one, 2 (diag:nan)
 * NaN in the first element and the next one off by a hair. */
static double layout_error(be_backend *be, void *da, void *db, void *dc, const float *a,
                           const float *b, float *c, double *ref, uint16_t *tmp, int n, int l,
                           int corrupt) {
    size_t nn = (size_t)n * n;
    be->gemm(be, layouts[l].ta, layouts[l].tb, n, n, n, 1.0f, da, n, db, n, 0.0f, dc, n, 0, NULL,
             BE_EPI_NONE, NULL);
    be->sync(be);
    download(be, c, dc, tmp, nn);
    if (corrupt == 1) c[nn / 2] += 1.0f; /* injected: a flipped result, as from a bad unit */
    if (corrupt == 2) c[0] = NAN;        /* injected: a unit that writes NaN, */
    if (corrupt == 2 && nn > 1) c[1] = nextafterf(c[1], INFINITY); /* then a finite error */
    reference(ref, a, b, n, layouts[l].ta, layouts[l].tb);
    double err = 0, mag = 0;
    for (size_t i = 0; i < nn; i++) {
        err = worse(err, fabs((double)c[i] - ref[i]));
        if (fabs(ref[i]) > mag) mag = fabs(ref[i]);
    }
    return mag > 0 ? err / mag : err;
}

/* Correctness at c->gemm_n; returns the worst relative error (NaN/-1 on
 * allocation failure) and names its layout in *worst. */
static double correctness(be_backend *be, const diag_config *c, int corrupt, uint64_t seed,
                          const char **worst) {
    int n = c->gemm_n;
    size_t nn = (size_t)n * n, es = be_dtype_size(be->act_dtype);
    float *a = malloc(nn * 4), *b = malloc(nn * 4), *cc = malloc(nn * 4);
    double *ref = malloc(nn * sizeof(double)), err = -1;
    uint16_t *tmp = malloc(nn * 2);
    void *da = be->alloc(be, nn * es), *db = be->alloc(be, nn * es), *dc = be->alloc(be, nn * es);
    if (!a || !b || !cc || !ref || !tmp || !da || !db || !dc) goto out;
    for (size_t i = 0; i < nn; i++) {
        a[i] = ms_rng_uniform(seed, 1, i) - 0.5f;
        b[i] = ms_rng_uniform(seed, 2, i) - 0.5f;
    }
    upload(be, da, a, tmp, nn);
    upload(be, db, b, tmp, nn);
    err = 0;
    for (int l = 0; l < (int)(sizeof layouts / sizeof layouts[0]); l++) {
        /* the injected fault's kind in the first layout (`corrupt && l == 0` passed 1: an
         * injected diag:nan was an element off by one, never a NaN) */
        double e = layout_error(be, da, db, dc, a, b, cc, ref, tmp, n, l, l == 0 ? corrupt : 0);
        /* (NaN != NaN: a later layout's finite error replaced the first one's NaN, and the
         * injected diag:nan said "max rel error 2.48e+01") */
        if (!isnan(err) && (isnan(e) || e > err)) err = e, *worst = layouts[l].name;
    }
out:
    if (da) be->free(be, da);
    if (db) be->free(be, db);
    if (dc) be->free(be, dc);
    free(a), free(b), free(cc), free(ref), free(tmp);
    return err;
}

/* Speed: GFLOP/s of a large product against the history; a correct and
 * fast enough result is appended to it. */
static void judge_speed(be_backend *be, const diag_config *c, const diag_report *rep,
                        diag_result *r) {
    int sn = c->gemm_speed_n ? c->gemm_speed_n : (be->act_dtype == BE_BF16 ? 8192 : 2048);
    double t0 = ms_now();
    r->value = mon_probe_peak_flops(be, sn, 2) / 1e9;
    /* diag:blip is the same here; the supervisor leaves it out of its
     * second measurement (a node slow for a moment) */
    const char *slow = diag_fault(c, "diag:slow", rep->rank)   ? "diag:slow"
                       : diag_fault(c, "diag:blip", rep->rank) ? "diag:blip"
                                                               : NULL;
    if (slow && r->value > 0) {
        /* injected: a device at a tenth of its speed (throttled, a bad
         * part), each product taking 10x as long: nine times the probe's
         * time more, counted in its rate (a tenth: far enough below any
         * --diag-slow-factor that a loaded test machine cannot blur it) */
        double took = ms_now() - t0;
        usleep((useconds_t)(9 * took * 1e6));
        r->value *= took / (ms_now() - t0);
    }
    if (!(r->value > 0)) {
        r->ok = 0;
        diag_detail(r, "speed: could not allocate the %d^3 product on %s", sn, be->name);
        return;
    }
    char blas[320], gemm[256], both[600];
    const char *kernels = NULL;
    if (!strcmp(be->name, "cpu")) {
        snprintf(both, sizeof both, "%s; %s", be_cpu_gemm_describe(gemm, sizeof gemm),
                 be_cpu_blas_describe(blas, sizeof blas));
        kernels = both;
    }
    diag_detail(r, "speed %.4g GFLOP/s at %d^3%s%s%s%s%s%s", r->value, sn, kernels ? " (" : "",
                kernels ? kernels : "", kernels ? ")" : "", slow ? " [injected fault " : "",
                slow ? slow : "", slow ? "]" : "");
    diag_hist_key k = {"gemm", "GFLOP/s", be->name, sn, ms_ctx_get()->local_rank};
    if (!diag_history_judge(c, &k, r)) diag_fail_slow(r);
    if (r->ok && c->history && *c->history &&
        diag_history_append(c->history, &k, r->value, rep->host) != MS_OK)
        ms_warn("diag: the gemm result was not added to the history: %s", ms_errmsg());
}

ms_status diag_check_gemm(const diag_config *c, const diag_report *rep, diag_result *r) {
    *r = (diag_result){.name = "gemm", .ok = 1, .unit = "GFLOP/s"};
    be_options bo = be_options_default();
    bo.threads = c->threads;
    be_backend *be = NULL;
    ms_status st = be_create(&be, c->device, &bo);
    if (st == MS_ERR_ARG) return st; /* a backend this program lacks: usage */
    if (st != MS_OK) {
        r->ok = 0;
        diag_detail(r, "cannot create the %s backend: %s", c->device, ms_errmsg());
        return MS_OK;
    }
    int bf16 = be->act_dtype == BE_BF16;
    int corrupt = diag_fault(c, "diag:gemm", rep->rank)  ? 1
                  : diag_fault(c, "diag:nan", rep->rank) ? 2
                                                         : 0;
    double tol = bf16 ? 2e-2 : 1e-4;
    uint64_t seed = (uint64_t)(ms_wall_now() * 1e6) ^ ((uint64_t)getpid() << 32);
    const char *worst = "NN";
    double err = correctness(be, c, corrupt, seed, &worst);
    if (err < 0) {
        r->ok = 0;
        diag_detail(r, "could not allocate the %d^3 correctness product", c->gemm_n);
    } else {
        int good = err <= tol;
        r->ok = good;
        diag_detail(r,
                    "%s: max rel error %.2e (%s, tolerance %.0e) over NN/NT/TN %d^3 on %s "
                    "(seed %llu)%s",
                    good ? "correct" : "WRONG RESULTS", err, bf16 ? "bf16" : "fp32", tol, c->gemm_n,
                    be->device_name[0] ? be->device_name : be->name, (unsigned long long)seed,
                    corrupt == 1   ? " [injected fault diag:gemm]"
                    : corrupt == 2 ? " [injected fault diag:nan]"
                                   : "");
        if (!good) diag_detail(r, "worst layout %s", worst);
    }
    judge_speed(be, c, rep, r);
    be_destroy(be);
    return MS_OK;
}
