/* test_cpu_sgemm.c - the CPU backend's own fp32 GEMM (cpu_sgemm.c with the
 * AVX-512 and AVX2 kernels), through be->gemm with be_cpu_gemm_set, for
 * each kernel this CPU runs:
 *   - against a float64 reference, for the four layouts, shapes on and off
 *     the kernels' blocks (4 and 8 rows, 24 and 48 columns, 384 of K; few
 *     and many rows), row strides above the minimum, alpha and beta (beta 0
 *     on a C full of NaN, which must not be read), K = 0;
 *   - the same bits whatever the split: a GEMM computed as chunks of rows,
 *     chunks of columns, with 1, 2 or 3 threads, equals the whole one;
 *   - the same bits from both kernels (where both run);
 *   - MS_CPU_GEMM (the run context's cpu_gemm): auto, own, own-avx512,
 *     own-avx2, openblas, a bad value; which kernel each kind of CPU gets.
 * Skipped (77) with the reason where the CPU runs neither kernel. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/ctx.h"
#include "base/rng.h"
#include "base/status.h"
#include "check.h"

/* MS_CPU_GEMM as main() would have read it into the run context */
static void set_gemm(const char *v) {
    snprintf(ms_ctx_mut()->cpu_gemm, sizeof ms_ctx_mut()->cpu_gemm, "%s", v);
}

static float *rnd(size_t n, uint64_t seed) {
    float *p = malloc(n * sizeof(float) + 64);
    MS_CHECK(p != NULL);
    for (size_t i = 0; i < n; i++)
        p[i] = ms_rng_uniform(seed, 3, i) - 0.5f;
    return p;
}

/* op(X)(r, c) of a row-major X with row stride ld, transposed if t. */
static float at(const float *X, int ld, int t, int r, int c) {
    return t ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
}

/* One GEMM on the own kernel against float64: max |err| / (sum |a b| + |beta c|). */
static double check_one(be_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                        float beta, int pad) {
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = rnd(na ? na : 1, 11), *B = rnd(nb ? nb : 1, 12), *C = rnd(nc, 13),
          *C0 = malloc(nc * sizeof(float));
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++)
            C[i] = NAN;
    memcpy(C0, C, nc * sizeof(float));
    be->gemm(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 0, NULL, BE_EPI_NONE, NULL);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)at(A, lda, ta, i, k) * at(B, ldb, tb, k, j);
                s += p, mag += fabs(p);
            }
            double c0 = C0[(size_t)i * ldc + j], ref = alpha * s;
            if (beta != 0.0f) ref += beta * c0, mag += fabs(beta * c0);
            mag = fabs(alpha) * mag + 1e-30;
            double got = C[(size_t)i * ldc + j], e = fabs(got - ref) / mag;
            if (!(e <= worst)) worst = e; /* NaN too */
        }
    /* the padding between rows is never written */
    int pad_ok = 1;
    for (int i = 0; i < M && pad; i++)
        for (int j = N; j < ldc; j++)
            if (memcmp(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], sizeof(float)))
                pad_ok = 0;
    T_OK(pad_ok);
    free(A), free(B), free(C), free(C0);
    return worst;
}

static void test_against_reference(be_backend *be) {
    static const int Ms[] = {1, 3, 5, 8, 9, 50, 256, 515, 1031},
                     Ns[] = {1, 16, 23, 25, 47, 48, 49, 100}, Ks[] = {0, 1, 5, 383, 384, 385, 800};
    double worst = 0;
    int n = 0;
    for (int l = 0; l < 4; l++)
        for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
                for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++) {
                    int M = Ms[a], N = Ns[b], K = Ks[c];
                    if ((double)M * N * K > 2e7) continue; /* the float64 loop's time */
                    float alpha = (a + b) % 3 == 2 ? 0.5f : 1.0f;
                    float beta = c % 3 == 0 ? 0.0f : (c % 3 == 1 ? 1.0f : 0.25f);
                    double e = check_one(be, l >> 1, l & 1, M, N, K, alpha, beta, (int)(b % 2) * 3);
                    if (!(e <= 2e-6)) {
                        fprintf(stderr, "  %s%s M=%d N=%d K=%d alpha=%g beta=%g: error %.3g\n",
                                l >> 1 ? "T" : "N", l & 1 ? "T" : "N", M, N, K, alpha, beta, e);
                    }
                    if (!(e <= worst)) worst = e;
                    n++;
                }
    /* wide: several blocks of panels a thread (few rows, many rows; the
     * other loop order: test_loop_orders) */
    static const int wide[][3] = {{50, 1300, 385}, {520, 200, 130}};
    for (int l = 0; l < 4; l++)
        for (size_t w = 0; w < sizeof wide / sizeof *wide; w++) {
            double e = check_one(be, l >> 1, l & 1, wide[w][0], wide[w][1], wide[w][2], 1.0f,
                                 l % 2 ? 1.0f : 0.0f, 1);
            if (!(e <= 2e-6))
                fprintf(stderr, "  %s%s M=%d N=%d K=%d: error %.3g\n", l >> 1 ? "T" : "N",
                        l & 1 ? "T" : "N", wide[w][0], wide[w][1], wide[w][2], e);
            if (!(e <= worst)) worst = e;
            n++;
        }
    printf("%s: %d products, worst error %.3g of sum |a b|\n",
           be_cpu_gemm_name(be_cpu_gemm_own(be)), n, worst);
    T_OK(worst <= 2e-6);
}

