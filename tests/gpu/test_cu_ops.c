/* test_cu_ops.c - the CUDA backend's memory-bound ops (embedding, layernorm,
 * element-wise, bias_bwd, optimiser steps, reductions, the classifier's
 * non-finite rows) against the CPU
 * backend, which decides what is correct.
 *
 * Every case draws fresh random inputs (never zeros).  Activation inputs are
 * rounded to bf16 on the host and the CPU gets the same rounded values in
 * fp32, so the two sides differ only by the GPU's bf16 outputs and by the
 * order of fp32 arithmetic.  "=" outputs are poisoned with NaN bit patterns
 * first, "+=" outputs start from random values.  Shapes are odd (C = 37, n
 * odd, N = 1) next to GPT-2's (C = 768), and some cases pass views one
 * element off 16-byte alignment to take the kernels' scalar paths.  Every
 * GPU op is run twice and must give bitwise-equal results.
 *
 * Error measure: max|gpu - cpu| / max|cpu| over the output.  Bounds:
 *  - TOL_BF16 1e-2 for bf16 outputs: one bf16 rounding is <= 2^-9 = 0.2% of
 *    the value, plus fp32 noise.
 *  - TOL_F32 1e-5 for fp32 outputs computed element-wise (adamw, lamb,
 *    add_f32) or as short sums (layernorm mean/rstd over C <= 1600) and for
 *    sums of bf16 values (dbias, dwte, dwpe: a bf16 value has 8 significant
 *    bits, so fp32 sums of up to ~2000 of them are nearly exact in any
 *    order) and the double reductions: both sides see identical inputs and
 *    differ only in rounding order (and FMA contraction on the GPU).
 *  - TOL_ACC 1e-4 for layernorm's dw/db: sums over N rows of products
 *    dy*xhat, which are not bf16-exact; the CPU reference (one thread) adds
 *    them serially in fp32, a random walk of relative size ~sqrt(N)*2^-24
 *    (5e-6 at N = 8300, measured 2.7e-6), so 1e-5 would be within 2-4x of
 *    the noise; 1e-4 keeps a 20x margin and still catches a lost or doubled
 *    row (an error of ~1e-2 relative).
 * Exit: 0 all passed, 1 a failure, 77 (skip) without a usable CUDA device.
 * Run with -v to print every comparison.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/bf16.h"
#include "check.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-5
#define TOL_ACC 1e-4

static be_backend *cpu, *gpu;
static int verbose;

/* ---- random numbers and bf16 on the host ---- */

static uint64_t rng_s = 0x243F6A8885A308D3ull;
static double urand(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * (1.0 / 9007199254740992.0);
}

static float bf_round(float f) {
    return ms_bf16_to_f32(ms_f32_to_bf16(f));
}

/* ---- host and device temporaries (freed after each case) ---- */

static void *hbufs[512], *dbufs[512];
static int nh, nd;

static void *hmem(size_t bytes) {
    MS_CHECK(nh < 512);
    void *p = calloc(1, bytes ? bytes : 1);
    MS_CHECK(p);
    return hbufs[nh++] = p;
}
/* Device buffer of bytes, starting off bytes into a fresh allocation. */
static void *dmem(size_t bytes, size_t off) {
    MS_CHECK(nd < 512);
    char *p = gpu->alloc(gpu, bytes + off);
    MS_CHECK(p);
    dbufs[nd++] = p;
    return p + off;
}
static void free_all(void) {
    while (nh)
        free(hbufs[--nh]);
    while (nd)
        gpu->free(gpu, dbufs[--nd]);
}

