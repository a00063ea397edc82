/* test_cpu_ops.c - every op of the CPU backend on fresh random inputs with
 * odd sizes: forward ops against naive double-precision loops written here,
 * backward ops against central finite differences (in double) of a scalar
 * loss sum(out * random weights), plus windows, chunking, accumulate vs
 * overwrite semantics, optimiser steps against a scalar reference, and
 * bitwise determinism (each op run twice). */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "check.h"

#define FWD_TOL 2e-6 /* max|ours-ref| / max|ref| for forward ops */
#define BWD_TOL 1e-5 /* same, for gradients (float accumulation) */

static be_backend *be;
static int verbose;

/* ---- small helpers: random numbers, temporaries, comparisons ---- */

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * (1.0 / 9007199254740992.0);
}

static void *tmps[256];
static int ntmp;
static void *tmp(size_t bytes) {
    MS_CHECK(ntmp < 256);
    void *p = be->alloc(be, bytes ? bytes : 1);
    MS_CHECK(p != NULL);
    return tmps[ntmp++] = p;
}
static void tmp_free_all(void) {
    while (ntmp)
        be->free(be, tmps[--ntmp]);
}

/* n floats uniform in [-s, s] */
static float *frnd(size_t n, float s) {
    float *x = tmp(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((2.0 * urand() - 1.0) * s);
    return x;
}
static float *fcopy(const float *x, size_t n) {
    float *y = tmp(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}
static double *dcopy(const float *x, size_t n) {
    double *y = tmp(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}
static double *dzeros(size_t n) {
    return tmp(n * sizeof(double));
}

/* Passes if max|got-ref| / max|ref| <= rtol; prints the worst element. */
static void check_arr(const char *what, const float *got, const double *ref, size_t n,
                      double rtol) {
    double mref = 0.0, merr = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (isnan(e)) e = INFINITY;
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
        if (e > merr) {
            merr = e;
            worst = i;
        }
    }
    double r = merr / (mref > 0.0 ? mref : 1.0);
    if (verbose) printf("  %-34s rel err %.3g\n", what, r);
    if (!(r <= rtol))
        fprintf(stderr, "  %s: rel err %.3g > %.3g at [%zu]: got %.9g, want %.9g (max|ref| %.3g)\n",
                what, r, rtol, worst, (double)got[worst], ref[worst], mref);
    T_OK(r <= rtol);
}

/* Central finite differences of f(ctx) w.r.t. x[0..n) into g. */
typedef double (*loss_fn)(void *ctx);
static void fd_grad(loss_fn f, void *ctx, double *x, size_t n, double *g) {
    const double h = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double s = x[i];
        x[i] = s + h;
        double lp = f(ctx);
        x[i] = s - h;
        double lm = f(ctx);
        x[i] = s;
        g[i] = (lp - lm) / (2 * h);
    }
}

static double dot_d(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Runs op twice on identical copies of its outputs and compares bitwise. */
static void check_same(const char *what, const void *a, const void *b, size_t bytes) {
    int same = memcmp(a, b, bytes) == 0;
    if (!same) fprintf(stderr, "  %s: two runs differ\n", what);
    T_OK(same);
}

static void reserve(int B, int T, int C, int NH, int Vp) {
    be_limits lim = {B, T, C, NH, Vp, 0};
    T_EQ_INT(be->reserve(be, &lim), MS_OK);
}

/* ---- creation and memory ---- */

static void test_create(void) {
    be_backend *b = NULL;
    be_options bo = be_options_default();
    T_OK(bo.threads == 0 && !bo.cuda_profile && bo.cuda_fuse_gelu == 1 && !bo.cpu_profile);
    T_EQ_INT(be_create(&b, "tpu", &bo), MS_ERR_ARG);
    T_OK(b == NULL);
    T_STR_CONTAINS(ms_errmsg(), "cpu");
    bo.threads = 2;
    T_EQ_INT(be_create(&b, "cpu", &bo), MS_OK);
    T_OK(b && b->threads == 2);
    be_destroy(b);
    T_EQ_INT(be_create(&b, "cpu", NULL), MS_OK); /* NULL: the defaults (all cores) */
    T_OK(b && b->threads >= 1 && b->act_dtype == BE_F32 && strcmp(b->name, "cpu") == 0);
    char *p = b->alloc(b, 1000);
    int zero = 1;
    for (int i = 0; i < 1000; i++)
        zero &= p[i] == 0;
    T_OK(zero && ((uintptr_t)p & 63) == 0);
    b->free(b, p);
    /* zero: one thread below 4 MB, the threads' slices above; every byte of
     * an odd length, none past it */
    size_t lens[] = {1000, ((size_t)4 << 20) + 37, ((size_t)9 << 20) + 64 * 3 + 5};
    for (int k = 0; k < 3; k++) {
        unsigned char *q = b->alloc(b, lens[k] + 64);
        memset(q, 0xAB, lens[k] + 64);
        b->zero(b, q + 1, lens[k]);
        int good = q[0] == 0xAB && q[lens[k] + 1] == 0xAB;
        for (size_t i = 1; i <= lens[k]; i++)
            good &= q[i] == 0;
        T_OK(good);
        b->free(b, q);
    }
    be_limits small = {1, 8, 16, 2, 64, 10}, big = {2, 100, 64, 4, 512, 10};
    T_EQ_INT(b->reserve(b, &small), MS_OK);
    T_EQ_INT(b->reserve(b, &big), MS_OK);
    T_EQ_INT(b->reserve(b, &small), MS_OK);
    T_OK(cpu_ctx_of(b)->att_T == 100 && cpu_ctx_of(b)->part_C == 64);
    be_destroy(b);
}

static void test_expf(void) {
    double worst = 0.0;
    for (int i = 0; i <= 200000; i++) {
        float x = (float)(-87.0 + 175.0 * i / 200000.0);
        double e = fabs((double)cpu_expf(x) / exp((double)x) - 1.0);
        if (e > worst) worst = e;
    }
    if (verbose) printf("  cpu_expf max rel err %.3g\n", worst);
    T_NEAR(worst, 0.0, 3e-7);
    /* issue 13: NaN in, NaN out, and no undefined behaviour on the way (the
     * exponent of a NaN was converted to int and shifted: UBSan's abort) */
    volatile float nan = NAN;
    T_OK(isnan(cpu_expf(nan)));
    T_OK(cpu_expf(INFINITY) > 1e38f && cpu_expf(-INFINITY) < 1e-37f);
}

/* ---- embedding ---- */

static void test_embedding(void) {
    int B = 2, T = 7, C = 12, V = 37, Tmax = 9, N = B * T;
    int32_t *tok = tmp(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(urand() * V);
    tok[3] = tok[5] = tok[9] = tok[13] = 36; /* repeats, last id */
    tok[0] = 0;
    float *wte = frnd((size_t)V * C, 1), *wpe = frnd((size_t)Tmax * C, 1), *out = frnd(N * C, 1);
    be->embedding_fwd(be, out, tok, wte, wpe, B, T, C);
    double *ref = dzeros(N * C);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++)
            ref[r * C + c] = (double)wte[tok[r] * C + c] + wpe[r % T * C + c];
    check_arr("embedding_fwd out", out, ref, N * C, FWD_TOL);

    float *dout = frnd(N * C, 1), *dwte = frnd((size_t)V * C, 1), *dwpe = frnd((size_t)Tmax * C, 1);
    double *rte = dcopy(dwte, (size_t)V * C), *rpe = dcopy(dwpe, (size_t)Tmax * C);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            rte[tok[r] * C + c] += dout[r * C + c];
            rpe[r % T * C + c] += dout[r * C + c];
        }
    float *dwte2 = fcopy(dwte, (size_t)V * C), *dwpe2 = fcopy(dwpe, (size_t)Tmax * C);
    be->embedding_bwd(be, dwte, dwpe, dout, tok, B, T, C);
    check_arr("embedding_bwd dwte +=", dwte, rte, (size_t)V * C, FWD_TOL);
    check_arr("embedding_bwd dwpe +=", dwpe, rpe, (size_t)Tmax * C, FWD_TOL);
    be->embedding_bwd(be, dwte2, dwpe2, dout, tok, B, T, C);
    check_same("embedding_bwd", dwte, dwte2, (size_t)V * C * sizeof(float));
    tmp_free_all();
}

/* ---- layernorm ---- */

typedef struct {
    int N, C;
    double *x, *w, *b, *wgt; /* inputs and loss weights */
    double *out, *mean, *rstd;
} ln_ref;

static double ln_forward(void *p) {
    ln_ref *r = p;
    double L = 0.0;
    for (int i = 0; i < r->N; i++) {
        const double *x = r->x + (size_t)i * r->C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < r->C; c++)
            m += x[c];
        m /= r->C;
        for (int c = 0; c < r->C; c++)
            v += (x[c] - m) * (x[c] - m);
        double s = 1.0 / sqrt(v / r->C + 1e-5);
        r->mean[i] = m;
        r->rstd[i] = s;
        for (int c = 0; c < r->C; c++) {
            double y = (x[c] - m) * s * r->w[c] + r->b[c];
            r->out[(size_t)i * r->C + c] = y;
            L += y * r->wgt[(size_t)i * r->C + c];
        }
    }
    return L;
}