/* C of one GEMM computed whole, by row chunks, by column chunks. */
static void test_split_bits(be_backend *be1, be_backend *be2, be_backend *be3) {
    static const int shapes[][3] = {
        {256, 200, 800}, {1100, 96, 400}, {40, 1000, 384}, {530, 800, 390}, {96, 1500, 100}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int l = 0; l < 4; l++) {
            int ta = l >> 1, tb = l & 1, M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            int lda = ta ? M : K, ldb = tb ? K : N;
            float *A = rnd((size_t)M * K, 21), *B = rnd((size_t)K * N, 22);
            float *C0 = rnd((size_t)M * N, 23);
            size_t bytes = (size_t)M * N * sizeof(float);
            float *W = malloc(bytes), *R = malloc(bytes), *Q = malloc(bytes), *T = malloc(bytes);
            memcpy(W, C0, bytes), memcpy(R, C0, bytes), memcpy(Q, C0, bytes), memcpy(T, C0, bytes);
            be2->gemm(be2, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, W, N, 0, NULL, BE_EPI_NONE,
                      NULL);
            /* rows in uneven chunks (few-rows and many-rows paths alike) */
            static const int rcut[] = {0, 3, 17, 600, 1 << 30};
            for (int r = 0; r + 1 < 5 && rcut[r] < M; r++) {
                int r0 = rcut[r], r1 = rcut[r + 1] < M ? rcut[r + 1] : M;
                const float *Ar = ta ? A + r0 : A + (size_t)r0 * lda;
                be2->gemm(be2, ta, tb, r1 - r0, N, K, 1.0f, Ar, lda, B, ldb, 1.0f,
                          R + (size_t)r0 * N, N, 0, NULL, BE_EPI_NONE, NULL);
            }
            /* columns in uneven chunks */
            static const int ccut[] = {0, 5, 53, 150, 1 << 30};
            for (int c = 0; c + 1 < 5 && ccut[c] < N; c++) {
                int c0 = ccut[c], c1 = ccut[c + 1] < N ? ccut[c + 1] : N;
                const float *Bc = tb ? B + (size_t)c0 * ldb : B + c0;
                be3->gemm(be3, ta, tb, M, c1 - c0, K, 1.0f, A, lda, Bc, ldb, 1.0f, Q + c0, N, 0,
                          NULL, BE_EPI_NONE, NULL);
            }
            be1->gemm(be1, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, T, N, 0, NULL, BE_EPI_NONE,
                      NULL);
            int rows = !memcmp(W, R, bytes), cols = !memcmp(W, Q, bytes),
                thr = !memcmp(W, T, bytes);
            if (!rows || !cols || !thr)
                fprintf(stderr, "  %s%s %dx%dx%d: rows %d cols %d threads %d\n", ta ? "T" : "N",
                        tb ? "T" : "N", M, N, K, rows, cols, thr);
            T_OK(rows);
            T_OK(cols);
            T_OK(thr);
            free(A), free(B), free(C0), free(W), free(R), free(Q), free(T);
        }
}

/* The loop order and blocks follow the core's caches (strip by strip
 * across a block of panels where a panel and a strip overflow L1, else
 * panel by panel; blocks as large as half of L2): whatever they are, the
 * bits are the same.  Each shape on 1, 2 and 3 threads with an L1 of 16 KB
 * and blocks of two panels, then with an L1 of 8 MB, against the machine's
 * own plan. */
