/* cpu_sgemm.c - the CPU backend's own fp32 GEMM for CPUs with full-width
 * AVX-512 (Intel since Skylake-SP, AMD since Zen 5).
 *
 * Why not OpenBLAS: the step's GEMMs have few rows (M = B*T = 256 tokens on
 * GPT-2 124M at B=4, T=64), and there OpenBLAS 0.3.21's SkylakeX kernels
 * reach 80-89% of their 2048^3 rate, because packing both operands costs as
 * much as a large share of the multiply.  This GEMM packs only what the
 * microkernel needs contiguous (docs/perf.md, "Our own fp32 GEMM"):
 *   - op(B) in panels of NR = 48 columns by KC rows, k-major ([k][48]),
 *     shared by the threads; the weights are read once a GEMM;
 *   - op(A) is read in place when it is row-major (NN, NT: the activations),
 *     and packed [k][8] per block of rows when transposed (TN: the weight
 *     gradients), where its columns would otherwise be strided.
 * The microkernel keeps an 8 x 48 tile of C in 24 zmm registers.
 *
 * Bits.  Every element of C is computed by one sequence of operations that
 * depends only on K: over k-blocks [0,KC), [KC,2KC), ... (the last one
 * shorter) an FMA chain in k order from zero; the first block's sum is
 * scaled by alpha and added to beta*C (C is not read when beta is 0), every
 * later one added to C.  So the result does not depend on M, N, where the
 * element sits in the matrix, the block sizes of M and N or the number of
 * threads: a GEMM split into row or column chunks (the tensor-parallel
 * overlap) gives the whole GEMM's bits.
 *
 * Threads: with few rows the threads share out B's panels (few_rows); with
 * more they share out A's rows (many_rows).  Called from inside a parallel
 * region it runs on the calling thread alone.
 *
 * This file is compiled for AVX-512 whatever the build targets (the pragma
 * below); cpu_gemm.c calls it only where cpu_sgemm_runs_here() says the CPU
 * has AVX-512, so the binary still runs on any x86-64. */
#include "backend/cpu/cpu_internal.h"

#if CPU_SGEMM_OWN

#include <immintrin.h>
#include <omp.h>

#pragma GCC target("avx512f,avx2,fma")

#define MR CPU_SGEMM_MR
#define NR CPU_SGEMM_NR

/* C tile (m x n, m <= 8, n <= 48, row stride ldc) from the accumulators:
 * first block: alpha*acc (+ beta*C); later blocks: C + alpha*acc. */
static inline __attribute__((always_inline)) void store_tile(__m512 acc[MR][3], float *C, long ldc,
                                                             int m, int n, float alpha, float beta,
                                                             int first) {
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < 3; j++) {
            int w = n - 16 * j;
            if (w <= 0) break;
            __mmask16 mk = (__mmask16)(w >= 16 ? 0xffffu : (1u << w) - 1u);
            float *p = C + (size_t)i * ldc + 16 * j;
            __m512 v = alpha == 1.0f ? acc[i][j] : _mm512_mul_ps(va, acc[i][j]);
            if (!first)
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, p), v);
            else if (beta != 0.0f)
                v = _mm512_add_ps(_mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mk, p)), v);
            _mm512_mask_storeu_ps(p, mk, v);
        }
}

/* acc = sum over k < kc of A(i,k) * Bp[k][0..48), A(i,k) = a[i*ais + k*aks];
 * then the tile is stored.  ais/aks are (lda, 1) for A read in place and
 * (1, 8) for a packed block. */
static inline __attribute__((always_inline)) void kernel(int kc, const float *a, long ais, long aks,
                                                         const float *restrict bp, float *C,
                                                         long ldc, int m, int n, float alpha,
                                                         float beta, int first) {
    /* C's tile is needed after the loop: ask for it now */
    for (int i = 0; i < m; i++) {
        const char *p = (const char *)(C + (size_t)i * ldc);
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 64, _MM_HINT_T0);
        _mm_prefetch(p + 128, _MM_HINT_T0);
    }
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00,
           c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00, c40 = c00, c41 = c00,
           c42 = c00, c50 = c00, c51 = c00, c52 = c00, c60 = c00, c61 = c00, c62 = c00, c70 = c00,
           c71 = c00, c72 = c00;
    const float *a0 = a, *a1 = a + ais, *a2 = a + 2 * ais, *a3 = a + 3 * ais, *a4 = a + 4 * ais,
                *a5 = a + 5 * ais, *a6 = a + 6 * ais, *a7 = a + 7 * ais;
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16), b2 = _mm512_load_ps(bp + 32),
               x;
