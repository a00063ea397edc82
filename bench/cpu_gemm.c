/* bench/cpu_gemm.c (built as build/tests/bench_cpu_gemm): the CPU backend's
 * own fp32 GEMM against OpenBLAS, shape by shape, in the same run.
 *
 * The shapes are a GPT-2 step's: for each model case (model:B:T, the
 * presets' widths) the forward (NN), input-gradient (NT) and
 * weight-gradient (TN, accumulating) products of the qkv, projection and
 * MLP layers, and the classifier's three.  Each GEMM cycles through
 * --sets copies of its weight operand (12 by default, more than the last
 * level cache holds for the 124M model), as in a step, where every layer's
 * weights come from memory.  Calls alternate between the two
 * implementations; each figure is the median over --reps calls.  Prints
 * GFLOP/s and own / OpenBLAS per shape, and the sum over the shapes
 * weighted by their count in a step.
 *
 * --kernel chooses the own kernel: avx512 or avx2 (default: the one
 * megascale picks on this CPU).  OpenBLAS runs the kernels of the same
 * width (OPENBLAS_CORETYPE SkylakeX or Haswell), so that on an AVX-512
 * machine "--kernel avx2" compares the two as an AVX2 machine would.
 * --l1 and --l2 (bytes) plan the own kernel's blocks as for a CPU with
 * those caches (the loop order and blocks only: the caches stay this
 * CPU's), e.g. "--kernel avx2 --l1 32768 --l2 524288" as AMD's Zen 2 and 3
 * would order them.
 *
 * usage: bench_cpu_gemm [--threads 2] [--reps 9] [--sets 12]
 *                       [--cases d12:4:64,d6:8:256] [--kernel avx512|avx2]
 *                       [--l1 BYTES] [--l2 BYTES] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/arena.h"
#include "base/rng.h"
#include "base/timeutil.h"

typedef struct {
    const char *what;
    int ta, tb, M, N, K, count; /* count: calls a step */
    float beta;
} shape;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *fill(size_t n, uint64_t seed) {
    float *p = ms_alloc_aligned(n * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench_cpu_gemm: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = ms_rng_uniform(seed, 5, i) - 0.5f;
    return p;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_cpu_gemm [--threads N] [--reps N] [--sets N] "
                    "[--cases d12:4:64,d6:8:256] [--kernel avx512|avx2] [--l1 BYTES] "
                    "[--l2 BYTES]\n");
    return 2;
}