/* n floats uniform in [lo, hi], rounded to bf16 if bf. */
static float *rnd(size_t n, double lo, double hi, int bf) {
    float *x = hmem(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(lo + (hi - lo) * urand());
        if (bf) x[i] = bf_round(x[i]);
    }
    return x;
}
static float *hcopy(const float *x, size_t n) {
    float *y = hmem(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* Uploads: x (n) as bf16 / f32 to a device view `off` elements past an
 * aligned allocation (off = 1 breaks 16-byte alignment). */
static void *up_bf(const float *x, size_t n, int off) {
    uint16_t *h = hmem(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = ms_f32_to_bf16(x[i]);
    void *d = dmem(n * 2, (size_t)off * 2);
    gpu->to_device(gpu, d, h, n * 2);
    return d;
}
static float *up_f32(const float *x, size_t n, int off) {
    float *d = dmem(n * 4, (size_t)off * 4);
    gpu->to_device(gpu, d, x, n * 4);
    return d;
}
static void *up_tok(const int32_t *t, size_t n) {
    void *d = dmem(n * 4, 0);
    gpu->to_device(gpu, d, t, n * 4);
    return d;
}
/* A device buffer of bytes filled with 0xff: NaN as f32 and as bf16. */
static void *dnan(size_t bytes, int off_bytes) {
    uint8_t *h = hmem(bytes);
    memset(h, 0xff, bytes);
    void *d = dmem(bytes, (size_t)off_bytes);
    gpu->to_device(gpu, d, h, bytes);
    return d;
}
static float *down_bf(const void *d, size_t n) {
    uint16_t *h = hmem(n * 2);
    float *f = hmem(n * sizeof(float));
    gpu->to_host(gpu, h, d, n * 2);
    for (size_t i = 0; i < n; i++)
        f[i] = ms_bf16_to_f32(h[i]);
    return f;
}
static float *down_f32(const void *d, size_t n) {
    float *f = hmem(n * sizeof(float));
    gpu->to_host(gpu, f, d, n * 4);
    return f;
}

/* ---- comparisons ---- */

/* Worst relative error seen per check name, printed at the end. */
static struct {
    char name[48];
    double worst, tol;
} worst[64];
static int nworst;

static void note_worst(const char *name, double r, double tol) {
    int i = 0;
    while (i < nworst && strcmp(worst[i].name, name) != 0)
        i++;
    if (i == nworst) {
        MS_CHECK(nworst < 64);
        snprintf(worst[i].name, sizeof worst[i].name, "%s", name);
        worst[i].worst = 0.0;
        worst[i].tol = tol;
        nworst++;
    }
    if (r > worst[i].worst || isnan(r)) worst[i].worst = isnan(r) ? INFINITY : r;
}

/* Passes if max|got-ref| / max|ref| <= tol; prints the worst element. */
static void check_rel(const char *name, const char *shape, const float *got, const float *ref,
                      size_t n, double tol) {
    double mref = 0.0, merr = 0.0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        if (isnan(e)) e = INFINITY;
        if (fabs((double)ref[i]) > mref) mref = fabs((double)ref[i]);
        if (e > merr) merr = e, wi = i;
    }
    double r = merr / (mref > 0.0 ? mref : 1.0);
    note_worst(name, r, tol);
    if (verbose) printf("  %-28s %-24s rel err %.3g\n", name, shape, r);
    if (!(r <= tol))
        fprintf(stderr,
                "  %s %s: rel err %.3g > %.3g at [%zu]: gpu %.9g, cpu %.9g (max|cpu| %.3g)\n", name,
                shape, r, tol, wi, (double)got[wi], (double)ref[wi], mref);
    T_OK(r <= tol);
}

static void check_rel_d(const char *name, const char *shape, double got, double ref, double tol) {
    double r = fabs(got - ref) / (fabs(ref) > 0.0 ? fabs(ref) : 1.0);
    if (isnan(r)) r = INFINITY;
    note_worst(name, r, tol);
    if (verbose) printf("  %-28s %-24s rel err %.3g\n", name, shape, r);
    if (!(r <= tol))
        fprintf(stderr, "  %s %s: rel err %.3g > %.3g: gpu %.17g, cpu %.17g\n", name, shape, r, tol,
                got, ref);
    T_OK(r <= tol);
}

/* Two device buffers of bytes must be bitwise equal (two runs of an op). */
static void check_same(const char *name, const char *shape, const void *a, const void *b,
                       size_t bytes) {
    uint8_t *ha = hmem(bytes), *hb = hmem(bytes);
    gpu->to_host(gpu, ha, a, bytes);
    gpu->to_host(gpu, hb, b, bytes);
    int same = memcmp(ha, hb, bytes) == 0;
    if (!same) fprintf(stderr, "  %s %s: two runs differ\n", name, shape);
    T_OK(same);
}

/* n floats all +0.0 (an update consumed its gradient). */
static int all_zero(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f || signbit(x[i])) return 0;
    return 1;
}

/* ---- layernorm ---- */

static void test_layernorm(int N, int C, int off) {
    char sh[48];
    snprintf(sh, sizeof sh, "N=%d C=%d off=%d", N, C, off);
    size_t NC = (size_t)N * C;
    float *x = rnd(NC, -1.5, 1.5, 0), *w = rnd(C, -1.5, 1.5, 1), *b = rnd(C, -1, 1, 1);
    for (size_t i = 0; i < NC; i++)
        x[i] = bf_round(x[i] + (float)((int)(i / C) % 5 - 2)); /* row means in [-2, 2] */
    float *out = hmem(NC * 4), *mean = hmem(N * 4), *rstd = hmem(N * 4);
    cpu->layernorm_fwd(cpu, out, mean, rstd, x, w, b, N, C);

    void *gx = up_bf(x, NC, off), *gw = up_bf(w, C, off), *gb = up_bf(b, C, off);
    void *dout[2];
    float *dmean[2], *drstd[2];
    for (int k = 0; k < 2; k++) {
        dout[k] = dnan(NC * 2, off * 2);
        dmean[k] = dnan(N * 4, 0);
        drstd[k] = dnan(N * 4, 0);
        gpu->layernorm_fwd(gpu, dout[k], dmean[k], drstd[k], gx, gw, gb, N, C);
    }
    check_rel("layernorm_fwd out", sh, down_bf(dout[0], NC), out, NC, TOL_BF16);
    check_rel("layernorm_fwd mean", sh, down_f32(dmean[0], N), mean, N, TOL_F32);
    check_rel("layernorm_fwd rstd", sh, down_f32(drstd[0], N), rstd, N, TOL_F32);
    check_same("layernorm_fwd out", sh, dout[0], dout[1], NC * 2);
    check_same("layernorm_fwd mean", sh, dmean[0], dmean[1], N * 4);
    check_same("layernorm_fwd rstd", sh, drstd[0], drstd[1], N * 4);

    /* backward from the CPU's statistics, given to both sides */
    float *dy = rnd(NC, -1, 1, 1), *dx0 = rnd(NC, -1, 1, 1), *dw0 = rnd(C, -1, 1, 0),
          *db0 = rnd(C, -1, 1, 0);
    float *cdx = hcopy(dx0, NC), *cdw = hcopy(dw0, C), *cdb = hcopy(db0, C);
    cpu->layernorm_bwd(cpu, cdx, cdw, cdb, dy, x, w, mean, rstd, N, C);
    void *ddy = up_bf(dy, NC, off), *gdx[2];
    float *gmean = up_f32(mean, N, 0), *grstd = up_f32(rstd, N, 0), *gdw[2], *gdb[2];
    for (int k = 0; k < 2; k++) {
        gdx[k] = up_bf(dx0, NC, off);
        gdw[k] = up_f32(dw0, C, 0);
        gdb[k] = up_f32(db0, C, 0);
        gpu->layernorm_bwd(gpu, gdx[k], gdw[k], gdb[k], ddy, gx, gw, gmean, grstd, N, C);
    }
    check_rel("layernorm_bwd dinp +=", sh, down_bf(gdx[0], NC), cdx, NC, TOL_BF16);
    check_rel("layernorm_bwd dw +=", sh, down_f32(gdw[0], C), cdw, C, TOL_ACC);
    check_rel("layernorm_bwd db +=", sh, down_f32(gdb[0], C), cdb, C, TOL_ACC);
    check_same("layernorm_bwd dinp", sh, gdx[0], gdx[1], NC * 2);
    check_same("layernorm_bwd dw", sh, gdw[0], gdw[1], C * 4);
    check_same("layernorm_bwd db", sh, gdb[0], gdb[1], C * 4);
    free_all();
}

/* ---- element-wise ---- */

static void test_gelu(size_t n, int off) {
    char sh[48];
    snprintf(sh, sizeof sh, "n=%zu off=%d", n, off);
    float *x = rnd(n, -5, 5, 1);
    x[n / 2] = bf_round(-20.0f); /* the clamped tails */
    x[n - 1] = bf_round(19.0f);
    if (n > 8) { /* far past the clamp: the limits, 0 and x, slopes 0 and 1, as the CPU */
        x[1] = bf_round(-1e12f), x[2] = bf_round(1e12f), x[3] = bf_round(-1e36f);
        x[4] = bf_round(1e20f);
    }
    float *y = hmem(n * 4);
    cpu->gelu_fwd(cpu, y, x, n);
    void *dx = up_bf(x, n, off), *dy[2];
    for (int k = 0; k < 2; k++) {
        dy[k] = dnan(n * 2, off * 2);
        gpu->gelu_fwd(gpu, dy[k], dx, n);
    }
    check_rel("gelu_fwd", sh, down_bf(dy[0], n), y, n, TOL_BF16);
    check_same("gelu_fwd", sh, dy[0], dy[1], n * 2);

    float *g = rnd(n, -1, 1, 1), *dxr = hmem(n * 4);
    cpu->gelu_bwd(cpu, dxr, x, g, n);
    void *dg = up_bf(g, n, off), *ddx = dnan(n * 2, off * 2), *dga = up_bf(g, n, off);
    gpu->gelu_bwd(gpu, ddx, dx, dg, n);
    gpu->gelu_bwd(gpu, dga, dx, dga, n); /* in place: dinp aliases dout */
    check_rel("gelu_bwd", sh, down_bf(ddx, n), dxr, n, TOL_BF16);
    check_same("gelu_bwd (in place)", sh, ddx, dga, n * 2);
    free_all();
}

static void test_residual(size_t n, int off) {
    char sh[48];
    snprintf(sh, sizeof sh, "n=%zu off=%d", n, off);
    float *a = rnd(n, -2, 2, 1), *b = rnd(n, -2, 2, 1), *y = hmem(n * 4);
    cpu->residual_add(cpu, y, a, b, n);
    void *da = up_bf(a, n, off), *db = up_bf(b, n, off), *dy = dnan(n * 2, off * 2);
    void *dy2 = dnan(n * 2, off * 2);
    gpu->residual_add(gpu, dy, da, db, n);
    gpu->residual_add(gpu, dy2, da, db, n);
    check_rel("residual_add", sh, down_bf(dy, n), y, n, TOL_BF16);
    check_same("residual_add", sh, dy, dy2, n * 2);
    void *aa = up_bf(a, n, off), *ab = up_bf(b, n, off);
    gpu->residual_add(gpu, aa, aa, db, n); /* out aliases a */
    gpu->residual_add(gpu, ab, da, ab, n); /* out aliases b */
    check_same("residual_add (out = a)", sh, dy, aa, n * 2);
    check_same("residual_add (out = b)", sh, dy, ab, n * 2);
    free_all();
}

static void test_bias_add(int M, int N, int off) {
    char sh[48];
    snprintf(sh, sizeof sh, "M=%d N=%d off=%d", M, N, off);
    size_t n = (size_t)M * N;
    float *y = rnd(n, -2, 2, 1), *bias = rnd(N, -1, 1, 1), *cy = hcopy(y, n);
    cpu->bias_add(cpu, cy, bias, M, N);
    void *dy = up_bf(y, n, off), *dy2 = up_bf(y, n, off), *db = up_bf(bias, N, off);
    gpu->bias_add(gpu, dy, db, M, N);
    gpu->bias_add(gpu, dy2, db, M, N);
    check_rel("bias_add +=", sh, down_bf(dy, n), cy, n, TOL_BF16);
    check_same("bias_add", sh, dy, dy2, n * 2);
    free_all();
}

static void test_add_f32(size_t n, int off) {
    char sh[48];
    snprintf(sh, sizeof sh, "n=%zu off=%d", n, off);
    float *y = rnd(n, -2, 2, 0), *x = rnd(n, -2, 2, 0), *cy = hcopy(y, n);
    cpu->add_f32(cpu, cy, x, n);
    float *dy = up_f32(y, n, off), *dy2 = up_f32(y, n, off), *dx = up_f32(x, n, off);
    gpu->add_f32(gpu, dy, dx, n);
    gpu->add_f32(gpu, dy2, dx, n);
    check_rel("add_f32 +=", sh, down_f32(dy, n), cy, n, TOL_F32);
    check_same("add_f32", sh, dy, dy2, n * 4);
    free_all();
}

static void test_bias_bwd(int M, int N, int off) {
    char sh[48];
    snprintf(sh, sizeof sh, "M=%d N=%d off=%d", M, N, off);
    size_t n = (size_t)M * N;
    float *dout = rnd(n, -1, 1, 1), *db0 = rnd(N, -1, 1, 0), *cdb = hcopy(db0, N);
    cpu->bias_bwd(cpu, cdb, dout, M, N);
    void *dd = up_bf(dout, n, off);
    float *g[2];
    for (int k = 0; k < 2; k++) {
        g[k] = up_f32(db0, N, 0);
        gpu->bias_bwd(gpu, g[k], dd, M, N);
    }
    check_rel("bias_bwd dbias +=", sh, down_f32(g[0], N), cdb, N, TOL_F32);
    check_same("bias_bwd", sh, g[0], g[1], N * 4);
    free_all();
}

/* ---- embedding ---- */

/* Tokens for B*T positions: kind 0 uniform in [0,V), 1 one id everywhere
 * but a few, 2 alternating between two ids. */
static int32_t *tokens(int n, int V, int kind) {
    int32_t *t = hmem((size_t)n * 4);
    for (int i = 0; i < n; i++) {
        if (kind == 0) t[i] = (int32_t)(urand() * V);
        if (kind == 1) t[i] = i % 17 == 5 ? (int32_t)(urand() * V) : 7 % V;
        if (kind == 2) t[i] = i % 2 ? V - 1 : 3 % V;
    }
    return t;
}

static void test_embedding(int B, int T, int C, int V, int kind) {
    char sh[48];
    snprintf(sh, sizeof sh, "B=%d T=%d C=%d V=%d tok%d", B, T, C, V, kind);
    int n = B * T, Tmax = T + 3;
    size_t nC = (size_t)n * C;
    int32_t *tok = tokens(n, V, kind);
    float *wte = rnd((size_t)V * C, -1, 1, 1), *wpe = rnd((size_t)Tmax * C, -1, 1, 1);
    float *out = hmem(nC * 4);
    cpu->embedding_fwd(cpu, out, tok, wte, wpe, B, T, C);
    void *dtok = up_tok(tok, n), *dwte = up_bf(wte, (size_t)V * C, 0);
    void *dwpe = up_bf(wpe, (size_t)Tmax * C, 0), *dout[2];
    for (int k = 0; k < 2; k++) {
        dout[k] = dnan(nC * 2, 0);
        gpu->embedding_fwd(gpu, dout[k], dtok, dwte, dwpe, B, T, C);
    }
    check_rel("embedding_fwd", sh, down_bf(dout[0], nC), out, nC, TOL_BF16);
    check_same("embedding_fwd", sh, dout[0], dout[1], nC * 2);

    float *dy = rnd(nC, -1, 1, 1), *gte0 = rnd((size_t)V * C, -1, 1, 0);
    float *gpe0 = rnd((size_t)Tmax * C, -1, 1, 0);
    float *cte = hcopy(gte0, (size_t)V * C), *cpe = hcopy(gpe0, (size_t)Tmax * C);
    cpu->embedding_bwd(cpu, cte, cpe, dy, tok, B, T, C);
    void *ddy = up_bf(dy, nC, 0);
    float *gte[2], *gpe[2];
    for (int k = 0; k < 2; k++) {
        gte[k] = up_f32(gte0, (size_t)V * C, 0);
        gpe[k] = up_f32(gpe0, (size_t)Tmax * C, 0);
        gpu->embedding_bwd(gpu, gte[k], gpe[k], ddy, dtok, B, T, C);
    }
    check_rel("embedding_bwd dwte +=", sh, down_f32(gte[0], (size_t)V * C), cte, (size_t)V * C,
              TOL_F32);
    check_rel("embedding_bwd dwpe +=", sh, down_f32(gpe[0], (size_t)Tmax * C), cpe,
              (size_t)Tmax * C, TOL_F32);
    check_same("embedding_bwd dwte", sh, gte[0], gte[1], (size_t)V * C * 4);
    check_same("embedding_bwd dwpe", sh, gpe[0], gpe[1], (size_t)Tmax * C * 4);
    free_all();
}

/* One vocabulary slice [v0, v0+Vs) of V ids, with and without the position
 * term. */
static void test_embedding_slice(int B, int T, int C, int V, int v0, int Vs, int with_pos) {
    char sh[48];
    snprintf(sh, sizeof sh, "C=%d v0=%d Vs=%d pos=%d", C, v0, Vs, with_pos);
    int n = B * T, Tmax = T + 2;
    size_t nC = (size_t)n * C, sC = (size_t)(Vs ? Vs : 1) * C;
    int32_t *tok = tokens(n, V, 0);
    tok[0] = v0, tok[1] = v0 + Vs - 1, tok[2] = v0 + Vs, tok[3] = v0 ? v0 - 1 : V - 1; /* edges */
    tok[4] = tok[5] = tok[6] = v0 + Vs / 2;                                            /* repeats */
    float *wte = rnd(sC, -1, 1, 1), *wpe = rnd((size_t)Tmax * C, -1, 1, 1), *out = hmem(nC * 4);
    cpu->embedding_slice_fwd(cpu, out, tok, wte, with_pos ? wpe : NULL, B, T, C, v0, Vs);
    void *dtok = up_tok(tok, n), *dwte = up_bf(wte, sC, 0), *dwpe = up_bf(wpe, (size_t)Tmax * C, 0);
    void *dout = dnan(nC * 2, 0);
    gpu->embedding_slice_fwd(gpu, dout, dtok, dwte, with_pos ? dwpe : NULL, B, T, C, v0, Vs);
    check_rel("embedding_slice_fwd", sh, down_bf(dout, nC), out, nC, TOL_BF16);

    float *dy = rnd(nC, -1, 1, 1), *gte0 = rnd(sC, -1, 1, 0),
          *gpe0 = rnd((size_t)Tmax * C, -1, 1, 0);
    float *cte = hcopy(gte0, sC), *cpe = hcopy(gpe0, (size_t)Tmax * C);
    cpu->embedding_slice_bwd(cpu, cte, with_pos ? cpe : NULL, dy, tok, B, T, C, v0, Vs);
    void *ddy = up_bf(dy, nC, 0);
    float *gte[2], *gpe[2];
    for (int k = 0; k < 2; k++) {
        gte[k] = up_f32(gte0, sC, 0);
        gpe[k] = up_f32(gpe0, (size_t)Tmax * C, 0);
        gpu->embedding_slice_bwd(gpu, gte[k], with_pos ? gpe[k] : NULL, ddy, dtok, B, T, C, v0, Vs);
    }
    check_rel("embedding_slice_bwd dwte +=", sh, down_f32(gte[0], sC), cte, sC, TOL_F32);
    check_rel("embedding_slice_bwd dwpe +=", sh, down_f32(gpe[0], (size_t)Tmax * C), cpe,
              (size_t)Tmax * C, TOL_F32);
    check_same("embedding_slice_bwd dwte", sh, gte[0], gte[1], sC * 4);
    free_all();
}

/* ---- optimiser ---- */

static void test_adamw(size_t n, int t, int with_act, int off) {
    char sh[48];
    snprintf(sh, sizeof sh, "n=%zu t=%d act=%d off=%d", n, t, with_act, off);
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    float *w = rnd(n, -1, 1, 0), *g = rnd(n, -1, 1, 0), *m = rnd(n, -0.1, 0.1, 0);
    float *v = rnd(n, 1e-6, 1e-2, 0);
    float *cw = hcopy(w, n), *cm = hcopy(m, n), *cv = hcopy(v, n), *cg = hcopy(g, n);
    cpu->adamw_step(cpu, cw, NULL, cg, cm, cv, n, lr, b1, b2, eps, wd, t, gs);
    float *dw[2], *dm[2], *dv[2], *dg[2];
    void *da[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) { /* the update consumes the gradient: one copy each */
        dg[k] = up_f32(g, n, off);
        dw[k] = up_f32(w, n, off);
        dm[k] = up_f32(m, n, off);
        dv[k] = up_f32(v, n, off);
        if (with_act) da[k] = dnan(n * 2, off * 2);
        gpu->adamw_step(gpu, dw[k], da[k], dg[k], dm[k], dv[k], n, lr, b1, b2, eps, wd, t, gs);
    }
    T_OK(all_zero(cg, n));
    T_OK(all_zero(down_f32(dg[0], n), n));
    check_rel("adamw w", sh, down_f32(dw[0], n), cw, n, TOL_F32);
    check_rel("adamw m", sh, down_f32(dm[0], n), cm, n, TOL_F32);
    check_rel("adamw v", sh, down_f32(dv[0], n), cv, n, TOL_F32);
    if (with_act) {
        check_rel("adamw w_act", sh, down_bf(da[0], n), cw, n, TOL_BF16);
        check_same("adamw w_act", sh, da[0], da[1], n * 2);
    }
    check_same("adamw w", sh, dw[0], dw[1], n * 4);
    check_same("adamw m", sh, dm[0], dm[1], n * 4);
    check_same("adamw v", sh, dv[0], dv[1], n * 4);
    free_all();
}

static void test_lamb(size_t n, int t, int off) {
    char sh[48];
    snprintf(sh, sizeof sh, "n=%zu t=%d off=%d", n, t, off);
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-6f, wd = 0.01f, gs = 1.3f, step = 2e-3f;
    float *w = rnd(n, -1, 1, 0), *g = rnd(n, -1, 1, 0), *m = rnd(n, -0.1, 0.1, 0);
    float *v = rnd(n, 1e-6, 1e-2, 0);
    float *cu = hcopy(g, n), *cm = hcopy(m, n), *cv = hcopy(v, n), *cw = hcopy(w, n);
    double cws, cus, gws[2], gus[2];
    cpu->lamb_moments(cpu, cu, w, cm, cv, n, b1, b2, eps, wd, t, gs, &cws, &cus);
    float *cu_used = hcopy(cu, n); /* lamb_apply consumes it; cu stays the reference */
    cpu->lamb_apply(cpu, cw, NULL, cu_used, n, step);
    float *dw = up_f32(w, n, off), *du[2], *dm[2], *dv[2];
    for (int k = 0; k < 2; k++) {
        du[k] = up_f32(g, n, off);
        dm[k] = up_f32(m, n, off);
        dv[k] = up_f32(v, n, off);
        gpu->lamb_moments(gpu, du[k], dw, dm[k], dv[k], n, b1, b2, eps, wd, t, gs, &gws[k],
                          &gus[k]);
    }
    check_rel("lamb_moments u", sh, down_f32(du[0], n), cu, n, TOL_F32);
    check_rel("lamb_moments m", sh, down_f32(dm[0], n), cm, n, TOL_F32);
    check_rel("lamb_moments v", sh, down_f32(dv[0], n), cv, n, TOL_F32);
    check_rel_d("lamb_moments w_sq", sh, gws[0], cws, TOL_F32);
    check_rel_d("lamb_moments u_sq", sh, gus[0], cus, TOL_F32);
    T_OK(gws[0] == gws[1] && gus[0] == gus[1]);
    check_same("lamb_moments u", sh, du[0], du[1], n * 4);
    check_same("lamb_moments m", sh, dm[0], dm[1], n * 4);

    void *da = dnan(n * 2, off * 2);
    gpu->lamb_apply(gpu, dw, da, du[0], n, step);
    check_rel("lamb_apply w", sh, down_f32(dw, n), cw, n, TOL_F32);
    T_OK(all_zero(cu_used, n));
    T_OK(all_zero(down_f32(du[0], n), n));
    check_rel("lamb_apply w_act", sh, down_bf(da, n), cw, n, TOL_BF16);
    float *dw2 = up_f32(w, n, off);
    gpu->lamb_apply(gpu, dw2, NULL, du[1], n, step);
    check_same("lamb_apply w", sh, dw, dw2, n * 4);
    free_all();
}

/* ---- reductions ---- */

static void test_reduce(size_t n) {
    char sh[48];
    snprintf(sh, sizeof sh, "n=%zu", n);
    float *x = rnd(n, -1, 1, 0), *l = rnd(n, 0.5, 4, 0); /* l: loss-like, positive */
    double csq = cpu->sum_squares(cpu, x, n), cs = cpu->sum(cpu, l, n);
    float *dx = up_f32(x, n, 0), *dl = up_f32(l, n, 0), *dxo = up_f32(x, n, 1);
    double gsq = gpu->sum_squares(gpu, dx, n), gs = gpu->sum(gpu, dl, n);
    check_rel_d("sum_squares", sh, gsq, csq, TOL_F32);
    check_rel_d("sum", sh, gs, cs, TOL_F32);
    /* bitwise: run to run, and at an unaligned address (same order) */
    T_OK(gpu->sum_squares(gpu, dx, n) == gsq && gpu->sum(gpu, dl, n) == gs);
    T_OK(gpu->sum_squares(gpu, dxo, n) == gsq);
    T_EQ_INT(gpu->has_nonfinite(gpu, dx, n), 0);
    float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float *y = hcopy(x, n);
        y[n - 1] = bad[k];
        T_EQ_INT(cpu->has_nonfinite(cpu, y, n), 1);
        T_EQ_INT(gpu->has_nonfinite(gpu, up_f32(y, n, k == 2), n), 1);
    }
    free_all();
}