static void test_loop_orders(be_backend *be1, be_backend *be2, be_backend *be3) {
    static const int shapes[][3] = {
        {50, 1300, 385}, {520, 300, 390}, {1100, 96, 400}, {40, 1000, 384}, {9, 200, 50}};
    static const size_t plans[][2] = {{16 << 10, 2 * 48 * 384}, {8 << 20, 0}};
    be_backend *bes[3] = {be1, be2, be3};
    int bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int l = 0; l < 4; l++) {
            int ta = l >> 1, tb = l & 1, M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            size_t bytes = (size_t)M * N * sizeof(float);
            float *A = rnd((size_t)M * K, 41), *B = rnd((size_t)K * N, 42);
            float *C0 = rnd((size_t)M * N, 43), *W = malloc(bytes), *X = malloc(bytes);
            memcpy(W, C0, bytes);
            be2->gemm(be2, ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.5f, W, N, 0, NULL,
                      BE_EPI_NONE, NULL);
            for (size_t p = 0; p < sizeof plans / sizeof *plans; p++)
                for (int t = 0; t < 3; t++) {
                    cpu_set_sgemm_caches(bes[t], plans[p][0], plans[p][1]);
                    memcpy(X, C0, bytes);
                    bes[t]->gemm(bes[t], ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.5f,
                                 X, N, 0, NULL, BE_EPI_NONE, NULL);
                    cpu_set_sgemm_caches(bes[t], 0, 0);
                    if (memcmp(W, X, bytes)) {
                        fprintf(stderr,
                                "  %s%s %dx%dx%d: L1 %zu, block %zu, %d threads: bits differ\n",
                                ta ? "T" : "N", tb ? "T" : "N", M, N, K, plans[p][0], plans[p][1],
                                t + 1);
                        bad++;
                    }
                }
            free(A), free(B), free(C0), free(W), free(X);
        }
    T_EQ_INT(bad, 0);
}

/* The AVX2 and AVX-512 kernels give the same bits (the order of every sum
 * depends on K only). */
static void test_kernels_agree(be_backend *be) {
    static const int shapes[][3] = {{256, 768, 768}, {37, 100, 1000}, {700, 50, 300}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int l = 0; l < 4; l++) {
            int ta = l >> 1, tb = l & 1, M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            float *A = rnd((size_t)M * K, 31), *B = rnd((size_t)K * N, 32);
            float *X = rnd((size_t)M * N, 33), *Y = malloc((size_t)M * N * sizeof(float));
            memcpy(Y, X, (size_t)M * N * sizeof(float));
            float *C[2] = {X, Y};
            int kinds[2] = {BE_CPU_GEMM_AVX512, BE_CPU_GEMM_AVX2};
            for (int w = 0; w < 2; w++) {
                T_EQ_INT(be_cpu_gemm_set(be, kinds[w]), MS_OK);
                be->gemm(be, ta, tb, M, N, K, 0.5f, A, ta ? M : K, B, tb ? K : N, 0.25f, C[w], N, 0,
                         NULL, BE_EPI_NONE, NULL);
            }
            int same = !memcmp(X, Y, (size_t)M * N * sizeof(float));
            if (!same)
                fprintf(stderr, "  %s%s %dx%dx%d: AVX2 and AVX-512 kernels differ\n",
                        ta ? "T" : "N", tb ? "T" : "N", M, N, K);
            T_OK(same);
            free(A), free(B), free(X), free(Y);
        }
}

static void test_env_choice(int best) {
    int kind = -1;
    char buf[256];
    set_gemm("own");
    T_EQ_INT(be_cpu_gemm_pick(&kind), MS_OK);
    T_EQ_INT(kind, best);
    set_gemm("own-avx2");
    T_EQ_INT(be_cpu_gemm_pick(&kind), MS_OK);
    T_EQ_INT(kind, BE_CPU_GEMM_AVX2);
    T_STR_CONTAINS(be_cpu_gemm_describe(buf, sizeof buf),
                   "fp32 GEMMs: own AVX2 kernel (MS_CPU_GEMM=own-avx2)");
    set_gemm("own-avx512");
    if (be_cpu_gemm_runs(BE_CPU_GEMM_AVX512)) {
        T_EQ_INT(be_cpu_gemm_pick(&kind), MS_OK);
        T_EQ_INT(kind, BE_CPU_GEMM_AVX512);
    } else {
        T_EQ_INT(be_cpu_gemm_pick(&kind), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), "MS_CPU_GEMM=own-avx512: this CPU (or build) cannot run");
    }
    set_gemm("openblas");
    T_EQ_INT(be_cpu_gemm_pick(&kind), MS_OK);
    T_EQ_INT(kind, BE_CPU_GEMM_OPENBLAS);
    T_STR_CONTAINS(be_cpu_gemm_describe(buf, sizeof buf), "OpenBLAS (MS_CPU_GEMM=openblas)");
    be_backend *be = NULL;
    T_EQ_INT(be_cpu_create(&be, 2), MS_OK);
    T_EQ_INT(be_cpu_gemm_own(be), BE_CPU_GEMM_OPENBLAS);
    be_destroy(be);
    set_gemm("fast");
    T_EQ_INT(be_cpu_gemm_pick(&kind), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(),
                   "MS_CPU_GEMM=fast: expected auto, own, own-avx512, own-avx2 or openblas");
    be = NULL;
    T_EQ_INT(be_cpu_create(&be, 2), MS_ERR_ARG);
    T_OK(be == NULL);
    set_gemm("");
    T_EQ_INT(be_cpu_gemm_pick(&kind), MS_OK);
    T_EQ_INT(kind, best);
    snprintf(buf, sizeof buf, "fp32 GEMMs: %s", be_cpu_gemm_name(best));
    char got[256];
    T_STR_CONTAINS(be_cpu_gemm_describe(got, sizeof got), buf);
}