static void test_layernorm_case(int N, int C) {
    reserve(1, 1, C, 1, 0);
    float *x = frnd((size_t)N * C, 2), *w = frnd(C, 1), *b = frnd(C, 1);
    for (int i = 0; i < N * C; i++)
        x[i] += (float)(i / C % 5 - 2); /* row means in [-2,2] */
    float *out = frnd((size_t)N * C, 1), *mean = frnd(N, 1), *rstd = frnd(N, 1);
    be->layernorm_fwd(be, out, mean, rstd, x, w, b, N, C);
    ln_ref r = {N,         C,        dcopy(x, N * C), dcopy(w, C), dcopy(b, C), NULL, dzeros(N * C),
                dzeros(N), dzeros(N)};
    float *wgt = frnd((size_t)N * C, 1);
    r.wgt = dcopy(wgt, N * C);
    ln_forward(&r);
    check_arr("layernorm_fwd out", out, r.out, N * C, FWD_TOL);
    check_arr("layernorm_fwd mean", mean, r.mean, N, FWD_TOL);
    check_arr("layernorm_fwd rstd", rstd, r.rstd, N, FWD_TOL);

    /* backward: dout = wgt; gradients accumulate into random initial values */
    float *dx = frnd((size_t)N * C, 1), *dw = frnd(C, 1), *db = frnd(C, 1);
    float *dx2 = fcopy(dx, N * C), *dw2 = fcopy(dw, C), *db2 = fcopy(db, C);
    double *gx = dzeros(N * C), *gw = dzeros(C), *gb = dzeros(C);
    fd_grad(ln_forward, &r, r.x, N * C, gx);
    fd_grad(ln_forward, &r, r.w, C, gw);
    fd_grad(ln_forward, &r, r.b, C, gb);
    for (int i = 0; i < N * C; i++)
        gx[i] += dx[i];
    for (int c = 0; c < C; c++)
        gw[c] += dw[c], gb[c] += db[c];
    be->layernorm_bwd(be, dx, dw, db, wgt, x, w, mean, rstd, N, C);
    check_arr("layernorm_bwd dinp +=", dx, gx, N * C, BWD_TOL);
    check_arr("layernorm_bwd dw +=", dw, gw, C, BWD_TOL);
    check_arr("layernorm_bwd db +=", db, gb, C, BWD_TOL);
    be->layernorm_bwd(be, dx2, dw2, db2, wgt, x, w, mean, rstd, N, C);
    check_same("layernorm_bwd dinp", dx, dx2, (size_t)N * C * sizeof(float));
    check_same("layernorm_bwd dw", dw, dw2, C * sizeof(float));
    check_same("layernorm_bwd db", db, db2, C * sizeof(float));
    tmp_free_all();
}

