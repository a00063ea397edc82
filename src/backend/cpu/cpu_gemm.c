/* cpu_gemm.c - matrix multiply (the own kernels of cpu_sgemm.c, or
 * OpenBLAS's sgemm) with bias / GeLU epilogues, and the bias gradient. */
#include <omp.h>
#include <unistd.h>

#include <cblas.h>

#include "backend/cpu/cpu_internal.h"
#include "base/arena.h"

/* Columns per block in bias_bwd: one thread sums a block over all rows. */
#define CPU_BIAS_BLOCK 64

/* A cache's size in bytes from sysconf (name), else dflt where the system
 * does not say (0 or -1: some VMs and containers), within [lo, hi]. */
static size_t cache_bytes(int name, size_t dflt, size_t lo, size_t hi) {
    long v = sysconf(name);
    size_t b = v > 0 ? (size_t)v : dflt;
    return b < lo ? lo : b > hi ? hi : b;
}

ms_status cpu_sgemm_scratch_init(cpu_sgemm_scratch *s, int threads) {
    size_t l1 = cache_bytes(_SC_LEVEL1_DCACHE_SIZE, 32 << 10, 16 << 10, 1 << 20);
    size_t l2 = cache_bytes(_SC_LEVEL2_CACHE_SIZE, 1 << 20, 256 << 10, 8 << 20);
    /* few_rows: a block of panels a thread, at least one; many_rows: NC
     * columns of panels, shared */
    size_t block = l2 / 2 / sizeof(float);
    if (block < (size_t)CPU_SGEMM_NR_MAX * CPU_SGEMM_KC)
        block = (size_t)CPU_SGEMM_NR_MAX * CPU_SGEMM_KC;
    size_t floats = (size_t)threads * block;
    if (floats < (size_t)(CPU_SGEMM_NC + CPU_SGEMM_NR_MAX) * CPU_SGEMM_KC)
        floats = (size_t)(CPU_SGEMM_NC + CPU_SGEMM_NR_MAX) * CPU_SGEMM_KC;
    cpu_sgemm_scratch n = {
        .threads = threads,
        .l1_bytes = l1,
        .b_block = block,
        .l1_sys = l1,
        .b_block_max = block,
        .b = ms_alloc_aligned(floats * sizeof(float)),
        .at = ms_alloc_aligned((size_t)(CPU_SGEMM_MT + CPU_SGEMM_MR_MAX) * CPU_SGEMM_KC *
                               sizeof(float)),
        .a = ms_alloc_aligned((size_t)threads * CPU_SGEMM_A_FLOATS * sizeof(float))};
    if (!n.b || !n.at || !n.a) {
        cpu_sgemm_scratch_free(&n);
        return ms_error(MS_ERR_NOMEM,
                        "cpu backend: out of memory for the GEMM's packing buffers "
                        "(%d threads)",
                        threads);
    }
    cpu_sgemm_scratch_free(s);
    *s = n;
    return MS_OK;
}

void cpu_sgemm_scratch_free(cpu_sgemm_scratch *s) {
    ms_free_aligned(s->b);
    ms_free_aligned(s->at);
    ms_free_aligned(s->a);
    *s = (cpu_sgemm_scratch){0};
}

void cpu_sgemm(cpu_ctx *c, int ta, int tb, int M, int N, int K, float alpha, const float *A,
               int lda, const float *B, int ldb, float beta, float *C, int ldc) {
#if CPU_SGEMM_OWN
    if (c->gemm_kern) {
        cpu_sgemm_own(c->gemm_kern, &c->sg, c->threads, ta, tb, M, N, K, alpha, A, lda, B, ldb,
                      beta, C, ldc);
        return;
    }
#endif
    cpu_blas_threads(c);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* C (M,N) = alpha op(A) op(B) + beta C [+ bias (N)], or with BE_EPI_GELU
 * pre (M,N) = alpha op(A) op(B) + bias, C = gelu(pre).  op(A) (M,K) from A
 * (M,K) or (K,M) if ta; op(B) (K,N) from B (K,N) or (N,K) if tb.  pre has
 * the row stride ldc of C.  c_f32 is irrelevant here (act is fp32). */
void cpu_gemm(be_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
              int lda, const void *Bm, int ldb, float beta, void *C, int ldc, int c_f32,
              const void *bias, be_epilogue epi, void *pre) {
    cpu_ctx *cx = cpu_ctx_of(be);
    if (M <= 0 || N <= 0) return;
    float *dst = C;
    if (epi == BE_EPI_GELU) {
        MS_CHECKF(pre != NULL && beta == 0.0f, "gemm: the GeLU epilogue needs pre and beta 0");
        dst = pre;
    }
    cpu_sgemm(cx, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, dst, ldc);
    const float *bs = bias;
    float *out = C;
    if (epi == BE_EPI_GELU) {
#pragma omp parallel for schedule(static) num_threads(cx->threads)
        for (int r = 0; r < M; r++) {
            float *restrict p = dst + (size_t)r * ldc;
            float *restrict y = out + (size_t)r * ldc;
            if (bs)
                for (int c = 0; c < N; c++)
                    p[c] += bs[c];
            for (int c = 0; c < N; c++)
                y[c] = cpu_gelu(p[c]);
        }
    } else if (bs) {
#pragma omp parallel for schedule(static) num_threads(cx->threads)
        for (int r = 0; r < M; r++) {
            float *restrict y = out + (size_t)r * ldc;
            for (int c = 0; c < N; c++)
                y[c] += bs[c];
        }
    }
}

/* dbias (N) += column sums of dout (M,N).  Parallel over blocks of
 * columns; each block is summed over the rows in order (deterministic for
 * any thread count). */
void cpu_bias_bwd(be_backend *be, float *dbias, const void *dout, int M, int N) {
    const float *d = dout;
    int nblk = (N + CPU_BIAS_BLOCK - 1) / CPU_BIAS_BLOCK;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CPU_BIAS_BLOCK;
        int w = N - c0 < CPU_BIAS_BLOCK ? N - c0 : CPU_BIAS_BLOCK;
        float acc[CPU_BIAS_BLOCK] = {0};
        if (w == CPU_BIAS_BLOCK) {
            for (int r = 0; r < M; r++) {
                const float *restrict g = d + (size_t)r * N + c0;
                for (int j = 0; j < CPU_BIAS_BLOCK; j++)
                    acc[j] += g[j];
            }
        } else {
            for (int r = 0; r < M; r++) {
                const float *restrict g = d + (size_t)r * N + c0;
                for (int j = 0; j < w; j++)
                    acc[j] += g[j];
            }
        }
        for (int j = 0; j < w; j++)
            dbias[c0 + j] += acc[j];
    }
}
