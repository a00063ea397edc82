/* ops_dump.c - runs every op of the CPU backend forward and backward on
 * seeded random inputs and writes inputs and outputs to a file of named
 * float32 arrays, which tests/torch/test_ops.py checks against PyTorch.
 *
 * Usage: ops_dump OUT_FILE [SEED]
 * File format (little-endian): magic "MSOPDUMP", u32 version (1), then
 * records until the end of the file, each:
 *   u32 name_len, name bytes, u32 ndim, u64 dims[ndim], float32 data.
 * Names are "case/array"; integer arrays (tokens, targets) and scalar
 * parameters are stored as float32 ("case/params" lists a case's scalars).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"

static be_backend *be;
static FILE *out;
static const char *out_path;
static uint64_t rng_s;

static double urand(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * (1.0 / 9007199254740992.0);
}

static void *allocs[512];
static int nallocs;

static void die(const char *what) {
    fprintf(stderr, "ops_dump: %s (output %s)\n", what, out_path);
    exit(1);
}

/* Device memory, released by free_all() at the end. */
static void *dev(size_t bytes) {
    void *p = be->alloc(be, bytes ? bytes : 1);
    if (!p || nallocs == 512) die("out of memory");
    return allocs[nallocs++] = p;
}

static void free_all(void) {
    while (nallocs)
        be->free(be, allocs[--nallocs]);
}

/* n floats of device memory, uniform in [-s, s] (s = 0: zeros). */
static float *buf(size_t n, float s) {
    float *x = dev(n * sizeof(float));
    for (size_t i = 0; i < n && s != 0.0f; i++)
        x[i] = (float)((2.0 * urand() - 1.0) * s);
    return x;
}

/* Writes one array: case/name with ndim dims given as size_t varargs. */
static void put(const char *cs, const char *name, const float *x, int ndim, ...) {
    char full[128];
    uint64_t dims[4], n = 1;
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim; i++)
        n *= dims[i] = va_arg(ap, size_t);
    va_end(ap);
    uint32_t len = (uint32_t)snprintf(full, sizeof full, "%s/%s", cs, name), nd = (uint32_t)ndim;
    if (fwrite(&len, 4, 1, out) != 1 || fwrite(full, 1, len, out) != len ||
        fwrite(&nd, 4, 1, out) != 1 || fwrite(dims, 8, nd, out) != nd ||
        fwrite(x, sizeof(float), n, out) != n)
        die("write failed");
}

static void put_params(const char *cs, int n, ...) {
    float p[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        p[i] = (float)va_arg(ap, double);
    va_end(ap);
    put(cs, "params", p, 1, (size_t)n);
}

static float *ints_as_floats(const int32_t *v, size_t n) {
    float *f = buf(n, 0);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)v[i];
    return f;
}