/* ---- gemm and bias_bwd ---- */

/* 0.5 x (1 + tanh u) written as x / (1 + exp(-2u)), exact in double also
 * where 1 + tanh u underflows. */
static double gelu_d(double x) {
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}

static void test_gemm_case(int ta, int tb, int bias, int gelu) {
    int M = 7, N = 12, K = 5, lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
    float alpha = gelu ? 1.0f : 0.7f, beta = gelu ? 0.0f : 0.3f;
    float *A = frnd((size_t)(ta ? K : M) * lda, 1), *Bm = frnd((size_t)(tb ? N : K) * ldb, 1);
    float *Cm = frnd((size_t)M * ldc, 1), *bs = bias ? frnd(N, 1) : NULL;
    float *pre = gelu ? frnd((size_t)M * ldc, 1) : NULL;
    double *rc = dcopy(Cm, (size_t)M * ldc), *rp = gelu ? dcopy(pre, (size_t)M * ldc) : NULL;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                     (tb ? Bm[j * ldb + k] : Bm[k * ldb + j]);
            s = alpha * s + beta * rc[i * ldc + j] + (bs ? bs[j] : 0.0);
            if (gelu) rp[i * ldc + j] = s;
            rc[i * ldc + j] = gelu ? gelu_d(s) : s;
        }
    be->gemm(be, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc, 0, bs,
             gelu ? BE_EPI_GELU : BE_EPI_NONE, pre);
    char name[64];
    snprintf(name, sizeof name, "gemm ta=%d tb=%d bias=%d gelu=%d", ta, tb, bias, gelu);
    check_arr(name, Cm, rc, (size_t)M * ldc, FWD_TOL);
    if (gelu) check_arr("gemm gelu pre", pre, rp, (size_t)M * ldc, FWD_TOL);
    tmp_free_all();
}

static void test_gemm(void) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bias = 0; bias < 2; bias++)
                test_gemm_case(ta, tb, bias, 0);
    test_gemm_case(0, 0, 1, 1);
    test_gemm_case(1, 1, 0, 1);
    int Ms[] = {7, 33}, Ns[] = {12, 70, 130};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            int M = Ms[a], N = Ns[b];
            float *d = frnd((size_t)M * N, 1), *db = frnd(N, 1), *db2 = fcopy(db, N);
            double *r = dcopy(db, N);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++)
                    r[j] += d[i * N + j];
            be->bias_bwd(be, db, d, M, N);
            check_arr("bias_bwd +=", db, r, N, FWD_TOL);
            be->bias_bwd(be, db2, d, M, N);
            check_same("bias_bwd", db, db2, N * sizeof(float));
            tmp_free_all();
        }
}

/* ---- gelu, residual ---- */

