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

/* Panels [p0, p1) of op(B) (columns cut at N: the last may have fewer
 * than nr, zero beyond), rows [k0, k0+kb), into bq (panel p at
 * bq + (p-p0)*nr*kb, [k][nr]): the kernel's packing for the whole panels,
 * and plain copies for a panel's last columns or rows (where the kernel's
 * transposing packing stopped).  op(B)(k,j) = tb ? B[j*ldb + k] : B[k*ldb + j]. */
static void pack_panels(const cpu_sgemm_kern *kn, float *restrict bq, const float *B, long ldb,
                        int tb, size_t p0, size_t p1, int N, int k0, int kb) {
    const int nr = kn->nr;
    size_t full = (size_t)N / nr; /* panels of nr columns */
    size_t whole = (full < p1 ? full : p1) - p0;
    int done = whole ? kn->pack_b(bq, B, ldb, tb, (int)p0 * nr, (int)whole, k0, kb) : 0;
    for (size_t p = p0; p < p1; p++) {
        int j0 = (int)p * nr, n = N - j0 < nr ? N - j0 : nr;
        float *bp = bq + (p - p0) * nr * kb;
        for (int k = p - p0 < whole ? done : 0; k < kb; k++)
            for (int j = 0; j < nr; j++)
                bp[(size_t)k * nr + j] = j >= n ? 0.0f
                                         : tb   ? B[(size_t)(j0 + j) * ldb + k0 + k]
                                                : B[(size_t)(k0 + k) * ldb + j0 + j];
    }
}

/* Whether to run each strip of op(A) across a block of panels (the strip
 * stays in L1, the panels stream from L2) rather than each panel past
 * every strip (the panel stays in L1): where a panel and a strip, kb rows
 * each, do not fit in L1 together.  (AVX-512's 48-column panel at KC rows
 * is 72 KB; AVX2's 24 columns, 36 KB, fit a 48 KB L1 with their strip.) */