#define MS_SGEMM_ROW(i)                                                                            \
    x = _mm512_set1_ps(*a##i);                                                                     \
    c##i##0 = _mm512_fmadd_ps(x, b0, c##i##0);                                                     \
    c##i##1 = _mm512_fmadd_ps(x, b1, c##i##1);                                                     \
    c##i##2 = _mm512_fmadd_ps(x, b2, c##i##2);                                                     \
    a##i += aks;
        MS_SGEMM_ROW(0)
        MS_SGEMM_ROW(1)
        MS_SGEMM_ROW(2)
        MS_SGEMM_ROW(3)
        MS_SGEMM_ROW(4)
        MS_SGEMM_ROW(5)
        MS_SGEMM_ROW(6)
        MS_SGEMM_ROW(7)
#undef MS_SGEMM_ROW
        bp += NR;
    }
    __m512 acc[MR][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32},
                         {c40, c41, c42}, {c50, c51, c52}, {c60, c61, c62}, {c70, c71, c72}};
    store_tile(acc, C, ldc, m, n, alpha, beta, first);
}

/* Eight rows of row-major A read in place. */
static void kernel_rows(int kc, const float *a, long lda, const float *bp, float *C, long ldc,
                        int n, float alpha, float beta, int first) {
    kernel(kc, a, lda, 1, bp, C, ldc, MR, n, alpha, beta, first);
}

/* A packed [k][8] (m <= 8 valid rows). */
static void kernel_packed(int kc, const float *ap, const float *bp, float *C, long ldc, int m,
                          int n, float alpha, float beta, int first) {
    kernel(kc, ap, 1, MR, bp, C, ldc, m, n, alpha, beta, first);
}

/* 16 x 16 transpose in registers. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        __m512d x0 = _mm512_castps_pd(t[i]), x1 = _mm512_castps_pd(t[i + 1]),
                x2 = _mm512_castps_pd(t[i + 2]), x3 = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
}

/* One panel of op(B): columns [j0, j0+n) (n <= 48, zero beyond), rows
 * [k0, k0+kb), into bp[k][48].  op(B)(k,j) = tb ? B[j*ldb + k] : B[k*ldb + j]. */
static void pack_b(float *restrict bp, const float *B, long ldb, int tb, int j0, int n, int k0,
                   int kb) {
    if (!tb) {
        for (int k = 0; k < kb; k++) {
            const float *s = B + (size_t)(k0 + k) * ldb + j0;
            float *d = bp + (size_t)k * NR;
            if (n == NR) {
                _mm512_store_ps(d, _mm512_loadu_ps(s));
                _mm512_store_ps(d + 16, _mm512_loadu_ps(s + 16));
                _mm512_store_ps(d + 32, _mm512_loadu_ps(s + 32));
            } else {
                for (int j = 0; j < NR; j++)
                    d[j] = j < n ? s[j] : 0.0f;
            }
        }
        return;
    }
    int k = 0;
    if (n == NR)
        for (; k + 16 <= kb; k += 16)
            for (int jb = 0; jb < NR / 16; jb++) {
                __m512 r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = _mm512_loadu_ps(B + (size_t)(j0 + 16 * jb + i) * ldb + k0 + k);
                transpose16(r);
                for (int i = 0; i < 16; i++)
                    _mm512_store_ps(bp + (size_t)(k + i) * NR + 16 * jb, r[i]);
            }
    for (; k < kb; k++)
        for (int j = 0; j < NR; j++)
            bp[(size_t)k * NR + j] = j < n ? B[(size_t)(j0 + j) * ldb + k0 + k] : 0.0f;
}

/* Rows [i0, i0+m) (m <= 8, zero beyond) of op(A), columns [k0, k0+kb), into
 * ap[k][8].  op(A)(i,k) = ta ? A[k*lda + i] : A[i*lda + k]. */
static void pack_a(float *restrict ap, const float *A, long lda, int ta, int i0, int m, int k0,
                   int kb) {
    if (ta && m == MR) {
        for (int k = 0; k < kb; k++)
            _mm256_store_ps(ap + (size_t)k * MR, _mm256_loadu_ps(A + (size_t)(k0 + k) * lda + i0));
        return;
    }
    for (int k = 0; k < kb; k++)
        for (int i = 0; i < MR; i++)
            ap[(size_t)k * MR + i] = i >= m ? 0.0f
                                            : (ta ? A[(size_t)(k0 + k) * lda + i0 + i]
                                                  : A[(size_t)(i0 + i) * lda + k0 + k]);
}

/* One 8-row strip of op(A) (rows [i, i+m)) against B's panel bp: read in
 * place when A is row-major with 8 rows, packed into ap otherwise. */
static void strip(const float *A, long lda, int ta, int i, int m, int k0, int kb, float *ap,
                  const float *bp, float *C, long ldc, int n, float alpha, float beta, int first) {
    if (!ta && m == MR) {
        kernel_rows(kb, A + (size_t)i * lda + k0, lda, bp, C, ldc, n, alpha, beta, first);
        return;
    }
    pack_a(ap, A, lda, ta, i, m, k0, kb);
    kernel_packed(kb, ap, bp, C, ldc, m, n, alpha, beta, first);
}

/* Few rows (M <= MC, or <= MT when op(A) is transposed): each thread takes
 * its share of op(B)'s panels and packs each one just before multiplying
 * it, so that the next panel's packing follows the last one's compute on
 * the same core; op(A) is read in place, or packed once, shared, when
 * transposed. */
