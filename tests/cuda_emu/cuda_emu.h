/* cuda_emu.h - the CPU executor of the kernel dialect (see
 * src/backend/cuda/cu_common.cuh): launches, the thread/block built-ins,
 * barriers, warp shuffles and votes, integer atomics and the device math
 * helpers that libm lacks.  Included by cuda_runtime.h; implemented in
 * cuda_emu.cpp.
 *
 * Execution model.  A launch runs its blocks one after another in blockIdx
 * order (x fastest).  The threads of a block are cooperative fibers (one
 * ucontext each, 256 KiB stacks mapped once and reused, a guard page below
 * each): a thread runs until it reaches a sync point (__syncthreads*,
 * __syncwarp, a shuffle or vote, a wmma operation) or returns.  A sync
 * point is released as soon as its last thread arrives, independently of
 * the rest of the block:
 *  - a warp (32 consecutive linear thread ids) when its live lanes all wait
 *    at __syncwarp / a wmma operation, or its 32 lanes all wait at a
 *    shuffle or vote (a shuffle with an exited lane, in a partial warp, with
 *    a mask other than 0xffffffff or a width other than 32 aborts, naming
 *    it);
 *  - the block, when every live thread waits at __syncthreads (exited
 *    threads do not count, as on sm_70+).
 * If no thread can run and some have not returned, the kernel has a
 * divergent barrier: the process aborts with "deadlock/divergent barrier in
 * kernel" and the state of every warp.
 * Which runnable thread runs next is chosen by a seeded RNG (MS_EMU_SEED,
 * default fixed: runs are reproducible; msemu::reseed for tests).  Warps
 * get random priorities at the start of a block and at every __syncthreads;
 * the highest warp that can run does (its lanes in random order), so one
 * warp typically runs ahead to the next __syncthreads while the others have
 * not started, and which one depends on the seed.  Each block also draws a
 * probability of "change points" (0 for one block in five) at which the
 * running warp drops to a random lower priority, which interleaves warps
 * more finely.  So a kernel that orders shared memory between warps with
 * anything less than __syncthreads (a __syncwarp, a shuffle, nothing) gives
 * wrong, seed-dependent results here too; sweep MS_EMU_SEED to find them.
 * Dynamic shared memory (MS_DYN_SMEM) is one buffer of the launch's size,
 * refilled with 0xA5 bytes before every block.  Static __shared__ arrays
 * are function statics: zero before the first block, then whatever the
 * previous block left (CUDA promises nothing either).
 * A bad configuration (no threads, > 1024 threads or a dimension over its
 * limit, dynamic shared memory over the opt-in limit, or over 48 KiB
 * without cudaFuncSetAttribute, an unknown stream) does not run and leaves
 * the error for cudaGetLastError, like CUDA.
 * A kernel thread that overflows its stack dies by SIGSEGV with a message.
 * Environment: MS_EMU_SEED (schedule), MS_EMU_STACK_KB (fiber stack,
 * default 256), MS_EMU_UCONTEXT=1 (use swapcontext even on x86-64, where a
 * register switch ~8x faster is the default).
 * Not emulated: anything outside the dialect (float atomics, __CUDA_ARCH__
 * paths, inline PTX, partial-mask or narrow shuffles, cooperative groups);
 * device code may dereference any host pointer here, which faults on a GPU.
 */
#ifndef MSEMU_CUDA_EMU_H
#define MSEMU_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cuda_runtime.h"

namespace msemu {

typedef void (*body_fn)(const void *arg);

/* Run body() once per thread of grid x block.  `name` and `kernel` (either
 * may be NULL) identify the kernel in diagnostics and for its
 * MaxDynamicSharedMemorySize attribute; without them a launch with more
 * than 48 KiB is checked against the largest value set for any kernel. */
void launch_impl(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem,
                 cudaStream_t stream, body_fn fn, const void *arg);
/* What MS_LAUNCH calls today: an anonymous kernel. */
template <class F>
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const F &body) {
    launch_impl(
        nullptr, nullptr, grid, block, smem, stream, [](const void *p) { (*(const F *)p)(); },
        &body);
}
/* The named form (MS_LAUNCH could pass #kernel, kernel). */
template <class K, class F>
void launch(const char *name, K *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            const F &body) {
    launch_impl(
        name, reinterpret_cast<const void *>(kernel), grid, block, smem, stream,
        [](const void *p) { (*(const F *)p)(); }, &body);
}

