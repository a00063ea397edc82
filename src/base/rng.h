/* rng.h - counter-based deterministic random numbers.
 *
 * Every number is a pure function of (seed, stream, counter): the value of
 * element i of parameter tensor k is ms_rng_normal(seed, k, i) whatever rank
 * or slice computes it, so the same seed gives the same numbers on any
 * parallel layout.  The stateful ms_rng wraps a (seed, stream, counter)
 * triple for sequential draws (sampling, shuffling); its state is three
 * integers, so it can be saved in a checkpoint.  Thread-safe (pure). */
#ifndef MS_RNG_H
#define MS_RNG_H

#include <stddef.h>
#include <stdint.h>

uint64_t ms_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter);
/* Uniform in [0, 1) with 24 random bits. */
float ms_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);
/* Standard normal (Box-Muller over two draws derived from the counter);
 * the same bits on every CPU. */
float ms_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter);
/* out[j] = scale * ms_rng_normal(seed, stream, counter + j), j < n, bit for
 * bit; vectorised (one thread: call it on disjoint ranges in parallel). */
void ms_rng_normal_fill(uint64_t seed, uint64_t stream, uint64_t counter, float scale, float *out,
                        size_t n);

/* SplitMix64's finaliser: a bijection of 64-bit words that turns the
 * sequence base + j * 0x9E3779B97F4A7C15 into words that look independent.
 * For bulk fills whose values need only look random (a benchmark's inputs,
 * a test pattern): one Philox draw seeds a run of words and the loop
 * vectorises, where a Philox block per element costs ~20 ns (80 ms for a
 * 2048^2 GEMM probe's input).  Never for the model's numbers, which are
 * Philox's (the same bits on every layout). */
static inline uint64_t ms_rng_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Word j of the run seeded by base (SplitMix64's j+1-th output from state
 * base): for (j) p[j] = ms_rng_mix_at(ms_rng_u64(seed, stream, run), j). */
static inline uint64_t ms_rng_mix_at(uint64_t base, uint64_t j) {
    return ms_rng_mix64(base + (j + 1) * 0x9E3779B97F4A7C15ull);
}

typedef struct {
    uint64_t seed, stream, counter;
} ms_rng;

static inline ms_rng ms_rng_make(uint64_t seed, uint64_t stream) {
    ms_rng r = {seed, stream, 0};
    return r;
}
uint64_t ms_rng_next_u64(ms_rng *r);
float ms_rng_next_uniform(ms_rng *r);
/* Uniform integer in [0, n), n > 0 (unbiased). */
uint64_t ms_rng_next_below(ms_rng *r, uint64_t n);

#endif