static void test_elementwise(void) {
    size_t n = 1001;
    float *x = frnd(n, 6), *y = frnd(n, 1), *dy = frnd(n, 1), *dx = frnd(n, 1);
    x[0] = 0.0f, x[1] = 10.0f, x[2] = -10.0f, x[3] = -0.75f, x[4] = 30.0f, x[5] = -30.0f;
    double *ry = dzeros(n), *rdx = dzeros(n);
    for (size_t i = 0; i < n; i++) {
        double h = 1e-6;
        ry[i] = gelu_d(x[i]);
        rdx[i] = (gelu_d(x[i] + h) - gelu_d(x[i] - h)) / (2 * h) * dy[i];
    }
    be->gelu_fwd(be, y, x, n);
    check_arr("gelu_fwd", y, ry, n, FWD_TOL);
    be->gelu_bwd(be, dx, x, dy, n);
    check_arr("gelu_bwd", dx, rdx, n, FWD_TOL);
    be->gelu_bwd(be, dy, x, dy, n); /* in place */
    check_arr("gelu_bwd in place", dy, rdx, n, FWD_TOL);
    /* relative accuracy where gelu is small but not negligible; the
     * argument of exp, 2u, carries a float rounding error of ~|2u| eps */
    int tiny_ok = 1;
    for (int i = -400; i <= 400; i++) {
        float t = (float)(i * 0.02), g;
        be->gelu_fwd(be, &g, &t, 1);
        double r = gelu_d(t), u2 = 2.0 * sqrt(2.0 / M_PI) * (t + 0.044715 * t * t * t);
        if (fabs(g - r) > 3e-7 * (2.0 + fabs(u2)) * fabs(r)) {
            if (tiny_ok) fprintf(stderr, "  gelu(%g) = %.9g, want %.9g\n", t, g, r);
            tiny_ok = 0;
        }
    }
    T_OK(tiny_ok);

    /* special values, in a vector long enough for the vectorised loop: a
     * NaN gives NaN both ways (exp's argument is clamped, x carries it);
     * past the clamp at |2u| = 80, gelu(x) is x or ~0 and its slope 1 or ~0;
     * every finite x gives finite results */
    float sx[64], sy[64], sd[64], one[64];
    for (int i = 0; i < 64; i++)
        sx[i] = (float)(i % 8) - 3.5f, one[i] = 1.0f;
    sx[3] = NAN, sx[21] = NAN, sx[60] = 40.0f, sx[61] = -40.0f, sx[62] = 9.0f, sx[63] = -9.0f;
    /* far past the clamp: the limits (the clamped exp left gelu(-1e36) = -18, and slopes of
     * -3.86 at -1e12, 4.86 at +1e12, inf at 1e20) */
    sx[56] = -1e36f, sx[57] = -1e12f, sx[58] = 1e12f, sx[59] = 1e20f;
    be->gelu_fwd(be, sy, sx, 64);
    be->gelu_bwd(be, sd, sx, one, 64);
    T_OK(isnan(sy[3]) && isnan(sd[3]) && isnan(sy[21]) && isnan(sd[21]));
    T_OK(sy[60] == 40.0f && fabsf(sy[61]) < 1e-30f && sd[60] == 1.0f && fabsf(sd[61]) < 1e-30f);
    T_OK(sy[56] == 0.0f && sy[57] == 0.0f && sy[58] == 1e12f && sy[59] == 1e20f);
    T_OK(sd[56] == 0.0f && sd[57] == 0.0f && sd[58] == 1.0f && sd[59] == 1.0f);
    int finite_ok = 1;
    for (int i = 0; i < 64; i++)
        if (i != 3 && i != 21 && (!isfinite(sy[i]) || !isfinite(sd[i]))) finite_ok = 0;
    T_OK(finite_ok);

    /* GeLU calls exp's core without its clamps (its own clamp makes them
     * no-ops): the same bits as the formula through the general cpu_expf,
     * over a sweep of float bit patterns (every sign, exponent, and a
     * spread of mantissas), through the vectorised ops */
    size_t ns = 1 << 20;
    float *gx = frnd(ns, 1), *gy = frnd(ns, 1), *gd = frnd(ns, 1), *g1 = frnd(ns, 1);
    for (size_t i = 0; i < ns; i++) {
        uint32_t u = (uint32_t)(i * 4099u);
        memcpy(&gx[i], &u, sizeof u);
        g1[i] = 1.0f;
    }
    be->gelu_fwd(be, gy, gx, ns);
    be->gelu_bwd(be, gd, gx, g1, ns);
    size_t differ = 0;
    for (size_t i = 0; i < ns; i++) {
        float x = gx[i], u2r = 2.0f * CPU_GELU_K * (x + CPU_GELU_A * x * x * x);
        float u2 = u2r < -80.0f ? -80.0f : (u2r > 80.0f ? 80.0f : u2r);
        float e = cpu_expf(-u2), s = 1.0f / (1.0f + e);
        float y = x / (1.0f + e);
        float d = s + 2.0f * x * s * (e * s) * (CPU_GELU_K * (1.0f + 3.0f * CPU_GELU_A * x * x));
        if (u2r > 80.0f) d = 1.0f; /* past the clamp, the limits */
        if (!(u2r >= -80.0f)) y = d = x * 0.0f;
        int same_y = isnan(y) ? isnan(gy[i]) : memcmp(&y, &gy[i], sizeof y) == 0;
        int same_d = isnan(d) ? isnan(gd[i]) : memcmp(&d, &gd[i], sizeof d) == 0;
        if ((!same_y || !same_d) && differ++ == 0)
            fprintf(stderr, "  gelu(%a): %a / %a, the cpu_expf formula %a / %a\n", x, gy[i], gd[i],
                    y, d);
    }
    T_EQ_INT((int)differ, 0);

    float *a = frnd(n, 1), *b = frnd(n, 1), *o = frnd(n, 1);
    double *ro = dzeros(n);
    for (size_t i = 0; i < n; i++)
        ro[i] = (double)a[i] + b[i];
    be->residual_add(be, o, a, b, n);
    check_arr("residual_add", o, ro, n, FWD_TOL);
    be->residual_add(be, a, a, b, n);
    check_arr("residual_add out=a", a, ro, n, FWD_TOL);
    float *b2 = fcopy(b, n), *a2 = fcopy(o, n); /* a2 = old a + b; b2 = b */
    for (size_t i = 0; i < n; i++)
        ro[i] = (double)a2[i] + b2[i];
    be->residual_add(be, b2, a2, b2, n);
    check_arr("residual_add out=b", b2, ro, n, FWD_TOL);
    tmp_free_all();
}

/* ---- attention ---- */

typedef struct {
    int B, T, C, NH, W;
    double *qkv, *wgt, *out, *P;
} att_ref;

static int att_lo(int t, int W) {
    return W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
}

/* Naive attention in double; returns sum(out * wgt). */
static double att_forward(void *p) {
    att_ref *r = p;
    int T = r->T, C = r->C, hs = C / r->NH;
    double scale = 1.0 / sqrt((double)hs), L = 0.0;
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < r->NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = r->qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double *pr = r->P + (((size_t)b * r->NH + h) * T + t) * T, m = -INFINITY, sum = 0;
                int lo = att_lo(t, r->W);
                for (int j = 0; j < T; j++)
                    pr[j] = 0.0;
                for (int j = lo; j <= t; j++) {
                    pr[j] = dot_d(q, q + (j - t) * 3 * C + C, hs) * scale;
                    m = pr[j] > m ? pr[j] : m;
                }
                for (int j = lo; j <= t; j++)
                    sum += pr[j] = exp(pr[j] - m);
                for (int j = lo; j <= t; j++)
                    pr[j] /= sum;
                for (int d = 0; d < hs; d++) {
                    double o = 0.0;
                    for (int j = lo; j <= t; j++)
                        o += pr[j] * q[(j - t) * 3 * C + 2 * C + d];
                    size_t oi = ((size_t)b * T + t) * C + h * hs + d;
                    r->out[oi] = o;
                    L += o * r->wgt[oi];
                }
            }
    return L;
}

