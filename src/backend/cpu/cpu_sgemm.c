/* cpu_sgemm.c - the CPU backend's own fp32 GEMM: the blocking and threads
 * around a microkernel for the CPU's vector width (cpu_sgemm_avx512.c: an
 * 8 x 48 tile for full-width AVX-512; cpu_sgemm_avx2.c: 4 x 24 for AVX2).
 *
 * Why not OpenBLAS: the step's GEMMs have few rows (M = B*T = 256 tokens on
 * GPT-2 124M at B=4, T=64), and there OpenBLAS 0.3.21's kernels reach
 * 75-89% of their 2048^3 rate, because packing both operands costs as
 * much as a large share of the multiply.  This GEMM packs only what the
 * microkernel needs contiguous (docs/perf.md, "Our own fp32 GEMM"):
 *   - op(B) in panels of NR columns by KC rows, k-major ([k][NR]); the
 *     weights are read once a GEMM;
 *   - op(A) is read in place when it is row-major (NN, NT: the activations),
 *     and packed [k][MR] per strip of rows when transposed (TN: the weight
 *     gradients), where its columns would otherwise be strided.
 *
 * Bits.  Every element of C is computed by one sequence of operations that
 * depends only on K: over k-blocks [0,KC), [KC,2KC), ... (the last one
 * shorter) an FMA chain in k order from zero; the first block's sum is
 * scaled by alpha and added to beta*C (C is not read when beta is 0), every
 * later one added to C.  So the result does not depend on M, N, where the
 * element sits in the matrix, the block sizes of M and N, the number of
 * threads or the kernel (AVX2 and AVX-512 give the same bits): a GEMM split
 * into row or column chunks (the tensor-parallel overlap) gives the whole
 * GEMM's bits.
 *
 * Threads: with few rows the threads share out B's panels (few_rows); with
 * more they share out A's rows (many_rows).  Called from inside a parallel
 * region it runs on the calling thread alone.
 *
 * This file holds no vector code: it is compiled for the build's target and
 * calls the kernel it is given, which the backend picks only where the CPU
 * runs it (be_cpu_gemm_runs). */
#include "backend/cpu/cpu_internal.h"

#if CPU_SGEMM_OWN

#include <omp.h>

/* Rows [i0, i0+m) (m <= mr, zero beyond) of op(A), columns [k0, k0+kb),
 * into ap[k][mr].  op(A)(i,k) = ta ? A[k*lda + i] : A[i*lda + k]. */
static void pack_a(float *restrict ap, int mr, const float *A, long lda, int ta, int i0, int m,
                   int k0, int kb) {
    if (ta && m == mr && (mr == 4 || mr == 8)) { /* sizes the compiler copies inline */
        const float *src = A + (size_t)k0 * lda + i0;
        if (mr == 8)
            for (int k = 0; k < kb; k++)
                memcpy(ap + (size_t)k * 8, src + (size_t)k * lda, 8 * sizeof(float));
        else
            for (int k = 0; k < kb; k++)
                memcpy(ap + (size_t)k * 4, src + (size_t)k * lda, 4 * sizeof(float));
        return;
    }
    for (int k = 0; k < kb; k++)
        for (int i = 0; i < mr; i++)
            ap[(size_t)k * mr + i] = i >= m ? 0.0f
                                            : (ta ? A[(size_t)(k0 + k) * lda + i0 + i]
                                                  : A[(size_t)(i0 + i) * lda + k0 + k]);
}

/* A panel of op(B), columns [j0, j0+n) (n <= nr, zero beyond), rows
 * [k0, k0+kb), into bp[k][nr]: the kernel's packing for whole panels, and
 * plain copies for a panel's last columns or rows (where the kernel's
 * transposing packing stopped).  op(B)(k,j) = tb ? B[j*ldb + k] : B[k*ldb + j]. */
static void pack_panel(const cpu_sgemm_kern *kn, float *restrict bp, const float *B, long ldb,
                       int tb, int j0, int n, int k0, int kb) {
    const int nr = kn->nr;
    for (int k = n == nr ? kn->pack_b(bp, B, ldb, tb, j0, k0, kb) : 0; k < kb; k++)
        for (int j = 0; j < nr; j++)
            bp[(size_t)k * nr + j] = j >= n ? 0.0f
                                     : tb   ? B[(size_t)(j0 + j) * ldb + k0 + k]
                                            : B[(size_t)(k0 + k) * ldb + j0 + j];
}

