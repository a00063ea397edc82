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
 *
 * Box-Muller's log and cos are our own polynomials in double (below), built
 * from +, -, *, / and sqrt alone, which IEEE 754 rounds exactly: a normal is
 * then the same bits on every x86-64 and aarch64 CPU and in every code path
 * (libm's log and cos pick FMA or non-FMA variants by CPU), and the loop of
 * ms_rng_normal_fill vectorises, so GPT-2 124M's weights take under a
 * second of a core instead of ~5 (docs/perf.md).  Both are accurate to a few
 * double ulps, far below the float the result is rounded to.  This file is
 * compiled with -ffp-contract=off (CMakeLists.txt): a fused multiply-add
 * would round differently on CPUs that have one.
 */
#include "base/rng.h"

#include <math.h>
#include <string.h>

#include "base/status.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Philox4x32 with 10 rounds on the counter c0..c3 and key k0, k1; the
 * result replaces the counter.  Inline so that ms_rng_normal_fill's loop
 * vectorises. */
static inline void philox(uint32_t *c0, uint32_t *c1, uint32_t *c2, uint32_t *c3, uint32_t k0,
                          uint32_t k1) {
    uint32_t a0 = *c0, a1 = *c1, a2 = *c2, a3 = *c3;
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * a0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * a2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ a1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ a3 ^ k1;
        a0 = n0;
        a1 = (uint32_t)p1;
        a2 = n2;
        a3 = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    *c0 = a0, *c1 = a1, *c2 = a2, *c3 = a3;
}

/* Philox4x32 with 10 rounds: out = philox(ctr, key). */
void ms_rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    philox(&c0, &c1, &c2, &c3, key[0], key[1]);
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

static inline double bits_double(uint64_t b) {
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static inline uint64_t double_bits(double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

/* The series' coefficients, highest power first: 1/(2k+1) for k = 10..1
 * (log), (-1)^k/(2k)! for k = 8..0 (cos), (-1)^k/(2k+1)! for k = 8..1 (sin). */
static const double LOG_C[] = {0.047619047619047616, 0.05263157894736842, 0.058823529411764705,
                               0.06666666666666667,  0.07692307692307693, 0.09090909090909091,
                               0.1111111111111111,   0.14285714285714285, 0.2,
                               0.3333333333333333};
static const double COS_C[] = {4.779477332387385e-14,
                               -1.1470745597729725e-11,
                               2.08767569878681e-09,
                               -2.755731922398589e-07,
                               2.48015873015873e-05,
                               -0.001388888888888889,
                               0.041666666666666664,
                               -0.5,
                               1.0};
static const double SIN_C[] = {
    2.8114572543455206e-15, -7.647163731819816e-13, 1.6059043836821613e-10, -2.505210838544172e-08,
    2.7557319223985893e-06, -0.0001984126984126984, 0.008333333333333333,   -0.16666666666666666};

/* c[0] z^(n-1) + ... + c[n-1], by Horner's rule (a fixed order of roundings). */
static inline double horner(double z, const double *c, int n) {
    double p = c[0];
    for (int i = 1; i < n; i++)
        p = p * z + c[i];
    return p;
}

/* log(n * 2^-53) for an integer n in [1, 2^53]: n = 2^e m with m in
 * [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with s = (m-1)/(m+1), |s| < 0.172,
 * summed to s^21 (the next term is below 2^-60 of the sum); e ln 2 in two
 * parts, the first with trailing zeros so that e * LN2_HI is exact. */
static inline double rng_log_u(uint64_t n) {
    const double LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
    uint64_t b = double_bits((double)(int64_t)n); /* exact: n <= 2^53 */
    int64_t e = (int64_t)(b >> 52) - 1023 - 53;
    double m = bits_double((b & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);
    int big = m > 0x1.6a09e667f3bcdp+0; /* sqrt(2) */
    m = big ? m * 0.5 : m;
    e = big ? e + 1 : e;
    double s = (m - 1.0) / (m + 1.0), z = s * s;
    double p = horner(z, LOG_C, sizeof LOG_C / sizeof LOG_C[0]);
    double logm = 2.0 * s + 2.0 * s * (z * p);
    double de = (double)e;
    return de * LN2_HI + (de * LN2_LO + logm);
}

/* cos(2 pi n 2^-53) for an integer n in [0, 2^53): q = the nearest quarter
 * turn, r = n 2^-53 - q/4 in [-1/8, 1/8] (exact, in integers), then
 * cos(2 pi r + q pi/2) is +-cos or +-sin of |t| <= pi/4 by Taylor series
 * to t^17 (the next term is below 2^-56). */
static inline double rng_cos_turn(uint64_t n) {
    uint64_t q = (n + (1ULL << 50)) >> 51;
    double r = (double)((int64_t)n - (int64_t)(q << 51)) * 0x1.0p-53;
    double t = r * 0x1.921fb54442d18p+2, z = t * t; /* 2 pi */
    double c = horner(z, COS_C, sizeof COS_C / sizeof COS_C[0]);
    double sn = horner(z, SIN_C, sizeof SIN_C / sizeof SIN_C[0]);
    sn = t + t * (z * sn);
    /* cos(t + q pi/2) for q mod 4 = 0, 1, 2, 3: cos t, -sin t, -cos t, sin t */
    double v = (q & 1) ? sn : c;
    return ((q + 1) & 2) ? -v : v;
}

/* Box-Muller in double on the block's two 64-bit words: u1 in (0, 1] (53
 * bits, so log never sees 0 and the tail reaches ~8.6 sigma), u2 in [0, 1). */
static inline float rng_normal_of(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                  uint32_t k1) {
    philox(&c0, &c1, &c2, &c3, k0, k1);
    uint64_t w0 = (uint64_t)c0 | (uint64_t)c1 << 32, w1 = (uint64_t)c2 | (uint64_t)c3 << 32;
    return (float)(sqrt(-2.0 * rng_log_u((w0 >> 11) + 1)) * rng_cos_turn(w1 >> 11));
}

float ms_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
    return rng_normal_of((uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                         (uint32_t)(stream >> 32), (uint32_t)seed, (uint32_t)(seed >> 32));
}

void ms_rng_normal_fill(uint64_t seed, uint64_t stream, uint64_t counter, float scale, float *out,
                        size_t n) {
    uint32_t s0 = (uint32_t)stream, s1 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (size_t j = 0; j < n; j++) {
        uint64_t c = counter + j;
        out[j] = scale * rng_normal_of((uint32_t)c, (uint32_t)(c >> 32), s0, s1, k0, k1);
    }
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