/* Naive analytic backward of att_forward (run it first) with dout = wgt. */
static void att_backward(const att_ref *r, double *dqkv) {
    int T = r->T, C = r->C, hs = C / r->NH;
    double scale = 1.0 / sqrt((double)hs), dp[512];
    MS_CHECK(T <= 512);
    memset(dqkv, 0, (size_t)r->B * T * 3 * C * sizeof(double));
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < r->NH; h++)
            for (int t = 0; t < T; t++) {
                size_t qi = ((size_t)b * T + t) * 3 * C + h * hs;
                const double *q = r->qkv + qi, *dout = r->wgt + ((size_t)b * T + t) * C + h * hs;
                const double *pr = r->P + (((size_t)b * r->NH + h) * T + t) * T;
                double dot = 0.0;
                int lo = att_lo(t, r->W);
                for (int j = lo; j <= t; j++) {
                    dp[j] = dot_d(dout, q + (j - t) * 3 * C + 2 * C, hs);
                    dot += dp[j] * pr[j];
                }
                for (int j = lo; j <= t; j++) {
                    double ds = pr[j] * (dp[j] - dot) * scale;
                    size_t kj = qi + (size_t)(j - t) * 3 * C + C;
                    for (int d = 0; d < hs; d++) {
                        dqkv[qi + d] += ds * r->qkv[kj + d];
                        dqkv[kj + d] += ds * q[d];
                        dqkv[kj + C + d] += pr[j] * dout[d];
                    }
                }
            }
}

/* fd: also validate the naive backward against finite differences. */
static void test_attention_case(int B, int T, int C, int NH, int W, int fd) {
    reserve(B, T, C, NH, 0);
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, np = (size_t)B * NH * T * T;
    T_EQ_INT(be->attention_state_bytes(be, B, T, NH), np * sizeof(float));
    float *qkv = frnd(nq, 2), *out = frnd(no, 1), *P = frnd(np, 1), *dout = frnd(no, 1);
    att_ref r = {B, T, C, NH, W, dcopy(qkv, nq), dcopy(dout, no), dzeros(no), dzeros(np)};
    att_forward(&r);
    be->attention_fwd(be, out, P, qkv, B, T, C, NH, W);
    char name[96];
    snprintf(name, sizeof name, "attention B%d T%d C%d NH%d W%d", B, T, C, NH, W);
    check_arr(name, out, r.out, no, FWD_TOL);
    check_arr("  state P", P, r.P, np, FWD_TOL);
    int masked_zero = 1;
    for (size_t i = 0; i < np; i++) {
        int t = (int)(i / T % T), j = (int)(i % T);
        if ((j > t || j < att_lo(t, W)) && P[i] != 0.0f) masked_zero = 0;
    }
    T_OK(masked_zero);

    double *g = dzeros(nq);
    att_backward(&r, g);
    if (fd) {
        double *gfd = dzeros(nq), e = 0.0, m = 0.0;
        fd_grad(att_forward, &r, r.qkv, nq, gfd);
        for (size_t i = 0; i < nq; i++) {
            e = fmax(e, fabs(gfd[i] - g[i]));
            m = fmax(m, fabs(gfd[i]));
        }
        T_NEAR(e / m, 0.0, 1e-7); /* the naive backward is the true gradient */
    }
    float *dqkv = frnd(nq, 1), *dqkv2 = frnd(nq, 1), *out2 = frnd(no, 1), *P2 = frnd(np, 1);
    be->attention_bwd(be, dqkv, dout, out, qkv, P, B, T, C, NH, W);
    check_arr("  attention_bwd dqkv =", dqkv, g, nq, BWD_TOL);
    be->attention_fwd(be, out2, P2, qkv, B, T, C, NH, W);
    be->attention_bwd(be, dqkv2, dout, out2, qkv, P2, B, T, C, NH, W);
    check_same("attention_fwd out", out, out2, no * sizeof(float));
    check_same("attention_fwd P", P, P2, np * sizeof(float));
    check_same("attention_bwd", dqkv, dqkv2, nq * sizeof(float));
    tmp_free_all();
}

static void test_attention(void) {
    int Ws[] = {0, 1, 3, 7, 10};
    for (int i = 0; i < 5; i++)
        test_attention_case(2, 7, 12, 3, Ws[i], 1);
    int Wl[] = {0, 1, 3, 64, 70, 150, 200};
    for (int i = 0; i < 7; i++)
        test_attention_case(1, 150, 24, 2, Wl[i], 0);
    test_attention_case(2, 130, 32, 4, 0, 0);
}

/* ---- classifier ---- */

typedef struct {
    int N, C, V;
    double *x, *wte, dloss, *loss, *dlog; /* dlog (N,V) = dloss (softmax - onehot) */
    const int32_t *tgt;
} cls_ref;

