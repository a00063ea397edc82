/* cuda_bf16.h (cuda-emu) - bfloat16 as the kernel dialect uses it: a
 * trivially copyable struct holding the 16 bits (like the real
 * __nv_bfloat16), the conversions, and the two-element vector.
 * Deliberately narrower than the real header: no implicit conversions and
 * no bf16 arithmetic operators, so kernels convert explicitly
 * (cu_common.cuh's bf2f / f2bf) and compute in fp32 on both targets.
 */
#ifndef MSEMU_CUDA_BF16_H
#define MSEMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

struct __align__(2) __nv_bfloat16 {
    unsigned short __x;
};
struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

/* Round to nearest even; NaN stays a (quiet) NaN of the same sign. */
static inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        r.__x = (unsigned short)((u >> 16) | 0x0040u);
    else
        r.__x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return r;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    return __float2bfloat16(f);
}
static inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 r;
    r.__x = (unsigned short)(((u & 0x7fffffffu) > 0x7f800000u) ? ((u >> 16) | 0x0040u) : (u >> 16));
    return r;
}
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) {
    __nv_bfloat16 r;
    r.__x = v;
    return r;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) {
    return h.__x;
}

static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__float2bfloat16(a), __float2bfloat16(b)};
}
static inline __nv_bfloat162 __float2bfloat162_rn(float a) {
    return __floats2bfloat162_rn(a, a);
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 v) {
    return __floats2bfloat162_rn(v.x, v.y);
}
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat162{a, b};
}
static inline float2 __bfloat1622float2(__nv_bfloat162 v) {
    return make_float2(__bfloat162float(v.x), __bfloat162float(v.y));
}
static inline float __low2float(__nv_bfloat162 v) {
    return __bfloat162float(v.x);
}
static inline float __high2float(__nv_bfloat162 v) {
    return __bfloat162float(v.y);
}
static inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v) {
    return v.x;
}
static inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v) {
    return v.y;
}

#endif
