/* cu_common.cuh - what every CUDA source of the backend includes: the
 * runtime headers, the checked-call wrappers, bf16 helpers, and the small
 * "kernel dialect" that lets the same kernel source run two ways:
 *
 *  - compiled by nvcc for the GPU (the real backend, sm_90);
 *  - compiled by g++ against the CPU executor in tests/cuda_emu (MS_CUDA_EMU
 *    defined), which runs each block's threads as cooperative fibers, so the
 *    kernels are checked against the CPU backend on machines without a GPU.
 *
 * The dialect (kernels may use only this):
 *  - __global__ kernels, __device__ / __host__ __device__ functions,
 *    threadIdx/blockIdx/blockDim/gridDim, warpSize;
 *  - static __shared__ arrays declared in the kernel body, and dynamic
 *    shared memory through MS_DYN_SMEM(type, name);
 *  - __syncthreads(), __syncwarp(), __shfl_xor_sync / __shfl_down_sync /
 *    __shfl_sync on float, int, unsigned (full mask, width 32);
 *  - libm float functions (expf, __expf, logf, sqrtf, rsqrtf, tanhf, fmaxf,
 *    fminf, fabsf, isfinite), INFINITY, FLT_MAX;
 *  - __nv_bfloat16 with __float2bfloat16 (round to nearest even) and
 *    __bfloat162float (use the helpers below);
 *  - nvcuda::wmma bf16 m16n16k16 fragments with float accumulators:
 *    fill_fragment, load_matrix_sync, mma_sync, store_matrix_sync; a
 *    fragment's x[] may only be touched by operations that treat every
 *    element alike (the element-to-thread mapping is opaque);
 *  - no atomics on floats (results must be bitwise reproducible); integer
 *    atomics only where the result does not depend on their order;
 *  - launches through MS_LAUNCH(kernel, grid, block, smem_bytes, stream,
 *    args...), never <<<>>> directly.
 * Warp-synchronous code must say so with __syncwarp() or the _sync
 * shuffles; nothing may rely on implicit lock-step execution.
 */
#ifndef CU_COMMON_CUH
#define CU_COMMON_CUH

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

extern "C" {
#include "base/status.h"
}

typedef __nv_bfloat16 bf16;

#ifdef MS_CUDA_EMU
#include "cuda_emu.h" /* tests/cuda_emu: msemu::launch, MS_EMU_DYN_SMEM */
#define MS_LAUNCH(kernel, grid, block, smem, stream, ...)                                          \
    msemu::launch(#kernel, kernel, dim3(grid), dim3(block), (size_t)(smem), (stream),              \
                  [=]() { kernel(__VA_ARGS__); })
#define MS_DYN_SMEM(type, name) type *name = (type *)msemu::dyn_smem()
#else
#define MS_LAUNCH(kernel, grid, block, smem, stream, ...)                                          \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define MS_DYN_SMEM(type, name)                                                                    \
    extern __shared__ __align__(16) unsigned char ms_dyn_smem_[];                                  \
    type *name = (type *)ms_dyn_smem_
#endif

/* Checked vendor calls: a failing call is a broken invariant on a device
 * that was working (bad launch, illegal address), so it aborts with
 * file:line and the runtime's message (MS_CHECK style).  Calls that can
 * fail for run-time reasons (allocation, no device) are checked by hand. */
#define CU_CHECK(call)                                                                             \
    do {                                                                                           \
        cudaError_t cu_err_ = (call);                                                              \
        if (cu_err_ != cudaSuccess)                                                                \
            cu_fatal(__FILE__, __LINE__, #call, cudaGetErrorString(cu_err_));                      \
    } while (0)
/* After a launch: catches bad configurations at once (asynchronous faults
 * surface at the next synchronising call). */
#define CU_CHECK_LAUNCH() CU_CHECK(cudaGetLastError())

void cu_fatal(const char *file, int line, const char *what, const char *msg);

__host__ __device__ static inline float bf2f(bf16 x) {
    return __bfloat162float(x);
}
__host__ __device__ static inline bf16 f2bf(float x) {
    return __float2bfloat16(x);
}

/* Ceil division for grid sizes. */
static inline unsigned cu_div_up(size_t a, size_t b) {
    return (unsigned)((a + b - 1) / b);
}

/* Warp-level sum / max with the _sync shuffles (every lane gets the result). */
__device__ static inline float cu_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ static inline float cu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum for a one-dimensional block (blockDim.y = blockDim.z = 1),
 * blockDim.x a multiple of 32 (<= 1024); every thread
 * gets the result.  `buf` is __shared__ float[32] owned by the caller; the
 * function synchronises before and after using it, so it may be called
 * repeatedly with the same buffer. */
__device__ static inline float cu_block_sum(float v, float *buf) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_sum(v);
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    v = lane < nw ? buf[lane] : 0.0f;
    return cu_warp_sum(v);
}
__device__ static inline float cu_block_max(float v, float *buf) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    v = lane < nw ? buf[lane] : -FLT_MAX;
    return cu_warp_max(v);
}

#endif