static void dump_embedding(void) {
    int B = 2, T = 7, C = 12, V = 37, Tmax = 9, N = B * T;
    int32_t *tok = dev(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(urand() * V);
    tok[2] = tok[6] = tok[11] = 5;
    float *wte = buf((size_t)V * C, 1), *wpe = buf((size_t)Tmax * C, 1), *o = buf(N * C, 0);
    float *dout = buf(N * C, 1), *dwte = buf((size_t)V * C, 0), *dwpe = buf((size_t)Tmax * C, 0);
    be->embedding_fwd(be, o, tok, wte, wpe, B, T, C);
    be->embedding_bwd(be, dwte, dwpe, dout, tok, B, T, C);
    const char *cs = "embedding";
    put(cs, "tok", ints_as_floats(tok, N), 2, (size_t)B, (size_t)T);
    put(cs, "wte", wte, 2, (size_t)V, (size_t)C);
    put(cs, "wpe", wpe, 2, (size_t)Tmax, (size_t)C);
    put(cs, "out", o, 3, (size_t)B, (size_t)T, (size_t)C);
    put(cs, "dout", dout, 3, (size_t)B, (size_t)T, (size_t)C);
    put(cs, "dwte", dwte, 2, (size_t)V, (size_t)C);
    put(cs, "dwpe", dwpe, 2, (size_t)Tmax, (size_t)C);
}

static void dump_layernorm(void) {
    int N = 14, C = 36;
    be_limits lim = {1, N, C, 1, 0, 0};
    if (be->reserve(be, &lim) != MS_OK) die(ms_errmsg());
    float *x = buf((size_t)N * C, 2), *w = buf(C, 1), *b = buf(C, 1), *o = buf((size_t)N * C, 0);
    float *mean = buf(N, 0), *rstd = buf(N, 0), *dout = buf((size_t)N * C, 1);
    float *dx = buf((size_t)N * C, 0), *dw = buf(C, 0), *db = buf(C, 0);
    for (int i = 0; i < N * C; i++)
        x[i] += (float)(i / C % 3);
    be->layernorm_fwd(be, o, mean, rstd, x, w, b, N, C);
    be->layernorm_bwd(be, dx, dw, db, dout, x, w, mean, rstd, N, C);
    const char *cs = "layernorm";
    put(cs, "inp", x, 2, (size_t)N, (size_t)C);
    put(cs, "w", w, 1, (size_t)C);
    put(cs, "b", b, 1, (size_t)C);
    put(cs, "out", o, 2, (size_t)N, (size_t)C);
    put(cs, "mean", mean, 1, (size_t)N);
    put(cs, "rstd", rstd, 1, (size_t)N);
    put(cs, "dout", dout, 2, (size_t)N, (size_t)C);
    put(cs, "dinp", dx, 2, (size_t)N, (size_t)C);
    put(cs, "dw", dw, 1, (size_t)C);
    put(cs, "db", db, 1, (size_t)C);
}

/* C (M,N) = alpha op(A) op(B) + beta C0 + bias, or with gelu
 * pre = op(A) op(B) + bias, C = gelu(pre).  Contiguous operands. */
static void dump_gemm(int ta, int tb, int gelu) {
    int M = 7, N = 12, K = 5;
    float alpha = gelu ? 1.0f : 0.7f, beta = gelu ? 0.0f : 0.3f;
    float *A = buf((size_t)M * K, 1), *Bm = buf((size_t)K * N, 1), *bias = buf(N, 1);
    float *C0 = buf((size_t)M * N, 1), *Cm = buf((size_t)M * N, 0), *pre = buf((size_t)M * N, 0);
    memcpy(Cm, C0, (size_t)M * N * sizeof(float));
    be->gemm(be, ta, tb, M, N, K, alpha, A, ta ? M : K, Bm, tb ? K : N, beta, Cm, N, 0, bias,
             gelu ? BE_EPI_GELU : BE_EPI_NONE, gelu ? pre : NULL);
    char cs[64];
    snprintf(cs, sizeof cs, "gemm_ta%d_tb%d%s", ta, tb, gelu ? "_gelu" : "");
    put_params(cs, 5, (double)ta, (double)tb, (double)alpha, (double)beta, (double)gelu);
    put(cs, "A", A, 2, (size_t)(ta ? K : M), (size_t)(ta ? M : K));
    put(cs, "B", Bm, 2, (size_t)(tb ? N : K), (size_t)(tb ? K : N));
    put(cs, "bias", bias, 1, (size_t)N);
    put(cs, "C0", C0, 2, (size_t)M, (size_t)N);
    put(cs, "C", Cm, 2, (size_t)M, (size_t)N);
    if (gelu) put(cs, "pre", pre, 2, (size_t)M, (size_t)N);
}

static void dump_bias_gelu_residual(void) {
    int M = 9, N = 70;
    size_t n = 1001;
    float *dout = buf((size_t)M * N, 1), *db = buf(N, 0);
    be->bias_bwd(be, db, dout, M, N);
    put("bias_bwd", "dout", dout, 2, (size_t)M, (size_t)N);
    put("bias_bwd", "dbias", db, 1, (size_t)N);

    float *x = buf(n, 5), *y = buf(n, 0), *dy = buf(n, 1), *dx = buf(n, 0);
    x[0] = 0.0f, x[1] = 12.0f, x[2] = -12.0f, x[3] = 40.0f, x[4] = -40.0f;
    be->gelu_fwd(be, y, x, n);
    be->gelu_bwd(be, dx, x, dy, n);
    put("gelu", "x", x, 1, n);
    put("gelu", "y", y, 1, n);
    put("gelu", "dy", dy, 1, n);
    put("gelu", "dx", dx, 1, n);

    float *a = buf(n, 1), *b = buf(n, 1), *o = buf(n, 0);
    be->residual_add(be, o, a, b, n);
    put("residual", "a", a, 1, n);
    put("residual", "b", b, 1, n);
    put("residual", "out", o, 1, n);
}

static void dump_attention(int B, int T, int C, int NH, int W) {
    be_limits lim = {B, T, C, NH, 0, 0};
    if (be->reserve(be, &lim) != MS_OK) die(ms_errmsg());
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, np = (size_t)B * NH * T * T;
    float *qkv = buf(nq, 2), *o = buf(no, 0), *P = buf(np, 0), *dout = buf(no, 1);
    float *dqkv = buf(nq, 0);
    be->attention_fwd(be, o, P, qkv, B, T, C, NH, W);
    be->attention_bwd(be, dqkv, dout, o, qkv, P, B, T, C, NH, W);
    char cs[64];
    snprintf(cs, sizeof cs, "attention_T%d_W%d", T, W);
    put_params(cs, 5, (double)B, (double)T, (double)C, (double)NH, (double)W);
    put(cs, "qkv", qkv, 3, (size_t)B, (size_t)T, (size_t)3 * C);
    put(cs, "out", o, 3, (size_t)B, (size_t)T, (size_t)C);
    put(cs, "P", P, 4, (size_t)B, (size_t)NH, (size_t)T, (size_t)T);
    put(cs, "dout", dout, 3, (size_t)B, (size_t)T, (size_t)C);
    put(cs, "dqkv", dqkv, 3, (size_t)B, (size_t)T, (size_t)3 * C);
}

static void dump_classifier(int N, int C, int V, int Vp, int chunk) {
    be_limits lim = {1, N, C, 1, Vp, 0};
    if (be->reserve(be, &lim) != MS_OK) die(ms_errmsg());
    cpu_set_cls_chunk_rows(be, chunk);
    int32_t *tgt = dev(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        tgt[i] = (int32_t)(urand() * V);
    tgt[0] = V - 1;
    float *x = buf((size_t)N * C, 1), *wte = buf((size_t)Vp * C, 1), *loss = buf(N, 0);
    float *dx = buf((size_t)N * C, 0), *dwte = buf((size_t)Vp * C, 0), dloss = 1.0f / (float)N;
    be->classifier_fwd_bwd(be, loss, dx, dwte, x, wte, tgt, N, C, V, Vp, dloss);
    cpu_set_cls_chunk_rows(be, 0);
    char cs[64];
    snprintf(cs, sizeof cs, "classifier_N%d_V%d", N, V);
    put_params(cs, 3, (double)V, (double)Vp, (double)dloss);
    put(cs, "x", x, 2, (size_t)N, (size_t)C);
    put(cs, "wte", wte, 2, (size_t)Vp, (size_t)C);
    put(cs, "targets", ints_as_floats(tgt, N), 1, (size_t)N);
    put(cs, "losses", loss, 1, (size_t)N);
    put(cs, "dx", dx, 2, (size_t)N, (size_t)C);
    put(cs, "dwte", dwte, 2, (size_t)Vp, (size_t)C);
}

/* Three AdamW steps; LAMB moments + apply; the host reductions. */
static void dump_optim(void) {
    size_t n = 1001;
    float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *w0 = buf(n, 1), *w = buf(n, 0), *m = buf(n, 0), *v = buf(n, 0);
    memcpy(w, w0, n * sizeof(float));
    const char *cs = "adamw";
    put_params(cs, 6, (double)lr, (double)b1, (double)b2, (double)eps, (double)wd, (double)gs);
    put(cs, "w0", w0, 1, n);
    for (int t = 1; t <= 3; t++) {
        float *g = buf(n, 1);
        char name[16];
        snprintf(name, sizeof name, "g%d", t);
        put(cs, name, g, 1, n);
        be->adamw_step(be, w, NULL, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
    }
    put(cs, "w", w, 1, n);
    put(cs, "m", m, 1, n);
    put(cs, "v", v, 1, n);

    float step = 0.02f;
    float *lw = buf(n, 1), *g = buf(n, 1), *lm = buf(n, 0.1f), *lv = buf(n, 0.1f);
    for (size_t i = 0; i < n; i++)
        lv[i] = lv[i] < 0 ? -lv[i] : lv[i];
    cs = "lamb";
    put_params(cs, 7, 0.9, 0.999, 1e-6, 0.01, 3.0, 2.0, (double)step);
    put(cs, "w", lw, 1, n);
    put(cs, "g", g, 1, n);
    put(cs, "m0", lm, 1, n);
    put(cs, "v0", lv, 1, n);
    double wsq, usq;
    be->lamb_moments(be, g, lw, lm, lv, n, 0.9f, 0.999f, 1e-6f, 0.01f, 3, 2.0f, &wsq, &usq);
    put(cs, "u", g, 1, n);
    put(cs, "m", lm, 1, n);
    put(cs, "v", lv, 1, n);
    float sq[2] = {(float)wsq, (float)usq};
    put(cs, "sq", sq, 1, (size_t)2);
    be->lamb_apply(be, lw, NULL, g, n, step);
    put(cs, "w_new", lw, 1, n);

    size_t nr = 100003;
    float *x = buf(nr, 3), r[2];
    r[0] = (float)be->sum(be, x, nr);
    r[1] = (float)be->sum_squares(be, x, nr);
    put("reduce", "x", x, 1, nr);
    put("reduce", "sums", r, 1, (size_t)2);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ops_dump OUT_FILE [SEED]\n");
        return 2;
    }
    out_path = argv[1];
    rng_s = argc > 2 ? strtoull(argv[2], NULL, 10) * 2654435761u + 1 : 0x2545F4914F6CDD1Dull;
    if (be_cpu_create(&be, 2) != MS_OK) die(ms_errmsg());
    out = fopen(out_path, "wb");
    if (!out) die("cannot open for writing");
    uint32_t version = 1;
    if (fwrite("MSOPDUMP", 1, 8, out) != 8 || fwrite(&version, 4, 1, out) != 1) die("write failed");
    dump_embedding();
    dump_layernorm();
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            dump_gemm(ta, tb, 0);
    dump_gemm(0, 0, 1);
    dump_bias_gelu_residual();
    int Ws[] = {0, 1, 3, 17, 70};
    for (int i = 0; i < 5; i++)
        dump_attention(2, 70, 24, 3, Ws[i]);
    dump_attention(1, 7, 12, 3, 0);
    dump_classifier(11, 12, 37, 48, 4);
    dump_classifier(40, 16, 301, 320, 0);
    dump_optim();
    if (fclose(out) != 0) die("close failed");
    free_all();
    be_destroy(be);
    return 0;
}