static int by_strips(const cpu_sgemm_kern *kn, const cpu_sgemm_scratch *s, int kb) {
    return (size_t)(kn->nr + kn->mr) * kb * sizeof(float) > s->l1_bytes;
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

/* Strips [q0, q1) of op(A) against np packed panels of op(B) (bq, [k][nr]
 * each, kb rows; the first at column j0 of C, columns cut at N): strip by
 * strip across the panels where by_strip (the strip stays in L1, the
 * panels stream from L2, C is written row by row), else panel by panel
 * (each panel reused by every strip).  op(A) comes from apk ([k][mr] a
 * strip, strip q0 first) when transposed (apk != NULL), else is read in
 * place, an edge strip packed into edge. */
static void run_tiles(const cpu_sgemm_kern *kn, int by_strip, size_t q0, size_t q1, const float *bq,
                      size_t np, int j0, int N, const float *apk, float *edge, const float *A,
                      int lda, int M, int k0, int kb, float alpha, float beta, float *C, int ldc) {
    const int MR = kn->mr, NR = kn->nr;
    size_t nq = q1 - q0, outer = by_strip ? nq : np, inner = by_strip ? np : nq;
    for (size_t o = 0; o < outer; o++)
        for (size_t u = 0; u < inner; u++) {
            size_t q = q0 + (by_strip ? o : u), p = by_strip ? u : o;
            int i = (int)q * MR, m = M - i < MR ? M - i : MR;
            int jp = j0 + (int)p * NR, n = N - jp < NR ? N - jp : NR;
            const float *b = bq + p * NR * kb;
            float *c = C + (size_t)i * ldc + jp;
            if (apk)
                kn->packed(kb, apk + (q - q0) * MR * kb, b, c, ldc, m, n, alpha, beta, k0 == 0);
            else
                strip(kn, A, lda, 0, i, m, k0, kb, edge, b, c, ldc, n, alpha, beta, k0 == 0);
        }
}

/* Panels [p0, p1) of op(B), k-block [k0, k0+kb), packed into bq, against
 * every strip of op(A) (run_tiles, in the order by_strips says).  op(A) is
 * read in place (an edge strip packed into ap), or from at ([k][mr] a
 * strip, the k-block's) when transposed. */
static void run_block(const cpu_sgemm_kern *kn, const cpu_sgemm_scratch *s, float *bq, float *ap,
                      const float *at, int ta, const float *A, int lda, int tb, const float *B,
                      int ldb, int M, int N, size_t p0, size_t p1, int k0, int kb, float alpha,
                      float beta, float *C, int ldc) {
    const int MR = kn->mr, NR = kn->nr;
    pack_panels(kn, bq, B, ldb, tb, p0, p1, N, k0, kb);
    run_tiles(kn, by_strips(kn, s, kb), 0, (size_t)(M + MR - 1) / MR, bq, p1 - p0, (int)p0 * NR, N,
              ta ? at : NULL, ap, A, lda, M, k0, kb, alpha, beta, C, ldc);
}

/* Few rows (M <= MC, or <= MT when op(A) is transposed): each thread takes its share of op(B)'s
 * panels, a block at a time (run_block). Where a panel and a strip of op(A) do not fit in L1
 * together (by_strips), a block is at most as many panels as half of L2 holds (the share cut
 * evenly) and each strip runs across it: the strip stays in L1 while the panels stream from L2,
 * and C is written row by row. (One panel at a time past every strip left both operands in L2 with
 * AVX-512's 72 KB panels; the weight gradients ran 7% slower on an Emerald Rapids Xeon, while a
 * Zen 5 ran blocks of 1-3 panels 1-3% faster: docs/perf.md.) Otherwise a block is the few panels
 * whose rows span CPU_SGEMM_ROW_BYTES, packed together just before use, each kept in L1 while
 * every strip passes (one panel at a time read AVX2's 96-byte rows of the weights 1.5 lines at a
 * time, and the forward products ran 5% slower on a Xeon: docs/perf.md). op(A) is read in place,
 * or packed once a k-block, shared, when transposed. Where op(A) is read in place and stays in the
 * core's cache (M*K <= CPU_SGEMM_A_CACHED floats), each block runs through all of K before the
 * next, so that its columns of C stay in cache from one k-block to the next (the classifier's
 * logits, 256 x 50257 floats, are larger than the last level cache); otherwise each k-block runs
 * through all the blocks, so that op(A)'s block stays in cache while C is read again. */
static void few_rows(const cpu_sgemm_kern *kn, cpu_sgemm_scratch *s, int threads, int ta, int tb,
                     int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
    const int MR = kn->mr, NR = kn->nr, KC = CPU_SGEMM_KC;
    int panels = (N + NR - 1) / NR, strips = (M + MR - 1) / MR;
    int block_outer = !ta && (size_t)M * K <= CPU_SGEMM_A_CACHED;
    int kmax = K < KC ? K : KC;
    /* the most panels a block (the same for every k-block): as many as half of L2 holds, or
     * in the panel order those that span CPU_SGEMM_ROW_BYTES of a row */
    size_t fit = s->b_block / ((size_t)NR * kmax), row = (size_t)NR * sizeof(float);
    size_t few = by_strips(kn, s, kmax) ? fit : (CPU_SGEMM_ROW_BYTES + row - 1) / row;
    if (few > fit) few = fit;
    if (few < 1) few = 1;
#pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *ap = s->a + (size_t)tid * CPU_SGEMM_A_FLOATS;
        float *bq = s->b + (size_t)tid * s->b_block;
        size_t lo, hi;
        cpu_split((size_t)panels, nt, tid, &lo, &hi);
        /* the share in blocks of at most few panels, as even as they can be:
         * a short last block (8 panels as 7 + 1) reads each strip of op(A)
         * into L1 for one panel's work */
        size_t blocks = (hi - lo + few - 1) / few;
        if (block_outer) {
            for (size_t b = 0; b < blocks; b++)
                for (int k0 = 0; k0 < K; k0 += KC)
                    run_block(kn, s, bq, ap, NULL, 0, A, lda, tb, B, ldb, M, N,
                              lo + (hi - lo) * b / blocks, lo + (hi - lo) * (b + 1) / blocks, k0,
                              K - k0 < KC ? K - k0 : KC, alpha, beta, C, ldc);
        } else {
            for (int k0 = 0; k0 < K; k0 += KC) {
                int kb = K - k0 < KC ? K - k0 : KC;
                if (ta) {
#pragma omp for schedule(static)
                    for (int q = 0; q < strips; q++)
                        pack_a(s->at + (size_t)q * MR * kb, MR, A, lda, 1, q * MR,
                               M - q * MR < MR ? M - q * MR : MR, k0, kb);
                }
                for (size_t b = 0; b < blocks; b++)
                    run_block(kn, s, bq, ap, s->at, ta, A, lda, tb, B, ldb, M, N,
                              lo + (hi - lo) * b / blocks, lo + (hi - lo) * (b + 1) / blocks, k0,
                              kb, alpha, beta, C, ldc);
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
                /* this thread's share of the block's panels, in one call (row
                 * by row across them), then every thread's */
                size_t p0, p1;
                cpu_split((size_t)panels, nt, tid, &p0, &p1);
                if (p1 > p0)
                    pack_panels(kn, bpk + p0 * NR * kb, B + (tb ? (size_t)j0 * ldb : (size_t)j0),
                                ldb, tb, p0, p1, nb, k0, kb);
#pragma omp barrier
                for (size_t s0 = lo; s0 < hi; s0 += block) {
                    size_t s1 = s0 + block < hi ? s0 + block : hi;
                    if (ta)
                        for (size_t q = s0; q < s1; q++) {
                            int i = (int)q * MR;
                            pack_a(ap + (q - s0) * MR * kb, MR, A, lda, 1, i,
                                   M - i < MR ? M - i : MR, k0, kb);
                        }
                    /* strip by strip across groups of the block's panels that stay in
                     * L2 (as even as they can be), where a panel and a strip do not fit
                     * in L1 together; an edge strip is packed after the block's strips.
                     * (All the panels at once, or panel by panel where they did not fit:
                     * 4096 x 1056 x 256, 22 panels, ran 10% slower than 21 panels on a
                     * Xeon with 2 MB of L2, docs/perf.md.) */
                    int by_strip = by_strips(kn, s, kb);
                    size_t few = by_strip ? s->b_block / ((size_t)NR * kb) : (size_t)panels;
                    size_t groups = ((size_t)panels + few - 1) / few;
                    for (size_t g = 0; g < groups; g++) {
                        size_t g0 = (size_t)panels * g / groups,
                               g1 = (size_t)panels * (g + 1) / groups;
                        run_tiles(kn, by_strip, s0, s1, bpk + g0 * NR * kb, g1 - g0,
                                  j0 + (int)g0 * NR, j0 + nb, ta ? ap : NULL,
                                  ap + (s1 - s0) * MR * kb, A, lda, M, k0, kb, alpha, beta, C, ldc);
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