/* Reseed the scheduler's RNG (what MS_EMU_SEED sets at the first launch)
 * for the launches that follow; returns the RNG's state before, which
 * restores the sequence when passed back.  For tests that sweep seeds. */
uint64_t reseed(uint64_t seed);

/* The running launch's dynamic shared memory (NULL when it asked for none). */
void *dyn_smem();

/* Sync points, called by the built-ins below.  `what` names the call in
 * diagnostics. */
enum { PRED_NONE, PRED_COUNT, PRED_AND, PRED_OR };
int block_sync(int pred_op, int pred);
void warp_sync(unsigned mask, const char *what);
enum { WC_XOR, WC_DOWN, WC_UP, WC_IDX, WC_BALLOT };
uint64_t warp_collective(int op, unsigned mask, uint64_t bits, int arg, int width,
                         const char *what);
[[noreturn]] void kernel_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* For the emulated libraries: does [p, p + bytes) lie in one live
 * cudaMalloc allocation?  A message naming `what` goes to stderr if not. */
bool device_range_ok(const void *p, size_t bytes, const char *what);
bool stream_ok(cudaStream_t s);
void set_last_error(cudaError_t e);

template <class T> static inline uint64_t to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                  "msemu: shuffles move values of at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> static inline T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}

} // namespace msemu

/* ---- built-in variables (set per fiber by the executor) ---- */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
constexpr int warpSize = 32;

/* ---- barriers ---- */
static inline void __syncthreads() {
    msemu::block_sync(msemu::PRED_NONE, 0);
}
static inline int __syncthreads_count(int p) {
    return msemu::block_sync(msemu::PRED_COUNT, p);
}
static inline int __syncthreads_and(int p) {
    return msemu::block_sync(msemu::PRED_AND, p);
}
static inline int __syncthreads_or(int p) {
    return msemu::block_sync(msemu::PRED_OR, p);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    msemu::warp_sync(mask, "__syncwarp");
}
static inline void __threadfence() {}
static inline void __threadfence_block() {}

/* ---- warp shuffles and votes (full mask, width 32) ---- */
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return msemu::from_bits<T>(msemu::warp_collective(msemu::WC_XOR, mask, msemu::to_bits(v),
                                                      lane_mask, width, "__shfl_xor_sync"));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return msemu::from_bits<T>(msemu::warp_collective(msemu::WC_DOWN, mask, msemu::to_bits(v),
                                                      (int)delta, width, "__shfl_down_sync"));
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return msemu::from_bits<T>(msemu::warp_collective(msemu::WC_UP, mask, msemu::to_bits(v),
                                                      (int)delta, width, "__shfl_up_sync"));
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    return msemu::from_bits<T>(msemu::warp_collective(msemu::WC_IDX, mask, msemu::to_bits(v),
                                                      src_lane, width, "__shfl_sync"));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)msemu::warp_collective(msemu::WC_BALLOT, mask, pred != 0, 0, 32,
                                            "__ballot_sync");
}
static inline int __any_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) != 0;
}
static inline int __all_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) == 0xffffffffu;
}

