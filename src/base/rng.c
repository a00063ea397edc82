/* rng.c - counter-based random numbers: Philox4x32-10 (Salmon et al.,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11; the generator of
 * cuRAND, JAX and PyTorch's CUDA RNG).
 *
 * One Philox block maps a 128-bit counter and a 64-bit key to 128 random
 * bits.  We use key = seed and counter = (counter, stream), so
 * ms_rng_u64(seed, stream, counter) is a pure function of its arguments and
 * distinct (stream, counter) pairs never share a block.  ms_rng_u64 returns
 * the first 64 bits of the block; ms_rng_normal uses all 128 bits for the two
 * uniforms of one Box-Muller draw (cos branch), so one counter gives one
 * normal.  The philox block function is exported (not in the header) for the
 * known-answer test against Random123's kat_vectors.
 */
#include "base/rng.h"

#include <math.h>

#include "base/status.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Philox4x32 with 10 rounds: out = philox(ctr, key). */
void ms_rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The 128-bit block for (seed, stream, counter) as two 64-bit words. */
static void rng_block(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t w[2]) {
    uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    ms_rng_philox4x32_10(ctr, key, out);
    w[0] = (uint64_t)out[0] | (uint64_t)out[1] << 32;
    w[1] = (uint64_t)out[2] | (uint64_t)out[3] << 32;
}

uint64_t ms_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t w[2];
    rng_block(seed, stream, counter, w);
    return w[0];
}

/* Top 24 bits scaled by 2^-24: exactly representable, never 1.0f. */
float ms_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (float)(ms_rng_u64(seed, stream, counter) >> 40) * 0x1.0p-24f;
}

/* Box-Muller in double: u1 in (0, 1] (53 bits, so log never sees 0 and the
 * tail reaches ~8.6 sigma), u2 in [0, 1). */
float ms_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t w[2];
    rng_block(seed, stream, counter, w);
    double u1 = (double)((w[0] >> 11) + 1) * 0x1.0p-53;
    double u2 = (double)(w[1] >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2));
}

uint64_t ms_rng_next_u64(ms_rng *r) {
    return ms_rng_u64(r->seed, r->stream, r->counter++);
}

float ms_rng_next_uniform(ms_rng *r) {
    return ms_rng_uniform(r->seed, r->stream, r->counter++);
}

/* Rejection sampling: accept x only above 2^64 mod n, so the accepted range
 * is a whole number of copies of [0, n) and x % n is exactly uniform.  Fewer
 * than half the draws are rejected for any n.  n == 0 is a caller bug. */
uint64_t ms_rng_next_below(ms_rng *r, uint64_t n) {
    uint64_t threshold, x;
    MS_CHECKF(n > 0, "ms_rng_next_below: n must be > 0");
    if (n == 1) return 0;
    threshold = (0 - n) % n; /* == 2^64 mod n */
    do
        x = ms_rng_next_u64(r);
    while (x < threshold);
    return x % n;
}