/* Naive logits, losses and dlogits in double; returns dloss * sum(losses). */
static double cls_forward(void *p) {
    cls_ref *r = p;
    double L = 0.0;
    for (int i = 0; i < r->N; i++) {
        double *l = r->dlog + (size_t)i * r->V, m = -INFINITY, s = 0.0;
        for (int j = 0; j < r->V; j++) {
            l[j] = dot_d(r->x + (size_t)i * r->C, r->wte + (size_t)j * r->C, r->C);
            m = l[j] > m ? l[j] : m;
        }
        for (int j = 0; j < r->V; j++)
            s += exp(l[j] - m);
        r->loss[i] = m + log(s) - l[r->tgt[i]];
        L += r->dloss * r->loss[i];
        for (int j = 0; j < r->V; j++)
            l[j] = r->dloss * (exp(l[j] - m) / s - (j == r->tgt[i]));
    }
    return L;
}

/* fd: gradients by finite differences, else from the naive dlogits. */
static void test_classifier_case(int N, int C, int V, int Vp, int chunk, int fd) {
    reserve(1, N, C, 1, Vp);
    cpu_set_cls_chunk_rows(be, chunk);
    int32_t *tgt = tmp(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tgt[i] = (int32_t)(urand() * V);
    tgt[0] = 0, tgt[N - 1] = V - 1;
    float *x = frnd((size_t)N * C, 1), *wte = frnd((size_t)Vp * C, 1), *loss = frnd(N, 1);
    float *dx = frnd((size_t)N * C, 1), *dwte = frnd((size_t)Vp * C, 1);
    float *dwte0 = fcopy(dwte, (size_t)Vp * C), *dwte2 = fcopy(dwte, (size_t)Vp * C);
    float *loss2 = frnd(N, 1), *dx2 = frnd((size_t)N * C, 1), *loss3 = frnd(N, 1);
    cls_ref r = {N,
                 C,
                 V,
                 dcopy(x, N * C),
                 dcopy(wte, (size_t)V * C),
                 0.37,
                 dzeros(N),
                 dzeros((size_t)N * V),
                 tgt};
    double *gx = dzeros((size_t)N * C), *gw = dzeros((size_t)V * C);
    cls_forward(&r);
    if (fd) {
        fd_grad(cls_forward, &r, r.x, (size_t)N * C, gx);
        fd_grad(cls_forward, &r, r.wte, (size_t)V * C, gw);
    } else {
        for (int i = 0; i < N; i++)
            for (int j = 0; j < V; j++)
                for (int c = 0; c < C; c++) {
                    double d = r.dlog[(size_t)i * V + j];
                    gx[(size_t)i * C + c] += d * r.wte[(size_t)j * C + c];
                    gw[(size_t)j * C + c] += d * r.x[(size_t)i * C + c];
                }
    }
    for (size_t i = 0; i < (size_t)V * C; i++)
        gw[i] += dwte[i];
    be->classifier_fwd_bwd(be, loss, dx, dwte, x, wte, tgt, N, C, V, Vp, 0.37f);
    char name[96];
    snprintf(name, sizeof name, "classifier N%d C%d V%d chunk %d", N, C, V, chunk);
    check_arr(name, loss, r.loss, N, FWD_TOL);
    check_arr("  classifier dx =", dx, gx, (size_t)N * C, BWD_TOL);
    check_arr("  classifier dwte +=", dwte, gw, (size_t)V * C, BWD_TOL);
    check_same("classifier padded dwte rows untouched", dwte + (size_t)V * C, dwte0 + (size_t)V * C,
               (size_t)(Vp - V) * C * sizeof(float));
    be->classifier_fwd_bwd(be, loss2, dx2, dwte2, x, wte, tgt, N, C, V, Vp, 0.37f);
    check_same("classifier losses", loss, loss2, N * sizeof(float));
    check_same("classifier dx", dx, dx2, (size_t)N * C * sizeof(float));
    check_same("classifier dwte", dwte, dwte2, (size_t)Vp * C * sizeof(float));
    be->classifier_fwd_bwd(be, loss3, NULL, NULL, x, wte, tgt, N, C, V, Vp, 0.37f);
    check_same("classifier losses without grad", loss, loss3, N * sizeof(float));
    cpu_set_cls_chunk_rows(be, 0);
    tmp_free_all();
}

/* One row of the fused classifier (cpu_cls_row), with the next row asked
 * into the cache or not: the same bits, and the loss and dlogits of a
 * double-precision softmax.  Rows of 16k + r logits: the 16-wide blocks
 * and the tail. */
static void test_cls_row(void) {
    static const int Vs[] = {1, 15, 16, 37, 50257};
    for (size_t c = 0; c < sizeof Vs / sizeof *Vs; c++) {
        int V = Vs[c], tgt = V / 3;
        float *l = frnd(2 * (size_t)V, 6.0f), *a = fcopy(l, V), *b = fcopy(l, V);
        float la = cpu_cls_row(a, V, tgt, 1, 0.25f, NULL);
        float lb = cpu_cls_row(b, V, tgt, 1, 0.25f, l + V);
        check_same("cls_row: the next row asked for or not", a, b, (size_t)V * sizeof(float));
        T_OK(la == lb);
        double m = l[0], z = 0.0;
        for (int j = 1; j < V; j++)
            m = l[j] > m ? l[j] : m;
        for (int j = 0; j < V; j++)
            z += exp((double)l[j] - m);
        T_NEAR(la, m + log(z) - l[tgt], 1e-5 * (1.0 + fabs(m)));
        double worst = 0.0;
        for (int j = 0; j < V; j++) {
            double ref = 0.25 * (exp((double)l[j] - m) / z - (j == tgt));
            double err = fabs((double)a[j] - ref);
            worst = err > worst ? err : worst;
        }
        T_NEAR(worst, 0.0, 1e-6);
    }
    tmp_free_all();
}

static void test_classifier(void) {
    test_cls_row();
    test_classifier_case(11, 12, 37, 48, 4, 1);
    test_classifier_case(11, 12, 37, 37, 0, 1);
    test_classifier_case(50, 20, 300, 320, 16, 0);
}

/* ---- optimisers ---- */

/* The update left +0.0 in every element of its gradient. */
static void check_zeroed(const char *what, const float *g, size_t n) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (g[i] != 0.0f || signbit(g[i])) bad = i;
    if (bad < n) fprintf(stderr, "  %s: element %zu is %g\n", what, bad, (double)g[bad]);
    T_OK(bad == n);
}

