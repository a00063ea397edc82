/* test_cpu_tp_ops.c - the CPU backend's ops for tensor parallelism against
 * the whole-vocabulary ops they split (test_cpu_ops.c checks those against
 * naive references): the vocabulary-slice embedding and classifier over a
 * partition of the vocabulary into slices (one of them empty) must give the
 * same outputs as embedding_fwd/bwd and classifier_fwd_bwd, losses bitwise
 * equal on every slice; plus bias_add and add_f32 against loops here.
 * Fresh random inputs, odd sizes, 2 and 3 threads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "check.h"

#define TOL 1e-5 /* max|got-ref| / max|ref| */

static be_backend *be;

static uint64_t rng_s = 0x2545F4914F6CDD1Dull;
static double urand(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * (1.0 / 9007199254740992.0);
}

/* n floats uniform in [-s, s] on the backend (callers free with be->free). */
static float *frnd(size_t n, float s) {
    float *x = be->alloc(be, (n ? n : 1) * sizeof(float));
    MS_CHECK(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((2.0 * urand() - 1.0) * s);
    return x;
}

/* Passes if max|got-ref| / max|ref| <= TOL; prints the worst element. */
static void check_near(const char *what, const float *got, const float *ref, size_t n) {
    double mref = 0.0, merr = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (isnan(e)) e = INFINITY;
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
        if (e > merr) merr = e, worst = i;
    }
    double r = merr / (mref > 0.0 ? mref : 1.0);
    if (!(r <= TOL))
        fprintf(stderr, "  %s: rel err %.3g at [%zu]: got %.9g, want %.9g\n", what, r, worst,
                (double)got[worst], (double)ref[worst]);
    T_OK(r <= TOL);
}

static void check_same(const char *what, const void *a, const void *b, size_t bytes) {
    int same = memcmp(a, b, bytes) == 0;
    if (!same) fprintf(stderr, "  %s: differs\n", what);
    T_OK(same);
}

/* Slices of [0,V): bounds lo[p]..lo[p+1]; slice 1 is empty when P > 2. */
static void make_slices(int V, int P, int *lo) {
    lo[0] = 0;
    for (int p = 1; p < P; p++)
        lo[p] = V * p / P;
    if (P > 2) lo[2] = lo[1];
    lo[P] = V;
}