/* One strip of op(A) (rows [i, i+m), m <= mr) against B's panel bp: read in
 * place when A is row-major with mr rows, packed into ap otherwise. */
static void strip(const cpu_sgemm_kern *kn, const float *A, long lda, int ta, int i, int m, int k0,
                  int kb, float *ap, const float *bp, float *C, long ldc, int n, float alpha,
                  float beta, int first) {
    if (!ta && m == kn->mr) {
        kn->rows(kb, A + (size_t)i * lda + k0, lda, bp, C, ldc, n, alpha, beta, first);
        return;
    }
    pack_a(ap, kn->mr, A, lda, ta, i, m, k0, kb);
    kn->packed(kb, ap, bp, C, ldc, m, n, alpha, beta, first);
}

/* All strips of op(A) (rows [0, M)) against the panel bp of op(B): the
 * columns [j0, j0+n) of C, the k-block [k0, k0+kb).  op(A) is read in place,
 * or from at ([k][mr] a strip, the block's) when transposed. */
static void panel_strips(const cpu_sgemm_kern *kn, int ta, const float *A, long lda,
                         const float *at, float *ap, const float *bp, int M, int j0, int n, int k0,
                         int kb, float alpha, float beta, float *C, long ldc) {
    const int MR = kn->mr, first = k0 == 0;
    for (int i = 0; i < M; i += MR) {
        int m = M - i < MR ? M - i : MR;
        float *c = C + (size_t)i * ldc + j0;
        if (ta)
            kn->packed(kb, at + (size_t)i * kb, bp, c, ldc, m, n, alpha, beta, first);
        else
            strip(kn, A, lda, 0, i, m, k0, kb, ap, bp, c, ldc, n, alpha, beta, first);
    }
}

/* Few rows (M <= MC, or <= MT when op(A) is transposed): each thread takes
 * its share of op(B)'s panels and packs each one just before multiplying
 * it, so that the next panel's packing follows the last one's compute on
 * the same core; op(A) is read in place, or packed once a k-block, shared,
 * when transposed.  Where op(A) is read in place and stays in the core's
 * cache (M*K <= CPU_SGEMM_A_CACHED floats), each panel runs through all
 * of K before the next, so that its columns of C stay in cache from one
 * k-block to the next (the classifier's logits, 256 x 50257 floats, are
 * larger than the last level cache); otherwise each k-block runs through
 * all the panels, so that op(A)'s block stays in cache while C is read
 * again. */
static void few_rows(const cpu_sgemm_kern *kn, cpu_sgemm_scratch *s, int threads, int ta, int tb,
                     int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
    const int MR = kn->mr, NR = kn->nr, KC = CPU_SGEMM_KC;
    int panels = (N + NR - 1) / NR, strips = (M + MR - 1) / MR;
    int panel_outer = !ta && (size_t)M * K <= CPU_SGEMM_A_CACHED;
#pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *ap = s->a + (size_t)tid * CPU_SGEMM_A_FLOATS;
        float *bp = s->b + (size_t)tid * CPU_SGEMM_NR_MAX * KC;
        size_t lo, hi;
        cpu_split((size_t)panels, nt, tid, &lo, &hi);
        if (panel_outer) {
            for (size_t p = lo; p < hi; p++) {
                int j0 = (int)p * NR, n = N - j0 < NR ? N - j0 : NR;
                for (int k0 = 0; k0 < K; k0 += KC) {
                    int kb = K - k0 < KC ? K - k0 : KC;
                    pack_panel(kn, bp, B, ldb, tb, j0, n, k0, kb);
                    panel_strips(kn, 0, A, lda, NULL, ap, bp, M, j0, n, k0, kb, alpha, beta, C,
                                 ldc);
                }
            }
        } else {
            for (int k0 = 0; k0 < K; k0 += KC) {
                int kb = K - k0 < KC ? K - k0 : KC;
                if (ta) {
#pragma omp for schedule(static)
                    for (int q = 0; q < strips; q++)
                        pack_a(s->at + (size_t)q * MR * kb, MR, A, lda, 1, q * MR,
                               M - q * MR < MR ? M - q * MR : MR, k0, kb);
                }
                for (size_t p = lo; p < hi; p++) {
                    int j0 = (int)p * NR, n = N - j0 < NR ? N - j0 : NR;
                    pack_panel(kn, bp, B, ldb, tb, j0, n, k0, kb);
                    panel_strips(kn, ta, A, lda, s->at, ap, bp, M, j0, n, k0, kb, alpha, beta, C,
                                 ldc);
                }
                if (ta) { /* the shared op(A) is packed again for the next k-block */
#pragma omp barrier
                }
            }
        }
    }
}

