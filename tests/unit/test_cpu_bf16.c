/* test_cpu_bf16.c - the CPU backend's bf16 mode (--cpu-dtype bf16) against
 * its fp32 mode, op by op, on random inputs of odd sizes.
 *
 * Inputs are drawn once and rounded to bf16; the fp32 backend runs on the
 * rounded values, the bf16 backend on the bf16 halves.  Ops that compute in
 * fp32 and round their act outputs once (element-wise ops, the embedding,
 * layer norm, attention) must give exactly the fp32 result rounded to bf16,
 * and exactly its fp32 outputs (statistics, weight gradients).  The GEMMs
 * (oneDNN, fp32 accumulation in another order) and the classifier (whose
 * dlogits are rounded to bf16 before its backward GEMMs) are held to bf16
 * tolerances: max|bf16 - fp32| / max|fp32|.
 * Also: to_act rounds to nearest even bitwise, the optimisers' act copy is
 * the master weights rounded, and the refusal on a CPU without bf16
 * (be_cpu_bf16_deny) names the option.  Skipped (77) with the reason where
 * the mode cannot run (no oneDNN at build time, no AVX512-BF16/AMX). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/bf16.h"
#include "check.h"

typedef uint16_t bf16;

static be_backend *F, *H; /* fp32 and bf16 modes */

static uint64_t rng_s = 0x243F6A8885A308D3ull;
static double urand(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * (1.0 / 9007199254740992.0);
}

static void *bufs[512];
static int nbuf;
static void *mem(size_t bytes) {
    MS_CHECK(nbuf < 512);
    void *p = F->alloc(F, bytes ? bytes : 1);
    MS_CHECK(p != NULL);
    return bufs[nbuf++] = p;
}

/* A tensor in both forms: f (fp32, the bf16 values) and h (bf16). */
typedef struct {
    float *f;
    bf16 *h;
    size_t n;
} pair;

static pair rnd(size_t n, float s) {
    pair p = {mem(n * 4), mem(n * 2), n};
    for (size_t i = 0; i < n; i++) {
        p.h[i] = ms_f32_to_bf16((float)((2.0 * urand() - 1.0) * s));
        p.f[i] = ms_bf16_to_f32(p.h[i]);
    }
    return p;
}

static pair zeros(size_t n) {
    pair p = {mem(n * 4), mem(n * 2), n};
    return p;
}

static float *fcopy(const float *x, size_t n) {
    float *y = mem(n * 4);
    memcpy(y, x, n * 4);
    return y;
}

/* bf16 output h equals the fp32 output f rounded, bit for bit. */
static void same_rounded(const char *what, const bf16 *h, const float *f, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i] != ms_f32_to_bf16(f[i]) && bad++ == 0) first = i;
    if (bad)
        fprintf(stderr, "%s: %zu of %zu differ from the fp32 result rounded (first [%zu]: %g vs %g)\n",
                what, bad, n, first, ms_bf16_to_f32(h[first]), f[first]);
    T_OK(bad == 0);
}

static void same_f32(const char *what, const float *a, const float *b, size_t n) {
    int eq = memcmp(a, b, n * 4) == 0;
    if (!eq) fprintf(stderr, "%s: fp32 outputs differ from the fp32 mode's\n", what);
    T_OK(eq);
}

/* max|got - ref| / max|ref| <= tol; got is bf16 (h) or fp32 (f). */
static void near(const char *what, const bf16 *h, const float *f, const float *ref, size_t n,
                 double tol) {
    double mref = 0, merr = 0;
    for (size_t i = 0; i < n; i++) {
        double g = h ? ms_bf16_to_f32(h[i]) : f[i], e = fabs(g - ref[i]);
        if (isnan(e)) e = INFINITY;
        mref = fabs(ref[i]) > mref ? fabs(ref[i]) : mref;
        merr = e > merr ? e : merr;
    }
    double rel = mref > 0 ? merr / mref : merr;
    if (!(rel <= tol) || mref == 0)
        fprintf(stderr, "%s: max error %.3g of max %.3g (rel %.3g > %.3g)\n", what, merr, mref, rel,
                tol);
    else
        printf("  %-40s rel %.2e (tol %.0e)\n", what, rel, tol);
    T_OK(rel <= tol && mref > 0);
}