int main(int argc, char **argv) {
    int threads = 2, reps = 9, sets = 12, kind = be_cpu_gemm_best();
    const char *cases = "d12:4:64,d6:8:256";
    long l1 = 0, l2 = 0; /* 0: this CPU's */
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 == argc) /* a flag without its value, or --help */
            return usage();
        if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--sets"))
            sets = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cases"))
            cases = argv[i + 1];
        else if (!strcmp(argv[i], "--kernel") && !strcmp(argv[i + 1], "avx512"))
            kind = BE_CPU_GEMM_AVX512;
        else if (!strcmp(argv[i], "--kernel") && !strcmp(argv[i + 1], "avx2"))
            kind = BE_CPU_GEMM_AVX2;
        else if (!strcmp(argv[i], "--l1"))
            l1 = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--l2"))
            l2 = atol(argv[i + 1]);
        else
            return usage();
    }
    if (threads < 1 || reps < 1 || sets < 1 || sets > 64 || l1 < 0 || (l1 && l1 < 4096) || l2 < 0 ||
        (l2 && l2 < 65536)) {
        fprintf(stderr, "bench_cpu_gemm: --threads, --reps >= 1, --sets in [1, 64], --l1 >= 4096 "
                        "and --l2 >= 65536 bytes\n");
        return 2;
    }
    if (kind == BE_CPU_GEMM_OPENBLAS || !be_cpu_gemm_runs(kind)) {
        printf("SKIP: this CPU runs no own fp32 GEMM%s (it needs AVX2 and FMA, or AVX-512): the "
               "CPU backend's fp32 GEMMs run on OpenBLAS here, there is nothing to compare\n",
               kind == BE_CPU_GEMM_OPENBLAS ? "" : " of that width");
        return 0;
    }
    /* OpenBLAS on the kernels of the own kernel's width: those megascale
     * itself would ask for (src/cli/main.c), or AVX2's to compare with the
     * own AVX2 kernel on an AVX-512 CPU; the library reads the variable
     * when it loads, so the program runs itself again */
    const char *core = kind == BE_CPU_GEMM_AVX2 && be_cpu_gemm_best() == BE_CPU_GEMM_AVX512
                           ? "Haswell"
                           : be_cpu_blas_core_suggest();
    if (core && !getenv("MS_BENCH_GEMM_AGAIN")) {
        setenv("OPENBLAS_CORETYPE", core, 1);
        setenv("MS_BENCH_GEMM_AGAIN", "1", 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "bench_cpu_gemm: could not run again with OPENBLAS_CORETYPE=%s\n", core);
    }
    be_backend *be = NULL;
    if (be_cpu_create(&be, threads) != MS_OK) {
        fprintf(stderr, "bench_cpu_gemm: %s\n", ms_errmsg());
        return 1;
    }
    cpu_set_sgemm_caches(be, (size_t)l1, (size_t)l2 / 2 / sizeof(float));
    char blas[320], plan[96] = "";
    if (l1 || l2)
        snprintf(plan, sizeof plan, ", blocks planned for an L1 of %ld KB and an L2 of %ld KB",
                 (l1 ? l1 : sysconf(_SC_LEVEL1_DCACHE_SIZE)) / 1024,
                 (l2 ? l2 : sysconf(_SC_LEVEL2_CACHE_SIZE)) / 1024);
    printf("%s against OpenBLAS (%s), %d threads, medians of %d calls, weights cycling through "
           "%d copies%s\n",
           be_cpu_gemm_name(kind), be_cpu_blas_describe(blas, sizeof blas), threads, reps, sets,
           plan);
    printf("%-10s %-4s %-20s %6s %10s %10s %8s\n", "case", "op", "shape MxNxK", "calls", "OpenBLAS",
           "own", "own/OB");
    char *list = strdup(cases);
    for (char *save = NULL, *c = strtok_r(list, ",", &save); c; c = strtok_r(NULL, ",", &save)) {
        char model[16];
        int B, T;
        if (sscanf(c, "%15[^:]:%d:%d", model, &B, &T) != 3 || B < 1 || T < 1) {
            fprintf(stderr, "bench_cpu_gemm: case \"%s\" is not model:B:T\n", c);
            return 2;
        }
        int L = !strcmp(model, "d6")    ? 6
                : !strcmp(model, "d12") ? 12
                : !strcmp(model, "d24") ? 24
                                        : 0;
        int C = L == 6 ? 384 : L == 12 ? 768 : 1024, V = 50257, N = B * T;
        if (!L) {
            fprintf(stderr, "bench_cpu_gemm: model %s: d6, d12 or d24\n", model);
            return 2;
        }
        shape sh[] = {
            {"qkv", 0, 0, N, 3 * C, C, L, 0},    {"qkv dX", 0, 1, N, C, 3 * C, L, 0},
            {"qkv dW", 1, 0, C, 3 * C, N, L, 1}, {"proj", 0, 0, N, C, C, L, 0},
            {"proj dX", 0, 1, N, C, C, L, 0},    {"proj dW", 1, 0, C, C, N, L, 1},
            {"fc", 0, 0, N, 4 * C, C, L, 0},     {"fc dX", 0, 1, N, C, 4 * C, L, 0},
            {"fc dW", 1, 0, C, 4 * C, N, L, 1},  {"fc2", 0, 0, N, C, 4 * C, L, 0},
            {"fc2 dX", 0, 1, N, 4 * C, C, L, 0}, {"fc2 dW", 1, 0, 4 * C, C, N, L, 1},
            {"logits", 0, 1, N, V, C, 1, 0},     {"cls dX", 0, 0, N, C, V, 1, 0},
            {"cls dW", 1, 0, V, C, N, 1, 1},
        };
        double sum[2] = {0, 0};
        for (size_t s = 0; s < sizeof sh / sizeof *sh; s++) {
            shape *g = &sh[s];
            /* the weight is B for the forward and dX products (W or W^T),
             * for dW the accumulated C; the activations are A */
            int wB = !g->ta;
            size_t na = (size_t)g->M * g->K, nb = (size_t)g->K * g->N, nc = (size_t)g->M * g->N;
            /* a weight larger than any cache is cold without copies */
            double wbytes = 4.0 * (wB ? nb : nc);
            int nset = wbytes > 64e6 ? 1 : sets;
            float *A = fill(na, 1), *Bs[64], *Cs[64];
            for (int k = 0; k < nset; k++) {
                Bs[k] = wB || k == 0 ? fill(nb, 2 + k) : Bs[0];
                Cs[k] = !wB || k == 0 ? fill(nc, 100 + k) : Cs[0];
            }
            double *t[2] = {malloc(reps * sizeof(double)), malloc(reps * sizeof(double))};
            for (int r = -1; r < reps; r++) /* r = -1 warms up */
                for (int w = 0; w < 2; w++) {
                    if (be_cpu_gemm_set(be, w ? kind : BE_CPU_GEMM_OPENBLAS) != MS_OK) {
                        fprintf(stderr, "bench_cpu_gemm: %s\n", ms_errmsg());
                        return 1;
                    }
                    double spent = 0;
                    for (int k = 0; k < nset; k++) {
                        int ix = (r + 1 + k) % nset;
                        double t0 = ms_now();
                        be->gemm(be, g->ta, g->tb, g->M, g->N, g->K, 1.0f, A, g->ta ? g->M : g->K,
                                 Bs[ix], g->tb ? g->K : g->N, g->beta, Cs[ix], g->N, 0, NULL,
                                 BE_EPI_NONE, NULL);
                        spent += ms_now() - t0;
                    }
                    if (r >= 0) t[w][r] = spent / nset;
                }
            double med[2];
            for (int w = 0; w < 2; w++) {
                qsort(t[w], reps, sizeof(double), cmp_d);
                med[w] = t[w][reps / 2];
                sum[w] += med[w] * g->count;
            }
            double fl = 2.0 * g->M * (double)g->N * g->K;
            char dims[32];
            snprintf(dims, sizeof dims, "%dx%dx%d", g->M, g->N, g->K);
            printf("%-10s %-4s %-20s %6d %10.1f %10.1f %8.3f   %s\n", c,
                   g->ta   ? "TN"
                   : g->tb ? "NT"
                           : "NN",
                   dims, g->count, fl / med[0] / 1e9, fl / med[1] / 1e9, med[0] / med[1], g->what);
            free(t[0]), free(t[1]);
            for (int k = 0; k < nset; k++) {
                if (wB || k == 0) ms_free_aligned(Bs[k]);
                if (!wB || k == 0) ms_free_aligned(Cs[k]);
            }
            ms_free_aligned(A);
        }
        printf("%-10s the step's GEMMs: OpenBLAS %.1f ms, own %.1f ms: own is %.3fx\n", c,
               sum[0] * 1e3, sum[1] * 1e3, sum[0] / sum[1]);
    }
    free(list);
    be_destroy(be);
    return 0;
}