/* ---- the GeLU epilogue where cuBLASLt cannot fuse it ---- */

/* gemm with BE_EPI_GELU (the MLP's first matmul) at N = 132 (n_embd 33:
 * 4C not a multiple of 8, which cuBLASLt's aux leading dimension must be)
 * and at N = 128, against the CPU: the first aborted, "no cuBLASLt
 * algorithm", at the first MLP forward. */
static void test_gemm_gelu(int M, int N, int K) {
    char sh[48];
    snprintf(sh, sizeof sh, "M=%d N=%d K=%d", M, N, K);
    float *a = rnd((size_t)M * K, -1, 1, 1), *b = rnd((size_t)N * K, -1, 1, 1);
    float *bias = rnd(N, -1, 1, 1), *c = hmem((size_t)M * N * 4), *pre = hmem((size_t)M * N * 4);
    cpu->gemm(cpu, 0, 1, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N, 0, bias, BE_EPI_GELU, pre);
    void *gc = dnan((size_t)M * N * 2, 0), *gp = dnan((size_t)M * N * 2, 0);
    gpu->gemm(gpu, 0, 1, M, N, K, 1.0f, up_bf(a, (size_t)M * K, 0), K, up_bf(b, (size_t)N * K, 0),
              K, 0.0f, gc, N, 0, up_bf(bias, N, 0), BE_EPI_GELU, gp);
    check_rel("gemm gelu out", sh, down_bf(gc, (size_t)M * N), c, (size_t)M * N, TOL_BF16);
    check_rel("gemm gelu pre", sh, down_bf(gp, (size_t)M * N), pre, (size_t)M * N, TOL_BF16);
    free_all();
}