static void test_refusal(void) {
    be_cpu_bf16_deny(1);
    be_backend *b = NULL;
    ms_status st = be_cpu_create_dtype(&b, 1, BE_BF16);
    T_OK(st == MS_ERR_ARG && b == NULL);
    T_STR_CONTAINS(ms_errmsg(), "--cpu-dtype bf16: ");
    be_dtype d;
    T_EQ_INT(be_dtype_parse("bf16", "cpu", &d), MS_ERR_ARG); /* refused at start-up too */
    T_STR_CONTAINS(ms_errmsg(), "denied for a test");
    be_cpu_bf16_deny(0);
    const char *why = be_cpu_bf16_missing();
    T_EQ_INT(be_dtype_parse("bf16", "cpu", &d), why ? MS_ERR_ARG : MS_OK);
    T_EQ_INT(d, why ? BE_F32 : BE_BF16);
    T_EQ_INT(be_dtype_parse(NULL, "cpu", &d), MS_OK);
    T_EQ_INT(d, BE_F32);
    T_EQ_INT(be_dtype_parse("fp16", "cpu", &d), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "\"fp16\" is not fp32 or bf16");
    T_EQ_INT(be_dtype_parse("bf16", "cuda", &d), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "--device cpu");
}

static void test_to_act(void) {
    float src[6] = {1.0f, 1.00390625f /* a tie: stays 1 */, 1.01171875f /* tie: rounds up */,
                    -3.14159f, INFINITY, NAN};
    bf16 *d = mem(sizeof src / 2);
    H->to_act(H, d, src, 6);
    for (int i = 0; i < 6; i++)
        T_EQ_INT(d[i], ms_f32_to_bf16(src[i]));
    T_EQ_INT(d[1], 0x3f80);
    T_EQ_INT(d[2], 0x3f82);
    T_OK((d[5] & 0x7f80) == 0x7f80 && (d[5] & 0x7f) != 0); /* still a NaN */
}

/* The products of each transpose at one shape: odd ones (oneDNN's gemm:jit) and a layer's
 * (256 x 192 x 64 and 256 x 64 x 256: its brgemm kernels, AMX's on a CPU that has it; the
 * odd shapes alone never ran them, and a training run does). */
static void gemm_shape(int M, int N, int K) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
            pair A = rnd((size_t)(ta ? K : M) * lda, 1), B = rnd((size_t)(tb ? N : K) * ldb, 1);
            pair bias = rnd(N, 1), C = zeros((size_t)M * ldc);
            char what[96];
            F->gemm(F, ta, tb, M, N, K, 1.0f, A.f, lda, B.f, ldb, 0.0f, C.f, ldc, 0, bias.f,
                    BE_EPI_NONE, NULL);
            H->gemm(H, ta, tb, M, N, K, 1.0f, A.h, lda, B.h, ldb, 0.0f, C.h, ldc, 0, bias.h,
                    BE_EPI_NONE, NULL);
            snprintf(what, sizeof what, "gemm %dx%dx%d ta=%d tb=%d +bias", M, N, K, ta, tb);
            near(what, C.h, NULL, C.f, C.n, 8e-3);
            /* the weight gradient: an f32 output accumulated into */
            float *G = rnd((size_t)M * ldc, 1).f, *G2 = fcopy(G, (size_t)M * ldc);
            F->gemm(F, ta, tb, M, N, K, 1.0f, A.f, lda, B.f, ldb, 1.0f, G, ldc, 1, NULL,
                    BE_EPI_NONE, NULL);
            H->gemm(H, ta, tb, M, N, K, 1.0f, A.h, lda, B.h, ldb, 1.0f, G2, ldc, 1, NULL,
                    BE_EPI_NONE, NULL);
            snprintf(what, sizeof what, "gemm %dx%dx%d ta=%d tb=%d f32 +=", M, N, K, ta, tb);
            near(what, NULL, G2, G, (size_t)M * ldc, 1e-5);
        }
}

