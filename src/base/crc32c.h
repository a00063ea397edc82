/* crc32c.h - CRC32C (Castagnoli), hardware SSE4.2 when the CPU has it, a
 * slicing table otherwise.  crc = ms_crc32c(0, data, n) for a whole buffer;
 * feed the previous value back in to continue, or join the CRCs of two
 * adjacent pieces computed apart (in parallel, say) with ms_crc32c_combine.
 * Thread-safe. */
#ifndef MS_CRC32C_H
#define MS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t ms_crc32c(uint32_t crc, const void *data, size_t n);
/* memcpy(dst, src, n) and ms_crc32c(crc, src, n) in one pass over the
 * data (the buffers must not overlap). */
uint32_t ms_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n);
/* The CRC of A followed by B from crc1 = ms_crc32c(0, A, |A|), crc2 =
 * ms_crc32c(0, B, len2) and len2 = |B| bytes (zlib's crc32_combine);
 * O(log len2). */
uint32_t ms_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

#endif