static void test_adamw(void) {
    size_t n = 1001;
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *w = frnd(n, 1), *m = tmp(n * 4), *v = tmp(n * 4), *wa = tmp(n * 4);
    double *rw = dcopy(w, n), *rm = dzeros(n), *rv = dzeros(n);
    for (int t = 1; t <= 3; t++) {
        float *g = frnd(n, 1);
        g[0] = 0.0f;
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        for (size_t i = 0; i < n; i++) {
            double gg = (double)g[i] * gs;
            rm[i] = b1 * rm[i] + (1.0 - b1) * gg;
            rv[i] = b2 * rv[i] + (1.0 - b2) * gg * gg;
            rw[i] =
                rw[i] * (1.0 - (double)lr * wd) - lr * (rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps);
        }
        be->adamw_step(be, w, t == 3 ? wa : NULL, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
        check_zeroed("adamw consumes g", g, n);
    }
    check_arr("adamw w", w, rw, n, FWD_TOL);
    check_arr("adamw m", m, rm, n, FWD_TOL);
    check_arr("adamw v", v, rv, n, FWD_TOL);
    check_same("adamw w_act receives w", w, wa, n * sizeof(float));
    tmp_free_all();
}

/* n: a thread's slice of 59 (one thread) or 118 (two) runs the moments'
 * blocks of 16, one block of 8 and a tail of 3. */
static void test_lamb(size_t n) {
    float b1 = 0.9f, b2 = 0.999f, eps = 1e-6f, wd = 0.01f, gs = 2.0f, step = 0.03f;
    int t = 2;
    float *w = frnd(n, 1), *m = frnd(n, 0.1f), *v = frnd(n, 0.1f), *g = frnd(n, 1);
    for (size_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    double *ru = dzeros(n), *rm = dcopy(m, n), *rv = dcopy(v, n), *rw = dzeros(n);
    double wsq = 0.0, usq = 0.0, bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
        double gg = (double)g[i] * gs;
        rm[i] = b1 * rm[i] + (1.0 - b1) * gg;
        rv[i] = b2 * rv[i] + (1.0 - b2) * gg * gg;
        ru[i] = (rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps) + wd * (double)w[i];
        wsq += (double)w[i] * w[i];
        usq += ru[i] * ru[i];
    }
    double ws = -1, us = -1;
    be->lamb_moments(be, g, w, m, v, n, b1, b2, eps, wd, t, gs, &ws, &us);
    check_arr("lamb_moments u", g, ru, n, FWD_TOL);
    check_arr("lamb_moments m", m, rm, n, FWD_TOL);
    check_arr("lamb_moments v", v, rv, n, FWD_TOL);
    T_NEAR(ws / wsq, 1.0, 1e-12);
    T_NEAR(us / usq, 1.0, 2e-6);
    for (size_t i = 0; i < n; i++)
        rw[i] = (double)w[i] - (double)step * g[i];
    float *wa = tmp(n * 4);
    be->lamb_apply(be, w, wa, g, n, step);
    check_arr("lamb_apply w", w, rw, n, FWD_TOL);
    check_zeroed("lamb_apply consumes u", g, n);
    check_same("lamb_apply w_act receives w", w, wa, n * sizeof(float));
    tmp_free_all();
}

/* ---- reductions ---- */

static void test_reductions(void) {
    size_t n = 100003;
    float *x = frnd(n, 3);
    double s = 0.0, sq = 0.0;
    for (size_t i = 0; i < n; i++)
        s += x[i], sq += (double)x[i] * x[i];
    double gs = be->sum(be, x, n), gq = be->sum_squares(be, x, n);
    T_NEAR(gs, s, 1e-9 * sq);
    T_NEAR(gq / sq, 1.0, 1e-12);
    T_OK(be->sum_squares(be, x, n) == gq && be->sum(be, x, n) == gs);
    T_NEAR(be->sum(be, x, 5), (double)x[0] + x[1] + x[2] + x[3] + x[4], 1e-12);
    /* lengths around the lanes, the parts a thread reads side by side and
     * the threads' slices: every element counted once */
    static const size_t lens[] = {1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 129, 1000, 4097};
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        double rs = 0.0, rq = 0.0;
        for (size_t i = 0; i < lens[k]; i++)
            rs += x[i], rq += (double)x[i] * x[i];
        T_NEAR(be->sum(be, x, lens[k]), rs, 1e-12 * (rq + 1.0));
        T_NEAR(be->sum_squares(be, x, lens[k]) / rq, 1.0, 1e-12);
    }
    T_NEAR(be->sum(be, x, 0), 0.0, 0.0);
    T_EQ_INT(be->has_nonfinite(be, x, n), 0);
    x[n - 1] = FLT_MAX, x[0] = -FLT_MAX;
    T_EQ_INT(be->has_nonfinite(be, x, n), 0);
    x[n - 1] = NAN;
    T_EQ_INT(be->has_nonfinite(be, x, n), 1);
    x[n - 1] = 1.0f, x[0] = -INFINITY;
    T_EQ_INT(be->has_nonfinite(be, x, n), 1);
    x[0] = 1.0f, x[n / 2] = INFINITY;
    T_EQ_INT(be->has_nonfinite(be, x, n), 1);
    tmp_free_all();
}