static void test_gemm(void) {
    gemm_shape(37, 29, 53);
    gemm_shape(256, 192, 64);
    gemm_shape(256, 64, 256);
    const int M = 37, N = 29, K = 53;
    /* GeLU epilogue: pre and out */
    pair A = rnd((size_t)M * K, 1), B = rnd((size_t)K * N, 1), bias = rnd(N, 1);
    pair pre = zeros((size_t)M * N), out = zeros((size_t)M * N);
    F->gemm(F, 0, 0, M, N, K, 1.0f, A.f, K, B.f, N, 0.0f, out.f, N, 0, bias.f, BE_EPI_GELU, pre.f);
    H->gemm(H, 0, 0, M, N, K, 1.0f, A.h, K, B.h, N, 0.0f, out.h, N, 0, bias.h, BE_EPI_GELU, pre.h);
    near("gemm +gelu: pre", pre.h, NULL, pre.f, pre.n, 8e-3);
    near("gemm +gelu: out", out.h, NULL, out.f, out.n, 1.2e-2);
    /* alpha != 1 with a bias (added after the product) and beta on an act output */
    pair C = rnd((size_t)M * N, 1);
    float *Cf = fcopy(C.f, C.n);
    F->gemm(F, 0, 1, M, N, K, 0.5f, A.f, K, B.f, K, 0.75f, Cf, N, 0, bias.f, BE_EPI_NONE, NULL);
    H->gemm(H, 0, 1, M, N, K, 0.5f, A.h, K, B.h, K, 0.75f, C.h, N, 0, bias.h, BE_EPI_NONE, NULL);
    near("gemm alpha 0.5 beta 0.75 +bias", C.h, NULL, Cf, C.n, 1.2e-2);
    /* bias gradient */
    pair d = rnd((size_t)M * N, 1);
    float *db = rnd(N, 1).f, *db2 = fcopy(db, N);
    F->bias_bwd(F, db, d.f, M, N);
    H->bias_bwd(H, db2, d.h, M, N);
    same_f32("bias_bwd", db2, db, N);
}

static void test_elementwise(void) {
    size_t n = 3001;
    pair x = rnd(n, 4), y = rnd(n, 2), o = zeros(n);
    F->gelu_fwd(F, o.f, x.f, n);
    H->gelu_fwd(H, o.h, x.h, n);
    same_rounded("gelu_fwd", o.h, o.f, n);
    F->gelu_bwd(F, o.f, x.f, y.f, n);
    H->gelu_bwd(H, o.h, x.h, y.h, n);
    same_rounded("gelu_bwd", o.h, o.f, n);
    F->residual_add(F, o.f, x.f, y.f, n);
    H->residual_add(H, o.h, x.h, y.h, n);
    same_rounded("residual_add", o.h, o.f, n);
    pair b = rnd(41, 1), z = rnd(73 * 41, 1);
    F->bias_add(F, z.f, b.f, 73, 41);
    H->bias_add(H, z.h, b.h, 73, 41);
    same_rounded("bias_add", z.h, z.f, z.n);
}

static void test_embedding(void) {
    const int B = 3, T = 17, C = 48, V = 101, Tmax = 20;
    int32_t *tok = mem(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)(urand() * V);
    pair wte = rnd((size_t)V * C, 1), wpe = rnd((size_t)Tmax * C, 1), out = zeros((size_t)B * T * C);
    be_limits lim = {.B = B, .T = T, .C = C, .NH = 4, .Vp = V};
    MS_CHECK(F->reserve(F, &lim) == MS_OK && H->reserve(H, &lim) == MS_OK);
    F->embedding_fwd(F, out.f, tok, wte.f, wpe.f, B, T, C);
    H->embedding_fwd(H, out.h, tok, wte.h, wpe.h, B, T, C);
    same_rounded("embedding_fwd", out.h, out.f, out.n);
    F->embedding_slice_fwd(F, out.f, tok, wte.f + 40 * C, NULL, B, T, C, 40, 30);
    H->embedding_slice_fwd(H, out.h, tok, wte.h + 40 * C, NULL, B, T, C, 40, 30);
    same_rounded("embedding_slice_fwd", out.h, out.f, out.n);
    pair dout = rnd((size_t)B * T * C, 1);
    float *dwte = rnd((size_t)V * C, 1).f, *dwpe = rnd((size_t)Tmax * C, 1).f;
    float *dwte2 = fcopy(dwte, (size_t)V * C), *dwpe2 = fcopy(dwpe, (size_t)Tmax * C);
    F->embedding_bwd(F, dwte, dwpe, dout.f, tok, B, T, C);
    H->embedding_bwd(H, dwte2, dwpe2, dout.h, tok, B, T, C);
    same_f32("embedding_bwd dwte", dwte2, dwte, (size_t)V * C);
    same_f32("embedding_bwd dwpe", dwpe2, dwpe, (size_t)Tmax * C);
    F->embedding_slice_bwd(F, dwte, NULL, dout.f, tok, B, T, C, 40, 30);
    H->embedding_slice_bwd(H, dwte2, NULL, dout.h, tok, B, T, C, 40, 30);
    same_f32("embedding_slice_bwd", dwte2, dwte, (size_t)V * C);
}

