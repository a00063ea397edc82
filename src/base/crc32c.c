/* crc32c.c - CRC32C (Castagnoli, reflected polynomial 0x82F63B78).
 *
 * Two implementations with identical results: the SSE4.2 crc32 instruction
 * (x86-64, chosen at run time with __builtin_cpu_supports, compiled with a
 * function-level target attribute so the file needs no -msse4.2), and a
 * portable slicing-by-8 table walk.  The instruction has a latency of three
 * cycles and a throughput of one, so the hardware path runs three
 * independent CRCs over three adjacent blocks of a long buffer and joins
 * them with "append N zero bytes" tables (Mark Adler's method, as in
 * crc32c.c on Stack Overflow): about three times one chain's speed.
 * ms_crc32c_copy is the same loop storing each word it reads: a copy that
 * CRCs on the way at about memcpy's speed, where a copy followed by a CRC
 * of the copy takes a second pass.  ms_crc32c_combine joins CRCs of
 * adjacent pieces (zlib's crc32_combine:
 * multiplication by x^(8 len) modulo the polynomial).  The tables are
 * built once under pthread_once.  ms_crc32c_portable / ms_crc32c_hw are
 * exported (but not in the header) so the unit test can compare the two
 * paths directly.
 */
#include "base/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#define MS_CRC_HAVE_SSE42 1
#else
#define MS_CRC_HAVE_SSE42 0
#endif

#define CRC32C_POLY 0x82F63B78u

#define CRC_LONG 8192 /* bytes per chain in the three-chain loop of long buffers */
#define CRC_SHORT 256 /* the same for the rest */

static uint32_t crc_tab[8][256];
static uint32_t crc_x2n[32]; /* x^(2^k) mod p */
/* crc_long[k][b]: the register b << 8k followed by CRC_LONG zero bytes */
static uint32_t crc_long[4][256], crc_short[4][256];
static int crc_use_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* a * b modulo the polynomial, both in the reflected representation (bit
 * 31 is x^0), as zlib's multmodp. */
static uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
    }
    return p;
}

/* x^(8 n) mod p: the operator that appends n zero bytes to a register. */
static uint32_t x8nmodp(uint64_t n) {
    uint32_t p = 1u << 31; /* x^0 */
    for (unsigned k = 3; n; n >>= 1, k++)
        if (n & 1) p = multmodp(crc_x2n[k & 31], p);
    return p;
}

static void shift_table(uint32_t t[4][256], uint64_t n) {
    uint32_t op = x8nmodp(n);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            t[k][b] = multmodp(op, b << (8 * k));
}

/* Build the slicing tables: crc_tab[0] is the classic byte table, and
 * crc_tab[k][b] is the CRC of byte b followed by k zero bytes. */
static void crc_init(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
        crc_tab[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++)
            crc_tab[k][b] = (crc_tab[k - 1][b] >> 8) ^ crc_tab[0][crc_tab[k - 1][b] & 0xFF];
    crc_x2n[0] = 1u << 30; /* x^1 */
    for (int k = 1; k < 32; k++)
        crc_x2n[k] = multmodp(crc_x2n[k - 1], crc_x2n[k - 1]);
    shift_table(crc_long, CRC_LONG);
    shift_table(crc_short, CRC_SHORT);
#if MS_CRC_HAVE_SSE42
    crc_use_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
}

/* Portable path: crc is the running value in the usual pre/post-inverted
 * convention (0 for a fresh checksum).  Byte order independent. */
uint32_t ms_crc32c_portable(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t c = ~crc;
    pthread_once(&crc_once, crc_init);
    while (n >= 8) {
        c ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        c = crc_tab[7][c & 0xFF] ^ crc_tab[6][(c >> 8) & 0xFF] ^ crc_tab[5][(c >> 16) & 0xFF] ^
            crc_tab[4][c >> 24] ^ crc_tab[3][p[4]] ^ crc_tab[2][p[5]] ^ crc_tab[1][p[6]] ^
            crc_tab[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xFF];
    return ~c;
}

#if MS_CRC_HAVE_SSE42
/* The register c followed by the zero bytes of table t. */
static inline uint64_t crc_shift(const uint32_t t[4][256], uint64_t c) {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][(c >> 24) & 0xFF];
}

/* Three chains over the adjacent blocks of `block` bytes while n >= 3
 * blocks: c continues over the first, c1 and c2 start from zero on the
 * next two, then c = (c shifted by a block ^ c1) shifted by a block ^ c2.
 * With q (the copy's destination, advanced with p) each word is also
 * stored there: the data is read once for both. */