/* Which kernel each kind of CPU gets (be_cpu_gemm_for), whatever this one
 * is: AVX-512 only at full width, AVX2 on AVX2 CPUs and Zen 4, OpenBLAS
 * without AVX2 and FMA. */
static void test_kernel_choice(void) {
    T_EQ_INT(be_cpu_gemm_for(1, 0, 1), BE_CPU_GEMM_AVX512); /* Skylake-SP.., Zen 5 */
    T_EQ_INT(be_cpu_gemm_for(1, 1, 1), BE_CPU_GEMM_AVX2);   /* Zen 4 */
    T_EQ_INT(be_cpu_gemm_for(0, 0, 1), BE_CPU_GEMM_AVX2);   /* Haswell.., Zen 1-3 */
    T_EQ_INT(be_cpu_gemm_for(0, 0, 0), BE_CPU_GEMM_OPENBLAS);
    T_EQ_INT(be_cpu_gemm_for(1, 0, 0), BE_CPU_GEMM_OPENBLAS); /* no FMA: none */
    int best = be_cpu_gemm_best();
    T_OK(best == BE_CPU_GEMM_OPENBLAS || be_cpu_gemm_runs(best));
    T_OK(be_cpu_gemm_runs(BE_CPU_GEMM_OPENBLAS));
}

int main(void) {
    set_gemm("");
    test_kernel_choice();
    int best = be_cpu_gemm_best();
    if (best == BE_CPU_GEMM_OPENBLAS) {
        int kind = -1;
        set_gemm("own");
        T_EQ_INT(be_cpu_gemm_pick(&kind), MS_ERR_ARG); /* refused, with the reason */
        T_STR_CONTAINS(ms_errmsg(), "AVX2 and FMA");
        set_gemm("");
        T_EQ_INT(be_cpu_gemm_pick(&kind), MS_OK);
        T_EQ_INT(kind, BE_CPU_GEMM_OPENBLAS);
        printf("SKIP: this CPU (or build) has no AVX2 with FMA, so the own fp32 GEMM does not run "
               "here (the CPU backend uses OpenBLAS); only its refusal was checked\n");
        ms_test_summary("test_cpu_sgemm (refusal only)");
        return ms_t_fail ? 1 : 77;
    }
    be_backend *b1 = NULL, *b2 = NULL, *b3 = NULL;
    MS_CHECK(be_cpu_create(&b1, 1) == MS_OK && be_cpu_create(&b2, 2) == MS_OK &&
             be_cpu_create(&b3, 3) == MS_OK);
    T_EQ_INT(be_cpu_gemm_own(b2), best);
    static const int kinds[] = {BE_CPU_GEMM_AVX512, BE_CPU_GEMM_AVX2};
    for (int k = 0; k < 2; k++) {
        if (!be_cpu_gemm_runs(kinds[k])) {
            printf("the %s is not tested: this CPU cannot run it\n", be_cpu_gemm_name(kinds[k]));
            continue;
        }
        T_EQ_INT(be_cpu_gemm_set(b1, kinds[k]), MS_OK);
        T_EQ_INT(be_cpu_gemm_set(b2, kinds[k]), MS_OK);
        T_EQ_INT(be_cpu_gemm_set(b3, kinds[k]), MS_OK);
        test_against_reference(b2);
        test_split_bits(b1, b2, b3);
        test_loop_orders(b1, b2, b3);
    }
    if (be_cpu_gemm_runs(BE_CPU_GEMM_AVX512)) test_kernels_agree(b2);
    test_env_choice(best);
    /* the switch back to OpenBLAS gives OpenBLAS's own result */
    T_EQ_INT(be_cpu_gemm_set(b2, BE_CPU_GEMM_OPENBLAS), MS_OK);
    T_EQ_INT(be_cpu_gemm_own(b2), BE_CPU_GEMM_OPENBLAS);
    double e = check_one(b2, 0, 1, 33, 65, 300, 1.0f, 0.0f, 0);
    T_OK(e <= 2e-6);
    be_destroy(b1), be_destroy(b2), be_destroy(b3);
    return ms_test_summary("test_cpu_sgemm");
}