/* Many rows: the threads pack op(B)'s panels of a block of NC columns
 * together, then each multiplies them by its share of op(A)'s rows, in
 * blocks of MC rows (packed once a block when transposed). */
static void many_rows(const cpu_sgemm_kern *kn, cpu_sgemm_scratch *s, int threads, int ta, int tb,
                      int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc) {
    const int MR = kn->mr, NR = kn->nr;
    float *bpk = s->b;
#pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *ap = s->a + (size_t)tid * CPU_SGEMM_A_FLOATS;
        size_t lo, hi;
        cpu_split((size_t)(M + MR - 1) / MR, nt, tid, &lo, &hi);
        size_t block = (size_t)CPU_SGEMM_MC / MR; /* strips a block */
        for (int j0 = 0; j0 < N; j0 += CPU_SGEMM_NC) {
            int nb = N - j0 < CPU_SGEMM_NC ? N - j0 : CPU_SGEMM_NC;
            int panels = (nb + NR - 1) / NR;
            for (int k0 = 0; k0 < K; k0 += CPU_SGEMM_KC) {
                int kb = K - k0 < CPU_SGEMM_KC ? K - k0 : CPU_SGEMM_KC;
                int first = k0 == 0;
#pragma omp for schedule(static)
                for (int p = 0; p < panels; p++) {
                    int n = nb - p * NR < NR ? nb - p * NR : NR;
                    pack_panel(kn, bpk + (size_t)p * NR * kb, B, ldb, tb, j0 + p * NR, n, k0, kb);
                }
                for (size_t s0 = lo; s0 < hi; s0 += block) {
                    size_t s1 = s0 + block < hi ? s0 + block : hi;
                    if (ta)
                        for (size_t q = s0; q < s1; q++) {
                            int i = (int)q * MR;
                            pack_a(ap + (q - s0) * MR * kb, MR, A, lda, 1, i,
                                   M - i < MR ? M - i : MR, k0, kb);
                        }
                    for (int p = 0; p < panels; p++) {
                        int n = nb - p * NR < NR ? nb - p * NR : NR;
                        const float *bp = bpk + (size_t)p * NR * kb;
                        for (size_t q = s0; q < s1; q++) {
                            int i = (int)q * MR, m = M - i < MR ? M - i : MR;
                            float *c = C + (size_t)i * ldc + j0 + p * NR;
                            if (ta)
                                kn->packed(kb, ap + (q - s0) * MR * kb, bp, c, ldc, m, n, alpha,
                                           beta, first);
                            else /* an edge strip is packed after the block's */
                                strip(kn, A, lda, 0, i, m, k0, kb, ap + (s1 - s0) * MR * kb, bp, c,
                                      ldc, n, alpha, beta, first);
                        }
                    }
                }
#pragma omp barrier /* the panels are packed again for the next block */
            }
        }
    }
}

void cpu_sgemm_own(const cpu_sgemm_kern *kn, cpu_sgemm_scratch *s, int threads, int ta, int tb,
                   int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* C = beta C */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    if (omp_in_parallel()) threads = 1;
    MS_CHECKF(threads >= 1 && threads <= s->threads, "sgemm: %d threads but buffers for %d",
              threads, s->threads);
    MS_CHECKF(kn->mr <= CPU_SGEMM_MR_MAX && kn->nr <= CPU_SGEMM_NR_MAX,
              "sgemm: a %d x %d tile does not fit the buffers", kn->mr, kn->nr);
    if (M <= (ta ? CPU_SGEMM_MT : CPU_SGEMM_MC))
        few_rows(kn, s, threads, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        many_rows(kn, s, threads, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#endif /* CPU_SGEMM_OWN */