static void test_embedding_slices(int P) {
    int B = 3, T = 5, C = 19, V = 41, Tmax = 7, N = B * T, lo[8];
    make_slices(V, P, lo);
    int32_t *tok = be->alloc(be, N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(urand() * V);
    tok[0] = 0, tok[1] = V - 1, tok[2] = tok[3] = lo[1];
    float *wte = frnd((size_t)V * C, 1), *wpe = frnd((size_t)Tmax * C, 1);
    float *ref = frnd((size_t)N * C, 1), *sum = frnd((size_t)N * C, 1), *part = frnd(N * C, 1);
    be->embedding_fwd(be, ref, tok, wte, wpe, B, T, C);
    for (int p = 0; p < P; p++) {
        be->embedding_slice_fwd(be, p ? part : sum, tok, wte + (size_t)lo[p] * C, p ? NULL : wpe, B,
                                T, C, lo[p], lo[p + 1] - lo[p]);
        if (p) be->residual_add(be, sum, sum, part, (size_t)N * C);
    }
    check_same("embedding slices sum to embedding_fwd", sum, ref, (size_t)N * C * sizeof(float));

    float *dout = frnd((size_t)N * C, 1), *dwte = frnd((size_t)V * C, 1);
    float *dwpe = frnd((size_t)Tmax * C, 1), *swte = be->alloc(be, (size_t)V * C * 4);
    float *swpe = be->alloc(be, (size_t)Tmax * C * 4);
    memcpy(swte, dwte, (size_t)V * C * 4);
    memcpy(swpe, dwpe, (size_t)Tmax * C * 4);
    be->embedding_bwd(be, dwte, dwpe, dout, tok, B, T, C);
    for (int p = 0; p < P; p++)
        be->embedding_slice_bwd(be, swte + (size_t)lo[p] * C, p ? NULL : swpe, dout, tok, B, T, C,
                                lo[p], lo[p + 1] - lo[p]);
    check_same("embedding slice dwte", swte, dwte, (size_t)V * C * 4);
    check_same("embedding slice dwpe", swpe, dwpe, (size_t)Tmax * C * 4);
    void *ps[] = {tok, wte, wpe, ref, sum, part, dout, dwte, dwpe, swte, swpe};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        be->free(be, ps[i]);
}

/* P slices of the classifier against classifier_fwd_bwd, in chunks of R rows. */
static void test_classifier_slices(int N, int C, int V, int P, int R) {
    int Vp = (V + 15) / 16 * 16, lo[8];
    make_slices(V, P, lo);
    be_limits lim = {1, N, C, 1, Vp, 0};
    T_EQ_INT(be->reserve(be, &lim), MS_OK);
    int32_t *tgt = be->alloc(be, N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tgt[i] = (int32_t)(urand() * V);
    tgt[0] = 0, tgt[N - 1] = V - 1;
    float *x = frnd((size_t)N * C, 2), *wte = frnd((size_t)Vp * C, 1), *loss = frnd(N, 1);
    float *dx = frnd((size_t)N * C, 1), *dwte = frnd((size_t)Vp * C, 1);
    float *sdwte = be->alloc(be, (size_t)Vp * C * 4), *sdx = frnd((size_t)N * C, 1);
    float *pdx = frnd((size_t)R * C, 1), *slos = frnd((size_t)P * N, 1), *flos = frnd(N, 1);
    float *logits = frnd((size_t)R * V * P, 1), *stats = frnd((size_t)P * R * 3, 1);
    memcpy(sdwte, dwte, (size_t)Vp * C * 4);
    be->classifier_fwd_bwd(be, loss, dx, dwte, x, wte, tgt, N, C, V, Vp, 0.37f);
    for (int r0 = 0; r0 < N; r0 += R) {
        int rb = N - r0 < R ? N - r0 : R;
        const float *xc = x + (size_t)r0 * C;
        for (int p = 0; p < P; p++) /* stats of every slice, gathered (P,rb,3) */
            be->classifier_slice_stats(be, stats + (size_t)p * rb * 3, logits + (size_t)p * R * V,
                                       xc, wte + (size_t)lo[p] * C, tgt + r0, rb, C,
                                       lo[p + 1] - lo[p], lo[p]);
        for (int p = 0; p < P; p++) {
            be->classifier_slice_finish(be, slos + (size_t)p * N + r0, pdx,
                                        sdwte + (size_t)lo[p] * C, logits + (size_t)p * R * V, xc,
                                        wte + (size_t)lo[p] * C, tgt + r0, stats, P, rb, C,
                                        lo[p + 1] - lo[p], lo[p], 0.37f);
            if (p == 0)
                memcpy(sdx + (size_t)r0 * C, pdx, (size_t)rb * C * 4);
            else
                be->residual_add(be, sdx + (size_t)r0 * C, sdx + (size_t)r0 * C, pdx,
                                 (size_t)rb * C);
        }
        be->classifier_slice_finish(be, flos + r0, NULL, NULL, logits, xc, wte, tgt + r0, stats, P,
                                    rb, C, lo[1], 0, 0.37f);
    }
    char name[96];
    snprintf(name, sizeof name, "classifier %d slices N%d V%d chunk %d: losses", P, N, V, R);
    check_near(name, slos, loss, N);
    for (int p = 1; p < P; p++)
        check_same("  losses equal on every slice", slos + (size_t)p * N, slos, N * 4);
    check_same("  losses without grad", flos, slos, N * 4);
    check_near("  dx (sum over slices)", sdx, dx, (size_t)N * C);
    check_near("  dwte", sdwte, dwte, (size_t)V * C);
    check_same("  padded dwte rows untouched", sdwte + (size_t)V * C, dwte + (size_t)V * C,
               (size_t)(Vp - V) * C * 4);
    void *ps[] = {tgt, x, wte, loss, dx, dwte, sdwte, sdx, pdx, slos, flos, logits, stats};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        be->free(be, ps[i]);
}

/* A NaN logit in the second of two slices (a NaN row of its wte): every row's loss is NaN, as
 * classifier_fwd_bwd's.  The slice's sum was skipped as an empty slice's: the loss was the first
 * slice's alone, finite and wrong (one slice: -inf). */
static void test_classifier_slice_nan(int P) {
    int N = 3, C = 4, V = 8, lo[8];
    make_slices(V, P, lo);
    float *x = frnd((size_t)N * C, 1), *wte = frnd((size_t)V * C, 1);
    float *logits = frnd((size_t)N * V, 1), *stats = frnd((size_t)P * N * 3, 1);
    float *loss = frnd(N, 1);
    int32_t *tgt = be->alloc(be, N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tgt[i] = 0; /* in the first slice */
    for (int c = 0; c < C; c++)
        wte[(size_t)(V - 1) * C + c] = NAN; /* the last slice's last row */
    for (int p = 0; p < P; p++)
        be->classifier_slice_stats(be, stats + (size_t)p * N * 3, logits + (size_t)lo[p] * N, x,
                                   wte + (size_t)lo[p] * C, tgt, N, C, lo[p + 1] - lo[p], lo[p]);
    be->classifier_slice_finish(be, loss, NULL, NULL, logits, x, wte, tgt, stats, P, N, C, lo[1], 0,
                                1.0f);
    int all_nan = 1;
    for (int i = 0; i < N; i++)
        all_nan &= isnan(loss[i]);
    char name[64];
    snprintf(name, sizeof name, "classifier %d slice(s): a NaN logit gives a NaN loss", P);
    T_OK(all_nan);
    if (!all_nan) fprintf(stderr, "%s: got %g %g %g\n", name, loss[0], loss[1], loss[2]);
    void *ps[] = {x, wte, logits, stats, loss, tgt};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        be->free(be, ps[i]);
}

static void test_adds(void) {
    int M = 7, N = 37;
    size_t n = (size_t)M * N;
    float *o = frnd(n, 1), *b = frnd(N, 1), *ref = be->alloc(be, n * 4), *y = frnd(n, 1);
    for (size_t i = 0; i < n; i++)
        ref[i] = o[i] + b[i % N];
    be->bias_add(be, o, b, M, N);
    check_same("bias_add", o, ref, n * 4);
    for (size_t i = 0; i < n; i++)
        ref[i] = y[i] + o[i];
    be->add_f32(be, y, o, n);
    check_same("add_f32", y, ref, n * 4);
    void *ps[] = {o, b, ref, y};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        be->free(be, ps[i]);
}

int main(void) {
    for (int threads = 2; threads <= 3; threads++) {
        MS_CHECK(be_cpu_create(&be, threads) == MS_OK);
        test_embedding_slices(2);
        test_embedding_slices(3);
        test_classifier_slices(11, 12, 37, 1, 11);
        test_classifier_slices(11, 12, 37, 2, 4);
        test_classifier_slices(23, 20, 300, 3, 8);
        test_classifier_slice_nan(1);
        test_classifier_slice_nan(2);
        test_adds();
        be_destroy(be);
    }
    return ms_test_summary("test_cpu_tp_ops");
}