/* A product large enough for OpenBLAS to thread, run twice. */
static void test_gemm_determinism(void) {
    int M = 200, N = 300, K = 150;
    float *A = frnd((size_t)M * K, 1), *Bm = frnd((size_t)K * N, 1), *bs = frnd(N, 1);
    float *C1 = frnd((size_t)M * N, 1), *C2 = fcopy(C1, (size_t)M * N);
    float *P1 = tmp((size_t)M * N * 4), *P2 = tmp((size_t)M * N * 4);
    be->gemm(be, 0, 0, M, N, K, 1.0f, A, K, Bm, N, 0.0f, C1, N, 0, bs, BE_EPI_GELU, P1);
    be->gemm(be, 0, 0, M, N, K, 1.0f, A, K, Bm, N, 0.0f, C2, N, 0, bs, BE_EPI_GELU, P2);
    check_same("gemm+gelu", C1, C2, (size_t)M * N * 4);
    check_same("gemm pre", P1, P2, (size_t)M * N * 4);
    tmp_free_all();
}

static void run_all(int threads) {
    MS_CHECK(be_cpu_create(&be, threads) == MS_OK);
    printf("-- %d threads\n", be->threads);
    test_create();
    test_expf();
    test_embedding();
    test_layernorm_case(7, 12);
    test_layernorm_case(5, 37);
    test_layernorm_case(66, 48);
    test_gemm();
    test_gemm_determinism();
    test_elementwise();
    test_attention();
    test_classifier();
    test_adamw();
    test_lamb(1001);
    test_lamb(59);
    test_lamb(118);
    test_reductions();
    be_destroy(be);
    be = NULL;
}

/* The OpenBLAS kernels to ask for (be_cpu_blas_core_for): a known older core
 * on a CPU that can run newer kernels is replaced, a fitting or unknown one
 * never. */
static void test_blas_core_choice(void) {
    const char *s;
    T_OK((s = be_cpu_blas_core_for("Prescott", 1, 0, 1)) && !strcmp(s, "SkylakeX"));
    T_OK((s = be_cpu_blas_core_for("Nehalem", 0, 0, 1)) && !strcmp(s, "Haswell"));
    T_OK((s = be_cpu_blas_core_for("Haswell", 1, 0, 1)) && !strcmp(s, "SkylakeX"));
    T_OK((s = be_cpu_blas_core_for("sandybridge", 0, 0, 1)) && !strcmp(s, "Haswell"));
    T_OK(be_cpu_blas_core_for("SkylakeX", 1, 0, 1) == NULL);
    T_OK(be_cpu_blas_core_for("Cooperlake", 1, 0, 1) == NULL);
    T_OK(be_cpu_blas_core_for("Zen", 0, 0, 1) == NULL);
    T_OK(be_cpu_blas_core_for("SkylakeX", 0, 0, 1) == NULL); /* never downward */
    T_OK(be_cpu_blas_core_for("Prescott", 0, 0, 0) == NULL); /* no kernels to gain */
    T_OK(be_cpu_blas_core_for("GraniteRapids", 1, 0, 1) == NULL);
    T_OK(be_cpu_blas_core_for(NULL, 1, 0, 1) == NULL);
    /* AVX-512 in two halves (Zen 4): AVX2 kernels stay, older ones still go */
    T_OK(be_cpu_blas_core_for("Haswell", 1, 1, 1) == NULL);
    T_OK(be_cpu_blas_core_for("Zen", 1, 1, 1) == NULL);
    T_OK((s = be_cpu_blas_core_for("Prescott", 1, 1, 1)) && !strcmp(s, "SkylakeX"));
    T_OK(strlen(be_cpu_blas_core()) > 0);
}

/* mem_peak: the most bytes of be->alloc blocks and op scratch held at once, by hand: two
 * threads' LayerNorm partials (2C = 128 floats each) and attention dS blocks (64 x T = 6400),
 * the classifier chunk (all B T = 200 rows of Vp = 512, under its 64 M floats). */
static void test_mem_peak(void) {
    be_backend *b = NULL;
    T_EQ_INT(be_cpu_create(&b, 2), MS_OK);
    T_NEAR(b->mem_peak(b), 0, 0);
    void *x = b->alloc(b, 1000), *y = b->alloc(b, 3000);
    b->free(b, x);
    void *z = b->alloc(b, 500);
    T_NEAR(b->mem_peak(b), 4000, 0); /* x and y were held together */
    be_limits big = {2, 100, 64, 4, 512, 10}, small = {1, 8, 16, 2, 64, 10};
    T_EQ_INT(b->reserve(b, &big), MS_OK);
    double scratch = 4.0 * (2 * 128 + 2 * 6400 + 200 * 512);
    T_NEAR(b->mem_peak(b), 3500 + scratch, 0);
    b->free(b, y);
    b->free(b, z);
    T_EQ_INT(b->reserve(b, &small), MS_OK); /* scratch never shrinks, nothing new is held */
    void *w = b->alloc(b, 3500);
    T_NEAR(b->mem_peak(b), 3500 + scratch, 0);
    b->free(b, w);
    b->free(b, NULL);
    be_destroy(b);
}

int main(void) {
    verbose = getenv("MS_TEST_VERBOSE") != NULL;
    test_mem_peak();
    test_blas_core_choice();
    run_all(2);
    run_all(3);
    return ms_test_summary("test_cpu_ops");
}