static void test_norm_attention(void) {
    const int B = 3, T = 17, C = 48, NH = 4, N = B * T;
    be_limits lim = {.B = B, .T = T, .C = C, .NH = NH, .Vp = 64};
    MS_CHECK(F->reserve(F, &lim) == MS_OK && H->reserve(H, &lim) == MS_OK);
    pair x = rnd((size_t)N * C, 3), w = rnd(C, 1), b = rnd(C, 1), out = zeros((size_t)N * C);
    float *mean = mem(4 * N), *rstd = mem(4 * N), *mean2 = mem(4 * N), *rstd2 = mem(4 * N);
    F->layernorm_fwd(F, out.f, mean, rstd, x.f, w.f, b.f, N, C);
    H->layernorm_fwd(H, out.h, mean2, rstd2, x.h, w.h, b.h, N, C);
    same_rounded("layernorm_fwd", out.h, out.f, out.n);
    same_f32("layernorm_fwd mean", mean2, mean, N);
    same_f32("layernorm_fwd rstd", rstd2, rstd, N);
    pair dout = rnd((size_t)N * C, 1), dinp = rnd((size_t)N * C, 1);
    float *dw = rnd(C, 1).f, *db = rnd(C, 1).f, *dw2 = fcopy(dw, C), *db2 = fcopy(db, C);
    F->layernorm_bwd(F, dinp.f, dw, db, dout.f, x.f, w.f, mean, rstd, N, C);
    H->layernorm_bwd(H, dinp.h, dw2, db2, dout.h, x.h, w.h, mean, rstd, N, C);
    same_rounded("layernorm_bwd dinp (+=)", dinp.h, dinp.f, dinp.n);
    same_f32("layernorm_bwd dw", dw2, dw, C);
    same_f32("layernorm_bwd db", db2, db, C);
    for (int W = 0; W <= 5; W += 5) {
        pair qkv = rnd((size_t)N * 3 * C, 2), ao = zeros((size_t)N * C);
        size_t sb = F->attention_state_bytes(F, B, T, NH);
        T_EQ_INT(H->attention_state_bytes(H, B, T, NH), sb);
        float *st = mem(sb), *st2 = mem(sb);
        F->attention_fwd(F, ao.f, st, qkv.f, B, T, C, NH, W);
        H->attention_fwd(H, ao.h, st2, qkv.h, B, T, C, NH, W);
        same_rounded(W ? "attention_fwd (window 5)" : "attention_fwd", ao.h, ao.f, ao.n);
        same_f32("attention_fwd state", st2, st, sb / 4);
        pair dy = rnd((size_t)N * C, 1), dq = zeros((size_t)N * 3 * C);
        F->attention_bwd(F, dq.f, dy.f, ao.f, qkv.f, st, B, T, C, NH, W);
        H->attention_bwd(H, dq.h, dy.h, ao.h, qkv.h, st, B, T, C, NH, W);
        same_rounded("attention_bwd", dq.h, dq.f, dq.n);
    }
}

