/* cpu_sgemm_avx2.c - the own fp32 GEMM's microkernel and op(B) packing for
 * CPUs with AVX2 and FMA (Intel since Haswell, AMD since Zen; also Zen 4,
 * which splits each 512-bit operation in two): a 4 x 24 tile of C in 12 ymm
 * registers; each k step loads three vectors of B's panel, broadcasts four
 * elements of A and does 12 FMAs.  Four rows by 24 columns (rather than
 * 6 x 16) reads fewer elements of A, which the driver takes in place from
 * the level-2 cache, per FMA.  The blocking around it, and the bits it
 * gives (the same as the AVX-512 kernel's), are cpu_sgemm.c's.
 *
 * Compiled for AVX2 + FMA whatever the build targets (the pragma below);
 * the backend picks it only where the CPU has both (be_cpu_gemm_runs). */
#include "backend/cpu/cpu_internal.h"

#if CPU_SGEMM_OWN

#include <immintrin.h>

#pragma GCC target("avx2,fma")

#define MR 4  /* rows of op(A) in the tile */
#define NR 24 /* columns of op(B): a panel's width */

/* Lanes [0, w) of a vector (w < 8), as maskload/maskstore want them. */
static inline __attribute__((always_inline)) __m256i lanes(int w) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* C tile (m x n, m <= 4, n <= 24, row stride ldc) from the accumulators:
 * first block: alpha*acc (+ beta*C); later blocks: C + alpha*acc. */
static inline __attribute__((always_inline)) void store_tile(__m256 acc[MR][3], float *C, long ldc,
                                                             int m, int n, float alpha, float beta,
                                                             int first) {
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < 3; j++) {
            int w = n - 8 * j;
            if (w <= 0) break;
            float *p = C + (size_t)i * ldc + 8 * j;
            __m256 v = alpha == 1.0f ? acc[i][j] : _mm256_mul_ps(va, acc[i][j]);
            if (w >= 8) {
                if (!first)
                    v = _mm256_add_ps(_mm256_loadu_ps(p), v);
                else if (beta != 0.0f)
                    v = _mm256_add_ps(_mm256_mul_ps(vb, _mm256_loadu_ps(p)), v);
                _mm256_storeu_ps(p, v);
            } else {
                __m256i mk = lanes(w);
                if (!first)
                    v = _mm256_add_ps(_mm256_maskload_ps(p, mk), v);
                else if (beta != 0.0f)
                    v = _mm256_add_ps(_mm256_mul_ps(vb, _mm256_maskload_ps(p, mk)), v);
                _mm256_maskstore_ps(p, mk, v);
            }
        }
}

/* acc = sum over k < kc of A(i,k) * Bp[k][0..24), A(i,k) = a[i*ais + k*aks];
 * then the tile is stored.  ais/aks are (lda, 1) for A read in place and
 * (1, 4) for a packed block. */
static inline __attribute__((always_inline)) void kernel(int kc, const float *a, long ais, long aks,
                                                         const float *restrict bp, float *C,
                                                         long ldc, int m, int n, float alpha,
                                                         float beta, int first) {
    /* C's tile is needed after the loop: ask for it now */
    for (int i = 0; i < m; i++) {
        const char *p = (const char *)(C + (size_t)i * ldc);
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 64, _MM_HINT_T0);
    }
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00,
           c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    const float *a0 = a, *a1 = a + ais, *a2 = a + 2 * ais, *a3 = a + 3 * ais;
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8), b2 = _mm256_load_ps(bp + 16),
               x;
        /* B's three vectors in registers: GCC would otherwise fold each
         * load into the FMAs, four loads of each (-O3 -march=znver5 did:
         * 16 loads a step instead of 7 ran this kernel at 75% of its rate) */
        __asm__("" : "+x"(b0), "+x"(b1), "+x"(b2));
#define MS_SGEMM_ROW(i)                                                                            \
    x = _mm256_broadcast_ss(a##i);                                                                 \
    c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0);                                                     \
    c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1);                                                     \
    c##i##2 = _mm256_fmadd_ps(x, b2, c##i##2);                                                     \
    a##i += aks;
        MS_SGEMM_ROW(0)
        MS_SGEMM_ROW(1)
        MS_SGEMM_ROW(2)
        MS_SGEMM_ROW(3)
#undef MS_SGEMM_ROW
        bp += NR;
    }
    __m256 acc[MR][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32}};
    store_tile(acc, C, ldc, m, n, alpha, beta, first);
}

/* Four rows of row-major A read in place. */
static void kernel_rows(int kc, const float *a, long lda, const float *bp, float *C, long ldc,
                        int n, float alpha, float beta, int first) {
    kernel(kc, a, lda, 1, bp, C, ldc, MR, n, alpha, beta, first);
}

/* A packed [k][4] (m <= 4 valid rows). */
static void kernel_packed(int kc, const float *ap, const float *bp, float *C, long ldc, int m,
                          int n, float alpha, float beta, int first) {
    kernel(kc, ap, 1, MR, bp, C, ldc, m, n, alpha, beta, first);
}

/* 8 x 8 transpose in registers. */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; i++)
        r[i] = t[i];
}

/* np whole panels of op(B): columns [j0, j0+24*np), rows [k0, k0+kb), into
 * bp (panel p at bp + p*24*kb, [k][24]).  op(B)(k,j) = tb ? B[j*ldb + k] :
 * B[k*ldb + j].  Returns the rows it packed: all of them, or (tb) a
 * multiple of 8.  Without tb a row of all np panels at a time (as the
 * AVX-512 packing: B's rows read as contiguous runs). */
static int pack_b(float *restrict bp, const float *B, long ldb, int tb, int j0, int np, int k0,
                  int kb) {
    size_t ps = (size_t)NR * kb; /* floats a panel */
    if (!tb) {
        for (int k = 0; k < kb; k++) {
            const float *s = B + (size_t)(k0 + k) * ldb + j0;
            float *d = bp + (size_t)k * NR;
            for (int p = 0; p < np; p++, s += NR, d += ps) {
                _mm256_store_ps(d, _mm256_loadu_ps(s));
                _mm256_store_ps(d + 8, _mm256_loadu_ps(s + 8));
                _mm256_store_ps(d + 16, _mm256_loadu_ps(s + 16));
            }
        }
        return kb;
    }
    for (int p = 0; p < np; p++)
        for (int k = 0; k + 8 <= kb; k += 8)
            for (int jb = 0; jb < NR / 8; jb++) {
                __m256 r[8];
                for (int i = 0; i < 8; i++)
                    r[i] = _mm256_loadu_ps(B + (size_t)(j0 + NR * p + 8 * jb + i) * ldb + k0 + k);
                transpose8(r);
                for (int i = 0; i < 8; i++)
                    _mm256_store_ps(bp + p * ps + (size_t)(k + i) * NR + 8 * jb, r[i]);
            }
    return kb - kb % 8;
}

const cpu_sgemm_kern cpu_sgemm_kern_avx2 = {.kind = BE_CPU_GEMM_AVX2,
                                            .mr = MR,
                                            .nr = NR,
                                            .rows = kernel_rows,
                                            .packed = kernel_packed,
                                            .pack_b = pack_b};

#endif /* CPU_SGEMM_OWN */
