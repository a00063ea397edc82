/* hash.h - FNV-1a, 64 bits: a fast hash of short strings and small integers
 * (a tensor's RNG stream, a checkpoint directory's snapshot names, a group's
 * identity, an option's value compared across ranks).  Not for untrusted
 * keys of a hash table (no seed) nor for integrity (crc32c.h).
 *
 * Memory: none.  Thread-safety: pure functions.
 */
#ifndef MS_HASH_H
#define MS_HASH_H

#include <stdint.h>

#define MS_FNV1A_BASIS 14695981039346656037ull /* FNV-1a 64's offset basis */
#define MS_FNV1A_PRIME 1099511628211ull

/* h extended with the bytes of the string s (start: MS_FNV1A_BASIS). */
static inline uint64_t ms_fnv1a_str(uint64_t h, const char *s) {
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * MS_FNV1A_PRIME;
    return h;
}

/* h extended with v as one word (not byte by byte). */
static inline uint64_t ms_fnv1a_word(uint64_t h, uint32_t v) {
    return (h ^ v) * MS_FNV1A_PRIME;
}

#endif
