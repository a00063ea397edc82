/* bf16.h - bfloat16 <-> fp32 on the host (device code has cuda_bf16.h).
 * fp32 -> bf16 rounds to nearest even; a NaN stays a (quiet) NaN.  Used by
 * the MPI bf16 reductions, the GEMM peak probe and the GPU tests.  Pure
 * functions: thread-safe. */
#ifndef MS_BF16_H
#define MS_BF16_H

#include <stdint.h>
#include <string.h>

static inline float ms_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t ms_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
