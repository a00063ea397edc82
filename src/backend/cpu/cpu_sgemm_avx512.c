/* cpu_sgemm_avx512.c - the own fp32 GEMM's microkernel and op(B) packing
 * for CPUs with full-width AVX-512 (Intel since Skylake-SP, AMD since Zen 5):
 * an 8 x 48 tile of C in 24 zmm registers; each k step loads three vectors
 * of B's panel, broadcasts eight elements of A and does 24 FMAs.  The
 * blocking around it, and the bits it gives, are cpu_sgemm.c's.
 *
 * Compiled for AVX-512 whatever the build targets (the pragma below); the
 * driver calls it only where the CPU has AVX-512 (be_cpu_gemm_runs), so
 * the binary still runs on any x86-64. */
#include "backend/cpu/cpu_internal.h"

#if CPU_SGEMM_OWN

#include <immintrin.h>

#pragma GCC target("avx512f,avx2,fma")

#define MR 8  /* rows of op(A) in the tile */
#define NR 48 /* columns of op(B): a panel's width */

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
        /* B's three vectors in registers, whatever the compiler's tuning
         * (cpu_sgemm_avx2.c: folded into the FMAs they cost a quarter) */
        __asm__("" : "+v"(b0), "+v"(b1), "+v"(b2));
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

/* np whole panels of op(B): columns [j0, j0+48*np), rows [k0, k0+kb), into
 * bp (panel p at bp + p*48*kb, [k][48]).  op(B)(k,j) = tb ? B[j*ldb + k] :
 * B[k*ldb + j].  Returns the rows it packed: all of them, or (tb) a
 * multiple of 16.  Without tb a row of all np panels at a time: B's rows
 * are read as one contiguous run each, which the hardware prefetchers
 * follow (a panel at a time reads 192 bytes of a row, then 192 bytes of
 * the next, 3-12 KB further for the step's weights: often another page). */
static int pack_b(float *restrict bp, const float *B, long ldb, int tb, int j0, int np, int k0,
                  int kb) {
    size_t ps = (size_t)NR * kb; /* floats a panel */
    if (!tb) {
        for (int k = 0; k < kb; k++) {
            const float *s = B + (size_t)(k0 + k) * ldb + j0;
            float *d = bp + (size_t)k * NR;
            for (int p = 0; p < np; p++, s += NR, d += ps) {
                _mm512_store_ps(d, _mm512_loadu_ps(s));
                _mm512_store_ps(d + 16, _mm512_loadu_ps(s + 16));
                _mm512_store_ps(d + 32, _mm512_loadu_ps(s + 32));
            }
        }
        return kb;
    }
    for (int p = 0; p < np; p++)
        for (int k = 0; k + 16 <= kb; k += 16)
            for (int jb = 0; jb < NR / 16; jb++) {
                __m512 r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = _mm512_loadu_ps(B + (size_t)(j0 + NR * p + 16 * jb + i) * ldb + k0 + k);
                transpose16(r);
                for (int i = 0; i < 16; i++)
                    _mm512_store_ps(bp + p * ps + (size_t)(k + i) * NR + 16 * jb, r[i]);
            }
    return kb - kb % 16;
}

const cpu_sgemm_kern cpu_sgemm_kern_avx512 = {.kind = BE_CPU_GEMM_AVX512,
                                              .mr = MR,
                                              .nr = NR,
                                              .rows = kernel_rows,
                                              .packed = kernel_packed,
                                              .pack_b = pack_b};

#endif /* CPU_SGEMM_OWN */
