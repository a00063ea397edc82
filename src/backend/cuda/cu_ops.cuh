/* cu_ops.cuh - helpers shared by the memory-bound op sources (cu_norm.cu,
 * cu_elementwise.cu, cu_embedding.cu, cu_reduce.cu, cu_optim.cu; cu_attention.cu
 * uses the alignment test):
 *  - 16-byte vector types for 8 bf16 / 4 f32 loads and the alignment test
 *    that decides whether a kernel may use them;
 *  - the deterministic two-pass reduction in double: a fixed-order block
 *    sum (first pass, in each caller's kernel) and the second pass plus the
 *    read-back to the host (cu_reduce_finish, in cu_reduce.cu), which
 *    cu_reduce.cu's ops and LAMB's sums of squares share.
 * Kernel dialect only (see cu_common.cuh).  Not thread-safe beyond the
 * backend's one-op-at-a-time rule.
 */
#ifndef CU_OPS_CUH
#define CU_OPS_CUH

#include "cu_internal.h"

/* 8 bf16 / 4 f32 / 4 bf16 moved as one 16-byte (8-byte) access. */
struct alignas(16) cu_bf16x8 {
    bf16 v[8];
};
struct alignas(16) cu_f32x4 {
    float v[4];
};
struct alignas(8) cu_bf16x4 {
    bf16 v[4];
};

/* The 8 elements of group g of row p as floats (vec: one 16-byte load;
 * p NULL: zeros). */
__device__ static inline void cu_ld8_bf16(float *f, const bf16 *p, int g, int vec) {
    if (!p) {
        for (int j = 0; j < 8; j++)
            f[j] = 0.0f;
    } else if (vec) {
        cu_bf16x8 a = ((const cu_bf16x8 *)p)[g];
        for (int j = 0; j < 8; j++)
            f[j] = bf2f(a.v[j]);
    } else {
        for (int j = 0; j < 8; j++)
            f[j] = bf2f(p[8 * g + j]);
    }
}

/* 1 if p is 16-byte aligned (NULL counts as aligned). */
static inline int cu_al16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

/* Threads per block of every reduction pass (a power of two). */
#define CU_RED_THREADS 256
/* Most first-pass blocks (partials) of a reduction: bounds the scratch. */
#define CU_RED_MAX_BLOCKS 1024
/* Scratch of a reduction computing k sums: k*G partials + k results. */
#define CU_RED_SCRATCH_BYTES(k) ((size_t)(k) * (CU_RED_MAX_BLOCKS + 1) * sizeof(double))

/* Sum of v over the block in a fixed tree (blockDim.x == CU_RED_THREADS);
 * every thread gets the result.  buf is __shared__ double[CU_RED_THREADS]
 * owned by the caller; synchronises before and after using it, so it may be
 * called repeatedly with the same buffer. */
__device__ static inline double cu_block_sum_d(double v, double *buf) {
    int t = threadIdx.x;
    __syncthreads();
    buf[t] = v;
    __syncthreads();
    for (int s = CU_RED_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    return buf[0];
}

/* First-pass grid of a reduction over n elements: 4 blocks per SM, at most
 * CU_RED_MAX_BLOCKS, no more than the elements need, at least 1.  Depends on
 * n and the device only, so each element's partial is fixed. */
int cu_reduce_blocks(be_backend *be, size_t n);

/* Second pass: part (k,G) doubles in device memory, written by G first-pass
 * blocks; sums each row in a fixed order into part[k*G + j] and copies the
 * k results to out (host) through the context's pinned buffer, waiting for
 * the stream.  part has room for k*(G+1) doubles (the results follow the
 * partials). */
void cu_reduce_finish(be_backend *be, double *part, int G, int k, double *out);

#endif
