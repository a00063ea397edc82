/* crc32c.c - CRC32C (Castagnoli, reflected polynomial 0x82F63B78).
 *
 * Two implementations with identical results: the SSE4.2 crc32 instruction
 * (x86-64, chosen at run time with __builtin_cpu_supports, compiled with a
 * function-level target attribute so the file needs no -msse4.2), and a
 * portable slicing-by-8 table walk.  The tables are built once under
 * pthread_once.  ms_crc32c_portable / ms_crc32c_hw are exported (but not in
 * the header) so the unit test can compare the two paths directly.
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

static uint32_t crc_tab[8][256];
static int crc_use_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

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
/* Hardware path; only call when the CPU has SSE4.2 (ms_crc32c_hw_available). */
__attribute__((target("sse4.2"))) uint32_t ms_crc32c_hw(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t c = ~crc;
    while (n > 0 && ((uintptr_t)p & 7u)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
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