static void few_rows(cpu_sgemm_scratch *s, int threads, int ta, int tb, int M, int N, int K,
                     float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                     float *C, int ldc) {
    int panels = (N + NR - 1) / NR, strips = (M + MR - 1) / MR;
#pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *ap = s->a + (size_t)tid * CPU_SGEMM_A_FLOATS;
        float *bp = s->b + (size_t)tid * NR * CPU_SGEMM_KC;
        size_t lo, hi;
        cpu_split((size_t)panels, nt, tid, &lo, &hi);
        for (int k0 = 0; k0 < K; k0 += CPU_SGEMM_KC) {
            int kb = K - k0 < CPU_SGEMM_KC ? K - k0 : CPU_SGEMM_KC;
            int first = k0 == 0;
            if (ta) {
#pragma omp for schedule(static)
                for (int q = 0; q < strips; q++)
                    pack_a(s->at + (size_t)q * MR * kb, A, lda, 1, q * MR,
                           M - q * MR < MR ? M - q * MR : MR, k0, kb);
            }
            for (size_t p = lo; p < hi; p++) {
                int j0 = (int)p * NR, n = N - j0 < NR ? N - j0 : NR;
                pack_b(bp, B, ldb, tb, j0, n, k0, kb);
                for (int q = 0; q < strips; q++) {
                    int i = q * MR, m = M - i < MR ? M - i : MR;
                    float *c = C + (size_t)i * ldc + j0;
                    if (ta)
                        kernel_packed(kb, s->at + (size_t)q * MR * kb, bp, c, ldc, m, n, alpha,
                                      beta, first);
                    else
                        strip(A, lda, 0, i, m, k0, kb, ap, bp, c, ldc, n, alpha, beta, first);
                }
            }
            if (ta) { /* the shared op(A) is packed again for the next k-block */
#pragma omp barrier
            }
        }
    }
}

/* Many rows: the threads pack op(B)'s panels of a block of NC columns
 * together, then each multiplies them by its share of op(A)'s rows, in
 * blocks of MC rows (packed once a block when transposed). */
static void many_rows(cpu_sgemm_scratch *s, int threads, int ta, int tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc) {
    float *bpk = s->b;
#pragma omp parallel num_threads(threads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *ap = s->a + (size_t)tid * CPU_SGEMM_A_FLOATS;
        size_t lo, hi;
        cpu_split((size_t)(M + MR - 1) / MR, nt, tid, &lo, &hi);
        for (int j0 = 0; j0 < N; j0 += CPU_SGEMM_NC) {
            int nb = N - j0 < CPU_SGEMM_NC ? N - j0 : CPU_SGEMM_NC;
            int panels = (nb + NR - 1) / NR;
            for (int k0 = 0; k0 < K; k0 += CPU_SGEMM_KC) {
                int kb = K - k0 < CPU_SGEMM_KC ? K - k0 : CPU_SGEMM_KC;
                int first = k0 == 0;
#pragma omp for schedule(static)
                for (int p = 0; p < panels; p++) {
                    int n = nb - p * NR < NR ? nb - p * NR : NR;
                    pack_b(bpk + (size_t)p * NR * kb, B, ldb, tb, j0 + p * NR, n, k0, kb);
                }
                for (size_t s0 = lo; s0 < hi; s0 += CPU_SGEMM_MC / MR) {
                    size_t s1 = s0 + CPU_SGEMM_MC / MR < hi ? s0 + CPU_SGEMM_MC / MR : hi;
                    if (ta)
                        for (size_t q = s0; q < s1; q++) {
                            int i = (int)q * MR;
                            pack_a(ap + (q - s0) * MR * kb, A, lda, 1, i, M - i < MR ? M - i : MR,
                                   k0, kb);
                        }
                    for (int p = 0; p < panels; p++) {
                        int n = nb - p * NR < NR ? nb - p * NR : NR;
                        const float *bp = bpk + (size_t)p * NR * kb;
                        for (size_t q = s0; q < s1; q++) {
                            int i = (int)q * MR, m = M - i < MR ? M - i : MR;
                            float *c = C + (size_t)i * ldc + j0 + p * NR;
                            if (ta)
                                kernel_packed(kb, ap + (q - s0) * MR * kb, bp, c, ldc, m, n, alpha,
                                              beta, first);
                            else /* an edge strip is packed after the block's */
                                strip(A, lda, 0, i, m, k0, kb, ap + (s1 - s0) * MR * kb, bp, c, ldc,
                                      n, alpha, beta, first);
                        }
                    }
                }
#pragma omp barrier /* the panels are packed again for the next block */
            }
        }
    }
}

void cpu_sgemm_own(cpu_sgemm_scratch *s, int threads, int ta, int tb, int M, int N, int K,
                   float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                   float *C, int ldc) {
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
    if (M <= (ta ? CPU_SGEMM_MT : CPU_SGEMM_MC))
        few_rows(s, threads, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        many_rows(s, threads, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#endif /* CPU_SGEMM_OWN */