/* ---- integer atomics (fibers never switch inside one: plain RMW is atomic) ---- */
#define MSEMU_ATOMICS(T)                                                                           \
    static inline T atomicAdd(T *p, T v) {                                                         \
        T o = *p;                                                                                  \
        *p = o + v;                                                                                \
        return o;                                                                                  \
    }                                                                                              \
    static inline T atomicSub(T *p, T v) {                                                         \
        T o = *p;                                                                                  \
        *p = o - v;                                                                                \
        return o;                                                                                  \
    }                                                                                              \
    static inline T atomicExch(T *p, T v) {                                                        \
        T o = *p;                                                                                  \
        *p = v;                                                                                    \
        return o;                                                                                  \
    }                                                                                              \
    static inline T atomicMin(T *p, T v) {                                                         \
        T o = *p;                                                                                  \
        *p = v < o ? v : o;                                                                        \
        return o;                                                                                  \
    }                                                                                              \
    static inline T atomicMax(T *p, T v) {                                                         \
        T o = *p;                                                                                  \
        *p = v > o ? v : o;                                                                        \
        return o;                                                                                  \
    }                                                                                              \
    static inline T atomicAnd(T *p, T v) {                                                         \
        T o = *p;                                                                                  \
        *p = o & v;                                                                                \
        return o;                                                                                  \
    }                                                                                              \
    static inline T atomicOr(T *p, T v) {                                                          \
        T o = *p;                                                                                  \
        *p = o | v;                                                                                \
        return o;                                                                                  \
    }                                                                                              \
    static inline T atomicXor(T *p, T v) {                                                         \
        T o = *p;                                                                                  \
        *p = o ^ v;                                                                                \
        return o;                                                                                  \
    }                                                                                              \
    static inline T atomicCAS(T *p, T cmp, T v) {                                                  \
        T o = *p;                                                                                  \
        if (o == cmp) *p = v;                                                                      \
        return o;                                                                                  \
    }
MSEMU_ATOMICS(int)
MSEMU_ATOMICS(unsigned int)
MSEMU_ATOMICS(unsigned long long)
#undef MSEMU_ATOMICS
/* No float atomics: the dialect forbids them (results must be reproducible). */

/* ---- device math that libm lacks ---- */
/* glibc declares some of these names (extern "C", noexcept) without
 * exporting them: non-static inline noexcept definitions fit both cases. */
inline float __expf(float x) noexcept {
    return expf(x);
}
inline float __logf(float x) noexcept {
    return logf(x);
}
inline float __powf(float x, float y) noexcept {
    return powf(x, y);
}
inline float __sinf(float x) noexcept {
    return sinf(x);
}
inline float __cosf(float x) noexcept {
    return cosf(x);
}
inline float __tanhf(float x) noexcept {
    return tanhf(x);
}
inline float rsqrtf(float x) noexcept {
    return 1.0f / sqrtf(x);
}
inline double rsqrt(double x) noexcept {
    return 1.0 / sqrt(x);
}
static inline float __frsqrt_rn(float x) {
    return 1.0f / sqrtf(x);
}
static inline float __fdividef(float a, float b) {
    return a / b;
}
static inline float __frcp_rn(float x) {
    return 1.0f / x;
}
static inline float __fsqrt_rn(float x) {
    return sqrtf(x);
}
static inline float __fadd_rn(float a, float b) {
    return a + b;
}
static inline float __fmul_rn(float a, float b) {
    return a * b;
}
static inline float __fmaf_rn(float a, float b, float c) {
    return fmaf(a, b, c);
}
static inline float __saturatef(float x) {
    return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f;
}
static inline int __float_as_int(float x) {
    return msemu::from_bits<int>(msemu::to_bits(x));
}
static inline unsigned __float_as_uint(float x) {
    return msemu::from_bits<unsigned>(msemu::to_bits(x));
}
static inline float __int_as_float(int x) {
    return msemu::from_bits<float>(msemu::to_bits(x));
}
static inline float __uint_as_float(unsigned x) {
    return msemu::from_bits<float>(msemu::to_bits(x));
}
static inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
static inline int __clz(int x) {
    return x ? __builtin_clz((unsigned)x) : 32;
}
static inline int __ffs(int x) {
    return __builtin_ffs(x);
}
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
template <class T> static inline T __ldg(const T *p) {
    return *p;
}

/* CUDA's overloaded min/max (mixed types promote as in C++). */
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value &&
                                          std::is_arithmetic<B>::value>::type>
static inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type R;
    return (R)a < (R)b ? (R)a : (R)b;
}
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value &&
                                          std::is_arithmetic<B>::value>::type>
static inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type R;
    return (R)a > (R)b ? (R)a : (R)b;
}

#endif