static void test_classifier(void) {
    const int N = 45, C = 40, V = 997, Vp = 1008;
    be_limits lim = {.B = 3, .T = 15, .C = C, .NH = 4, .Vp = Vp};
    MS_CHECK(F->reserve(F, &lim) == MS_OK && H->reserve(H, &lim) == MS_OK);
    pair x = rnd((size_t)N * C, 1), wte = rnd((size_t)Vp * C, 1), dx = zeros((size_t)N * C);
    int32_t *tg = mem(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++)
        tg[i] = (int32_t)(urand() * V);
    float *loss = mem(4 * N), *loss2 = mem(4 * N);
    float *dw = rnd((size_t)Vp * C, 0.01f).f, *dw2 = fcopy(dw, (size_t)Vp * C);
    float *dw0 = fcopy(dw, (size_t)Vp * C);
    cpu_set_cls_chunk_rows(F, 16); /* three chunks */
    cpu_set_cls_chunk_rows(H, 16);
    F->classifier_fwd_bwd(F, loss, dx.f, dw, x.f, wte.f, tg, N, C, V, Vp, 1.0f / N);
    H->classifier_fwd_bwd(H, loss2, dx.h, dw2, x.h, wte.h, tg, N, C, V, Vp, 1.0f / N);
    near("classifier losses", NULL, loss2, loss, N, 1e-5);
    near("classifier dx", dx.h, NULL, dx.f, dx.n, 1.5e-2);
    for (size_t i = 0; i < (size_t)Vp * C; i++) /* the increments */
        dw[i] -= dw0[i], dw2[i] -= dw0[i];
    near("classifier dwte (+=)", NULL, dw2, dw, (size_t)V * C, 1.5e-2);
    /* two vocabulary slices against the whole classifier (fp32 mode) */
    const int P = 2, v0[2] = {0, 500}, Vs[2] = {500, V - 500};
    float *stats = mem(4 * (size_t)P * N * 3), *sl = mem(4 * N);
    bf16 *logits[2];
    pair dxs = zeros((size_t)N * C);
    float *dxsum = mem(4 * (size_t)N * C), *dws = mem(4 * (size_t)V * C);
    for (int p = 0; p < P; p++) {
        logits[p] = mem(2 * (size_t)N * Vs[p]);
        H->classifier_slice_stats(H, stats + (size_t)p * N * 3, logits[p], x.h,
                                  wte.h + (size_t)v0[p] * C, tg, N, C, Vs[p], v0[p]);
    }
    for (int p = 0; p < P; p++) {
        H->classifier_slice_finish(H, sl, dxs.h, dws + (size_t)v0[p] * C, logits[p], x.h,
                                   wte.h + (size_t)v0[p] * C, tg, stats, P, N, C, Vs[p], v0[p],
                                   1.0f / N);
        for (size_t i = 0; i < (size_t)N * C; i++)
            dxsum[i] += ms_bf16_to_f32(dxs.h[i]);
    }
    near("classifier slices: losses (bf16 logits)", NULL, sl, loss, N, 2e-3);
    near("classifier slices: dx summed", NULL, dxsum, dx.f, dx.n, 2e-2);
    near("classifier slices: dwte", NULL, dws, dw, (size_t)V * C, 2e-2);
}

static void test_optim(void) {
    size_t n = 1234;
    float *w = rnd(n, 1).f, *g = rnd(n, 1).f, *m = rnd(n, 0.1f).f, *v = mem(4 * n);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)urand() * 0.01f;
    float *w2 = fcopy(w, n), *g2 = fcopy(g, n), *m2 = fcopy(m, n), *v2 = fcopy(v, n);
    bf16 *wa = mem(2 * n);
    F->adamw_step(F, w, NULL, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
    H->adamw_step(H, w2, wa, g2, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
    same_f32("adamw w", w2, w, n);
    same_f32("adamw m", m2, m, n);
    same_rounded("adamw act copy", wa, w, n);
    float *u = rnd(n, 1).f, *u2 = fcopy(u, n);
    F->lamb_apply(F, w, NULL, u, n, 0.01f);
    H->lamb_apply(H, w2, wa, u2, n, 0.01f);
    same_f32("lamb_apply w", w2, w, n);
    same_rounded("lamb_apply act copy", wa, w, n);
}

int main(void) {
    MS_CHECK(be_cpu_create(&F, 2) == MS_OK);
    test_refusal();
    const char *why = be_cpu_bf16_missing();
    if (why) {
        printf("SKIP: the bf16 mode cannot run here: %s\n", why);
        ms_test_summary("test_cpu_bf16 (refusal only)");
        be_destroy(F);
        return ms_t_fail ? 1 : 77;
    }
    MS_CHECK(be_cpu_create_dtype(&H, 2, BE_BF16) == MS_OK);
    T_EQ_INT(H->act_dtype, BE_BF16);
    be_limits lim = {.B = 3, .T = 17, .C = 48, .NH = 4, .Vp = 1008};
    MS_CHECK(F->reserve(F, &lim) == MS_OK && H->reserve(H, &lim) == MS_OK);
    test_to_act();
    test_gemm();
    test_elementwise();
    test_embedding();
    test_norm_attention();
    test_classifier();
    test_optim();
    while (nbuf)
        F->free(F, bufs[--nbuf]);
    be_destroy(H);
    be_destroy(F);
    return ms_test_summary("test_cpu_bf16");
}