/* ---- the classifier's non-finite rows ---- */

/* The fused classifier's losses against the CPU's; then a NaN logit (one
 * row of wte NaN) gives NaN losses on every row, as on the CPU (the
 * per-thread combine dropped the NaN share: a finite, wrong loss); and a
 * target outside [0, V) gives that row a NaN loss, the others unchanged,
 * and no gradient on the padded columns (it was read past the row). */
static void test_classifier_nonfinite(void) {
    const int N = 5, C = 64, V = 1000, Vp = 1024;
    const char *sh = "N=5 C=64 V=1000";
    float *x = rnd((size_t)N * C, -1, 1, 1), *wte = rnd((size_t)Vp * C, -1, 1, 1);
    int32_t tg[5] = {0, 17, 999, 500, 3};
    float *closs = hmem(N * 4);
    cpu->classifier_fwd_bwd(cpu, closs, NULL, NULL, x, wte, tg, N, C, V, Vp, 1.0f / N);
    void *gx = up_bf(x, (size_t)N * C, 0), *gw = up_bf(wte, (size_t)Vp * C, 0);
    float *gl = dnan(N * 4, 0);
    gpu->classifier_fwd_bwd(gpu, gl, NULL, NULL, gx, gw, up_tok(tg, N), N, C, V, Vp, 1.0f / N);
    float *good = down_f32(gl, N);
    check_rel("classifier losses", sh, good, closs, N, TOL_BF16);

    float *wn = hcopy(wte, (size_t)Vp * C);
    for (int c = 0; c < C; c++)
        wn[5 * C + c] = NAN; /* the logits of id 5: NaN on every row */
    cpu->classifier_fwd_bwd(cpu, closs, NULL, NULL, x, wn, tg, N, C, V, Vp, 1.0f / N);
    gpu->classifier_fwd_bwd(gpu, gl, NULL, NULL, gx, up_bf(wn, (size_t)Vp * C, 0), up_tok(tg, N), N,
                            C, V, Vp, 1.0f / N);
    float *nl = down_f32(gl, N);
    int cpu_nan = 0, gpu_nan = 0;
    for (int r = 0; r < N; r++)
        cpu_nan += isnan(closs[r]) != 0, gpu_nan += isnan(nl[r]) != 0;
    T_EQ_INT(cpu_nan, N);
    T_EQ_INT(gpu_nan, N);

    int32_t bad[5] = {0, V + 3, -1, 500, 3}; /* a padded id, a negative one */
    float *dwte = up_f32(hmem((size_t)Vp * C * 4), (size_t)Vp * C, 0); /* zeros */
    void *dx = dnan((size_t)N * C * 2, 0);
    gpu->classifier_fwd_bwd(gpu, gl, dx, dwte, gx, gw, up_tok(bad, N), N, C, V, Vp, 1.0f / N);
    float *bl = down_f32(gl, N), *dw = down_f32(dwte, (size_t)Vp * C);
    T_OK(isnan(bl[1]) && isnan(bl[2]));
    T_OK(bl[0] == good[0] && bl[3] == good[3] && bl[4] == good[4]);
    int pad_zero = 1;
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++)
        pad_zero &= dw[i] == 0.0f;
    T_OK(pad_zero);
    free_all();
}

