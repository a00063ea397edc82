/* crc32c.h - CRC32C (Castagnoli), hardware SSE4.2 when the CPU has it, a
 * slicing table otherwise.  crc = ms_crc32c(0, data, n) for a whole buffer;
 * feed the previous value back in to continue.  Thread-safe. */
#ifndef MS_CRC32C_H
#define MS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t ms_crc32c(uint32_t crc, const void *data, size_t n);

#endif
