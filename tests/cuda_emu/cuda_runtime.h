/* cuda_runtime.h (cuda-emu) - the CUDA runtime subset the backend uses,
 * for kernel sources compiled by g++ with -DMS_CUDA_EMU and run on the CPU
 * by the executor in cuda_emu.cpp.  Names, enum values and signatures are
 * the real runtime's, so the same .cu file builds with nvcc and with g++.
 *
 * Semantics: one emulated device (0).  Everything is synchronous: a stream
 * is an opaque handle and work runs when it is enqueued, so every *Async
 * call has completed on return and events are stamped with the host clock
 * when recorded.  Device memory is host memory registered by cudaMalloc
 * (filled with 0xFF, i.e. NaN for floats and bf16, so a kernel that reads
 * what nobody wrote shows it); copies and memsets check that their device
 * side lies inside one live allocation and fail with cudaErrorInvalidValue
 * (and a line on stderr) otherwise.  Errors are also kept as the calling
 * thread's last error, like CUDA.
 * Environment: MS_EMU_NO_DEVICE=1 hides the device (cudaGetDeviceCount
 * fails with cudaErrorNoDevice); MS_EMU_DEVICE_MEM_MB caps device memory.
 * Thread-safety: the calls may be made from any thread; kernels run one at
 * a time (launches are serialised).
 */
#ifndef MSEMU_CUDA_RUNTIME_H
#define MSEMU_CUDA_RUNTIME_H

#ifndef __cplusplus
#error "cuda-emu headers are C++: compile .cu sources with g++ -x c++ -DMS_CUDA_EMU"
#endif

#include <stddef.h>
#include <stdint.h>

#include "library_types.h"

/* ---- qualifiers of the kernel dialect ---- */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __attribute__((aligned(n)))
/* Blocks run one at a time and launches are serialised, so a function-static
 * array is exactly the shared memory of the running block. */
#define __shared__ static
/* __restrict__ is a g++ keyword already. */

/* ---- vector types ---- */
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};
struct __align__(8) float2 {
    float x, y;
};
struct float3 {
    float x, y, z;
};
struct __align__(16) float4 {
    float x, y, z, w;
};
struct __align__(8) int2 {
    int x, y;
};
struct int3 {
    int x, y, z;
};
struct __align__(16) int4 {
    int x, y, z, w;
};
struct __align__(8) uint2 {
    unsigned int x, y;
};
struct __align__(16) uint4 {
    unsigned int x, y, z, w;
};
struct __align__(4) ushort2 {
    unsigned short x, y;
};
struct __align__(8) ushort4 {
    unsigned short x, y, z, w;
};
struct __align__(16) double2 {
    double x, y;
};

static inline float2 make_float2(float x, float y) {
    return float2{x, y};
}
static inline float3 make_float3(float x, float y, float z) {
    return float3{x, y, z};
}
static inline float4 make_float4(float x, float y, float z, float w) {
    return float4{x, y, z, w};
}
static inline int2 make_int2(int x, int y) {
    return int2{x, y};
}
static inline int3 make_int3(int x, int y, int z) {
    return int3{x, y, z};
}
static inline int4 make_int4(int x, int y, int z, int w) {
    return int4{x, y, z, w};
}
static inline uint2 make_uint2(unsigned x, unsigned y) {
    return uint2{x, y};
}
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) {
    return uint3{x, y, z};
}
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
static inline ushort2 make_ushort2(unsigned short x, unsigned short y) {
    return ushort2{x, y};
}
static inline ushort4 make_ushort4(unsigned short x, unsigned short y, unsigned short z,
                                   unsigned short w) {
    return ushort4{x, y, z, w};
}
static inline double2 make_double2(double x, double y) {
    return double2{x, y};
}

/* ---- types and enums (real values) ---- */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
    long reserved[8];
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

/* The fields of the real struct that a backend plausibly reads. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    int integrated;
    int canMapHostMemory;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryBusWidth;
    int l2CacheSize;
    int persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int cooperativeLaunch;
    size_t sharedMemPerBlockOptin;
    int maxBlocksPerMultiProcessor;
    size_t reservedSharedMemPerBlock;
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04

/* The emulated device's limits (also what cudaDeviceProp reports). */
#define MSEMU_SMEM_DEFAULT (48 * 1024)
#define MSEMU_SMEM_OPTIN (227 * 1024)
#define MSEMU_SM_COUNT 8

extern "C" {
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);

cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
}

/* The C++ conveniences of the real header. */
template <class T> static inline cudaError_t cudaMalloc(T **ptr, size_t size) {
    return cudaMalloc((void **)ptr, size);
}
template <class T> static inline cudaError_t cudaMallocHost(T **ptr, size_t size) {
    return cudaMallocHost((void **)ptr, size);
}
template <class T> static inline cudaError_t cudaHostAlloc(T **ptr, size_t size, unsigned flags) {
    return cudaHostAlloc((void **)ptr, size, flags);
}

namespace msemu {
cudaError_t func_set_attribute(const void *entry, enum cudaFuncAttribute attr, int value);
cudaError_t memcpy_symbol(void *sym, size_t sym_bytes, const void *src, size_t count, size_t offset,
                          int to_symbol);
} // namespace msemu

/* Kernels are plain functions here; MaxDynamicSharedMemorySize is checked
 * and recorded per kernel, for launches that name their kernel (see
 * msemu::launch in cuda_emu.h). */
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value) {
    return msemu::func_set_attribute(reinterpret_cast<const void *>(entry), attr, value);
}

template <class T>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *num_blocks, T entry,
                                                                        int block_size,
                                                                        size_t dyn_smem) {
    (void)entry;
    if (!num_blocks || block_size <= 0 || block_size > 1024) return cudaErrorInvalidValue;
    int by_threads = 2048 / block_size, by_smem = by_threads;
    if (dyn_smem) by_smem = (int)(MSEMU_SMEM_OPTIN / dyn_smem);
    *num_blocks = by_threads < by_smem ? by_threads : by_smem;
    return cudaSuccess;
}

template <class T>
static inline cudaError_t cudaMemcpyToSymbol(const T &symbol, const void *src, size_t count,
                                             size_t offset = 0,
                                             enum cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    (void)kind;
    return msemu::memcpy_symbol((void *)&symbol, sizeof(T), src, count, offset, 1);
}
template <class T>
static inline cudaError_t cudaMemcpyFromSymbol(void *dst, const T &symbol, size_t count,
                                               size_t offset = 0,
                                               enum cudaMemcpyKind kind = cudaMemcpyDeviceToHost) {
    (void)kind;
    return msemu::memcpy_symbol((void *)&symbol, sizeof(T), dst, count, offset, 0);
}

/* Device built-ins (threadIdx, __syncthreads, shuffles...) and the launch
 * entry point: a .cu source sees them as soon as it includes the runtime. */
#include "cuda_emu.h"

#endif