int main(int argc, char **argv) {
    verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    if (be_cuda_create(&gpu, -1, NULL) != MS_OK) {
        printf("SKIP: %s\n", ms_errmsg());
        return 77;
    }
    MS_CHECK(be_cpu_create(&cpu, 1) == MS_OK);
    be_limits lim = {4, 64, 6144, 4, 64, (size_t)1 << 21};
    T_EQ_INT(cpu->reserve(cpu, &lim), MS_OK);
    T_EQ_INT(gpu->reserve(gpu, &lim), MS_OK);

    static const int ln[][2] = {{1, 37},   {67, 768},  {33, 37}, {9, 1600},
                                {300, 64}, {8300, 37}, {3, 6144}};
    for (int i = 0; i < 7; i++)
        for (int off = 0; off < 2; off++)
            test_layernorm(ln[i][0], ln[i][1], off);

    static const size_t ns[] = {1, 7, 8, 1001, 4099, 100003};
    for (int i = 0; i < 6; i++)
        for (int off = 0; off < 2; off++) {
            test_gelu(ns[i], off);
            test_residual(ns[i], off);
            test_add_f32(ns[i], off);
        }
    static const int mn[][2] = {{1, 37},    {7, 768},  {5, 36},    {33, 40},
                                {300, 768}, {65, 101}, {2000, 40}, {5, 6400}};
    for (int i = 0; i < 8; i++)
        for (int off = 0; off < 2; off++) {
            test_bias_add(mn[i][0], mn[i][1], off);
            test_bias_bwd(mn[i][0], mn[i][1], off);
        }

    for (int kind = 0; kind < 3; kind++) {
        test_embedding(4, 64, 768, 50, kind);
        test_embedding(3, 17, 37, 50, kind);
    }
    test_embedding(1, 1, 37, 5, 0);
    for (int pos = 0; pos < 2; pos++) {
        test_embedding_slice(4, 64, 768, 50, 13, 20, pos);
        test_embedding_slice(3, 17, 37, 50, 0, 25, pos);
        test_embedding_slice(3, 17, 37, 50, 30, 20, pos);
    }

    static const size_t on[] = {1, 7, 1001, 100003};
    for (int i = 0; i < 4; i++)
        for (int off = 0; off < 2; off++) {
            test_adamw(on[i], 1, 1, off);
            test_adamw(on[i], 7, off, off);
            test_lamb(on[i], 3, off);
        }

    static const size_t rn[] = {1, 3, 1001, ((size_t)1 << 20) + 3};
    for (int i = 0; i < 4; i++)
        test_reduce(rn[i]);

    test_classifier_nonfinite();
    test_gemm_gelu(5, 132, 64);
    test_gemm_gelu(7, 128, 64);

    printf("worst relative error per check (tolerance):\n");
    for (int i = 0; i < nworst; i++)
        printf("  %-30s %.3g (%.0e)\n", worst[i].name, worst[i].worst, worst[i].tol);
    be_destroy(gpu);
    be_destroy(cpu);
    return ms_test_summary("test_cu_ops");
}