#define CRC_THREE_CHAINS(block, table)                                                             \
    while (n >= 3 * (size_t)(block)) {                                                             \
        uint64_t c1 = 0, c2 = 0;                                                                   \
        for (size_t i = 0; i < (block); i += 8) {                                                  \
            uint64_t w0, w1, w2;                                                                   \
            memcpy(&w0, p + i, 8);                                                                 \
            memcpy(&w1, p + (block) + i, 8);                                                       \
            memcpy(&w2, p + 2 * (block) + i, 8);                                                   \
            c = _mm_crc32_u64(c, w0);                                                              \
            c1 = _mm_crc32_u64(c1, w1);                                                            \
            c2 = _mm_crc32_u64(c2, w2);                                                            \
            if (COPY) {                                                                            \
                memcpy(q + i, &w0, 8);                                                             \
                memcpy(q + (block) + i, &w1, 8);                                                   \
                memcpy(q + 2 * (block) + i, &w2, 8);                                               \
            }                                                                                      \
        }                                                                                          \
        c = crc_shift(table, c) ^ c1;                                                              \
        c = crc_shift(table, c) ^ c2;                                                              \
        p += 3 * (size_t)(block);                                                                  \
        if (COPY) q += 3 * (size_t)(block);                                                        \
        n -= 3 * (size_t)(block);                                                                  \
    }

/* The hardware loop, once without a copy and once with one (COPY: q is
 * the destination). */
#define CRC_HW_BODY                                                                                \
    uint64_t c = ~crc;                                                                             \
    pthread_once(&crc_once, crc_init); /* the shift tables */                                      \
    while (n > 0 && ((uintptr_t)p & 7u)) {                                                         \
        if (COPY) *q++ = *p;                                                                       \
        c = _mm_crc32_u8((uint32_t)c, *p++);                                                       \
        n--;                                                                                       \
    }                                                                                              \
    CRC_THREE_CHAINS(CRC_LONG, crc_long)                                                           \
    CRC_THREE_CHAINS(CRC_SHORT, crc_short)                                                         \
    while (n >= 8) {                                                                               \
        uint64_t w;                                                                                \
        memcpy(&w, p, 8);                                                                          \
        if (COPY) memcpy(q, &w, 8), q += 8;                                                        \
        c = _mm_crc32_u64(c, w);                                                                   \
        p += 8;                                                                                    \
        n -= 8;                                                                                    \
    }                                                                                              \
    while (n--) {                                                                                  \
        if (COPY) *q++ = *p;                                                                       \
        c = _mm_crc32_u8((uint32_t)c, *p++);                                                       \
    }                                                                                              \
    return ~(uint32_t)c;

/* Hardware path; only call when the CPU has SSE4.2 (ms_crc32c_hw_available). */
__attribute__((target("sse4.2"))) uint32_t ms_crc32c_hw(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = data;
    uint8_t *q = NULL;
    (void)q;
#define COPY 0
    CRC_HW_BODY
#undef COPY
}

__attribute__((target("sse4.2"))) static uint32_t crc_copy_hw(uint32_t crc, void *dst,
                                                              const void *src, size_t n) {
    const uint8_t *p = src;
    uint8_t *q = dst;
#define COPY 1
    CRC_HW_BODY
#undef COPY
}
#undef CRC_HW_BODY
#undef CRC_THREE_CHAINS
#else
uint32_t ms_crc32c_hw(uint32_t crc, const void *data, size_t n) {
    return ms_crc32c_portable(crc, data, n);
}
#endif

/* 1 if ms_crc32c uses the hardware instruction on this CPU. */
int ms_crc32c_hw_available(void) {
    pthread_once(&crc_once, crc_init);
    return crc_use_hw;
}

uint32_t ms_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
#if MS_CRC_HAVE_SSE42
    if (crc_use_hw) return ms_crc32c_hw(crc, data, n);
#endif
    return ms_crc32c_portable(crc, data, n);
}

uint32_t ms_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n) {
    pthread_once(&crc_once, crc_init);
#if MS_CRC_HAVE_SSE42
    if (crc_use_hw) return crc_copy_hw(crc, dst, src, n);
#endif
    for (size_t o = 0; o < n; o += 65536) { /* each piece CRC'd while in the cache */
        size_t m = n - o < 65536 ? n - o : 65536;
        memcpy((uint8_t *)dst + o, (const uint8_t *)src + o, m);
        crc = ms_crc32c_portable(crc, (const uint8_t *)dst + o, m);
    }
    return crc;
}

uint32_t ms_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
    pthread_once(&crc_once, crc_init);
    return multmodp(x8nmodp(len2), crc1) ^ crc2;
}
