/* cuda_runtime_emu.cpp - the host runtime of the emulated device: device
 * and pinned memory (a registry of live allocations that copies, memsets
 * and the emulated libraries check their pointers against), streams and
 * events (handles in a registry, so a destroyed one is caught), the last
 * error per host thread, and the device queries.  All work is synchronous;
 * see cuda_runtime.h for the semantics.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>

#include <map>
#include <mutex>
#include <set>

#include "cuda_runtime.h"

struct CUstream_st {
    unsigned flags;
};
struct CUevent_st {
    unsigned flags;
    int recorded;
    double t_ms;
};

namespace {

enum { A_DEV, A_HOST };
struct Alloc {
    size_t bytes;
    int kind;
};

struct Registry {
    std::mutex lock;
    std::map<uintptr_t, Alloc> allocs;
    std::set<const void *> handles; /* live streams and events */
    size_t dev_used = 0;
};
Registry R;
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t fail(cudaError_t e, const char *fmt, ...) {
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "msemu: ");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
    }
    last_error = e;
    return e;
}

bool no_device() {
    const char *e = getenv("MS_EMU_NO_DEVICE");
    return e && *e && strcmp(e, "0") != 0;
}

size_t device_total() {
    const char *e = getenv("MS_EMU_DEVICE_MEM_MB");
    if (e && atol(e) > 0) return (size_t)atol(e) << 20;
    struct sysinfo si;
    if (sysinfo(&si) != 0) return (size_t)8 << 30;
    return (size_t)si.totalram * si.mem_unit;
}

/* The allocation holding p (R.lock held), or NULL. */
const std::pair<const uintptr_t, Alloc> *find_alloc(const void *p) {
    uintptr_t a = (uintptr_t)p;
    auto it = R.allocs.upper_bound(a);
    if (it == R.allocs.begin()) return nullptr;
    --it;
    return a < it->first + (it->second.bytes ? it->second.bytes : 1) ? &*it : nullptr;
}

/* 0: p is not device memory; 1: [p, p+n) lies in one device allocation;
 * -1: p is device memory but the range runs past its allocation. */
int dev_range(const void *p, size_t n) {
    std::lock_guard<std::mutex> g(R.lock);
    auto *a = find_alloc(p);
    if (!a || a->second.kind != A_DEV) return 0;
    return (uintptr_t)p + n <= a->first + a->second.bytes ? 1 : -1;
}

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

bool handle_ok(const void *h) {
    std::lock_guard<std::mutex> g(R.lock);
    return R.handles.count(h) != 0;
}

void handle_add(const void *h) {
    std::lock_guard<std::mutex> g(R.lock);
    R.handles.insert(h);
}

bool handle_remove(const void *h) {
    std::lock_guard<std::mutex> g(R.lock);
    return R.handles.erase(h) != 0;
}

const char *kind_name(int k) {
    static const char *const n[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice",
                                    "Default"};
    return k >= 0 && k <= 4 ? n[k] : "?";
}

/* Checks the two sides of a copy of n bytes against its kind. */
cudaError_t check_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                       const char *what) {
    if (!n) return cudaSuccess;
    if (!dst || !src) return fail(cudaErrorInvalidValue, "%s: NULL pointer", what);
    if ((int)kind < 0 || (int)kind > 4)
        return fail(cudaErrorInvalidMemcpyDirection, "%s: bad kind %d", what, (int)kind);
    int d = dev_range(dst, n), s = dev_range(src, n);
    bool want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (d < 0 || s < 0)
        return fail(cudaErrorInvalidValue,
                    "%s: %zu bytes from %p to %p run past the end of the %s "
                    "allocation",
                    what, n, src, dst, d < 0 ? "destination" : "source");
    if (kind != cudaMemcpyDefault && (d != want_d || s != want_s))
        return fail(cudaErrorInvalidValue,
                    "%s(%s): the destination is %s memory and the source %s memory", what,
                    kind_name(kind), d ? "device" : "host", s ? "device" : "host");
    return cudaSuccess;
}

} // namespace

namespace msemu {

bool device_range_ok(const void *p, size_t bytes, const char *what) {
    if (!bytes) return true;
    int r = p ? dev_range(p, bytes) : 0;
    if (r == 1) return true;
    fprintf(stderr, "msemu: %s: %zu bytes at %p %s\n", what, bytes, p,
            r < 0 ? "run past the end of their cudaMalloc allocation"
                  : "are not device memory (not from cudaMalloc)");
    return false;
}

bool stream_ok(cudaStream_t s) {
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || handle_ok(s);
}

void set_last_error(cudaError_t e) {
    last_error = e;
}

cudaError_t memcpy_symbol(void *sym, size_t sym_bytes, const void *src, size_t count, size_t offset,
                          int to_symbol) {
    if (offset > sym_bytes || count > sym_bytes - offset)
        return fail(cudaErrorInvalidValue,
                    "cudaMemcpy%sSymbol: %zu bytes at offset %zu of a "
                    "%zu-byte symbol",
                    to_symbol ? "To" : "From", count, offset, sym_bytes);
    if (to_symbol)
        memcpy((char *)sym + offset, src, count);
    else
        memcpy((void *)src, (char *)sym + offset, count);
    return cudaSuccess;
}

} // namespace msemu

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return fail(cudaErrorInvalidValue, nullptr);
    *count = no_device() ? 0 : 1;
    return *count ? cudaSuccess : fail(cudaErrorNoDevice, nullptr);
}

cudaError_t cudaSetDevice(int device) {
    if (no_device()) return fail(cudaErrorNoDevice, nullptr);
    return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice, nullptr);
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return fail(cudaErrorInvalidValue, nullptr);
    if (no_device()) return fail(cudaErrorNoDevice, nullptr);
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    if (!p) return fail(cudaErrorInvalidValue, nullptr);
    if (no_device()) return fail(cudaErrorNoDevice, nullptr);
    if (device != 0) return fail(cudaErrorInvalidDevice, nullptr);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuda-emu (CPU)");
    p->totalGlobalMem = device_total();
    p->sharedMemPerBlock = MSEMU_SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = MSEMU_SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->reservedSharedMemPerBlock = 1024;
    p->regsPerBlock = p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = MSEMU_SM_COUNT;
    p->canMapHostMemory = p->concurrentKernels = p->unifiedAddressing = 1;
    p->managedMemory = p->cooperativeLaunch = 1;
    p->asyncEngineCount = 2;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    struct cudaDeviceProp p;
    if (!value) return fail(cudaErrorInvalidValue, nullptr);
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
        *value = p.maxThreadsPerBlock;
        break;
    case cudaDevAttrMaxBlockDimX:
        *value = p.maxThreadsDim[0];
        break;
    case cudaDevAttrMaxGridDimX:
        *value = p.maxGridSize[0];
        break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
        *value = (int)p.sharedMemPerBlock;
        break;
    case cudaDevAttrWarpSize:
        *value = 32;
        break;
    case cudaDevAttrMultiProcessorCount:
        *value = p.multiProcessorCount;
        break;
    case cudaDevAttrL2CacheSize:
        *value = p.l2CacheSize;
        break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
        *value = p.maxThreadsPerMultiProcessor;
        break;
    case cudaDevAttrComputeCapabilityMajor:
        *value = p.major;
        break;
    case cudaDevAttrComputeCapabilityMinor:
        *value = p.minor;
        break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
        *value = (int)p.sharedMemPerMultiprocessor;
        break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *value = (int)p.sharedMemPerBlockOptin;
        break;
    default:
        return fail(cudaErrorInvalidValue,
                    "cudaDeviceGetAttribute: attribute %d is not "
                    "emulated",
                    (int)attr);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) {
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version) {
    if (!version) return fail(cudaErrorInvalidValue, nullptr);
    *version = 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
    return cudaDriverGetVersion(version);
}

/* ---- memory ---- */

static cudaError_t alloc_common(void **ptr, size_t size, int kind) {
    if (!ptr) return fail(cudaErrorInvalidValue, nullptr);
    *ptr = nullptr;
    if (!size) return cudaSuccess;
    std::lock_guard<std::mutex> g(R.lock);
    if (kind == A_DEV && size > device_total() - R.dev_used)
        return fail(cudaErrorMemoryAllocation, nullptr);
    void *p = nullptr;
    if (posix_memalign(&p, 256, (size + 255) / 256 * 256) != 0)
        return fail(cudaErrorMemoryAllocation, nullptr);
    if (kind == A_DEV) {
        memset(p, 0xFF, size); /* NaN everywhere: reads of unwritten memory show */
        R.dev_used += size;
    }
    R.allocs[(uintptr_t)p] = Alloc{size, kind};
    *ptr = p;
    return cudaSuccess;
}

static cudaError_t free_common(void *ptr, int kind, const char *what) {
    if (!ptr) return cudaSuccess;
    std::lock_guard<std::mutex> g(R.lock);
    auto it = R.allocs.find((uintptr_t)ptr);
    if (it == R.allocs.end() || it->second.kind != kind)
        return fail(cudaErrorInvalidValue, "%s(%p): not a pointer returned by %s", what, ptr,
                    kind == A_DEV ? "cudaMalloc" : "cudaMallocHost/cudaHostAlloc");
    if (kind == A_DEV) R.dev_used -= it->second.bytes;
    R.allocs.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
    return alloc_common(ptr, size, A_DEV);
}
cudaError_t cudaFree(void *ptr) {
    return free_common(ptr, A_DEV, "cudaFree");
}
cudaError_t cudaMallocHost(void **ptr, size_t size) {
    return alloc_common(ptr, size, A_HOST);
}
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
    return alloc_common(ptr, size, A_HOST);
}
cudaError_t cudaFreeHost(void *ptr) {
    return free_common(ptr, A_HOST, "cudaFreeHost");
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue, nullptr);
    std::lock_guard<std::mutex> g(R.lock);
    *total_bytes = device_total();
    *free_bytes = *total_bytes - R.dev_used;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr) {
    if (!attr) return fail(cudaErrorInvalidValue, nullptr);
    memset(attr, 0, sizeof *attr);
    std::lock_guard<std::mutex> g(R.lock);
    auto *a = ptr ? find_alloc(ptr) : nullptr;
    attr->type = !a                        ? cudaMemoryTypeUnregistered
                 : a->second.kind == A_DEV ? cudaMemoryTypeDevice
                                           : cudaMemoryTypeHost;
    attr->device = a ? 0 : -2;
    attr->devicePointer = a ? (void *)ptr : nullptr;
    attr->hostPointer = a && a->second.kind == A_HOST ? (void *)ptr : nullptr;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    cudaError_t e = check_copy(dst, src, count, kind, "cudaMemcpy");
    if (e == cudaSuccess && count) memmove(dst, src, count);
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    if (!msemu::stream_ok(stream))
        return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: bad stream %p",
                    (void *)stream);
    cudaError_t e = check_copy(dst, src, count, kind, "cudaMemcpyAsync");
    if (e == cudaSuccess && count) memmove(dst, src, count);
    return e;
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind) {
    if (!width || !height) return cudaSuccess;
    if (width > dpitch || width > spitch)
        return fail(cudaErrorInvalidValue, "cudaMemcpy2D: width %zu over a pitch (%zu, %zu)", width,
                    dpitch, spitch);
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = check_copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width,
                                   kind, "cudaMemcpy2D");
        if (e != cudaSuccess) return e;
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream) {
    if (!msemu::stream_ok(stream))
        return fail(cudaErrorInvalidResourceHandle, "cudaMemcpy2DAsync: bad stream");
    return cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind);
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
    if (!count) return cudaSuccess;
    if (!msemu::device_range_ok(ptr, count, "cudaMemset"))
        return fail(cudaErrorInvalidValue, nullptr);
    memset(ptr, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
    if (!msemu::stream_ok(stream))
        return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: bad stream %p",
                    (void *)stream);
    return cudaMemset(ptr, value, count);
}

/* ---- streams and events ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    if (!stream || flags > cudaStreamNonBlocking) return fail(cudaErrorInvalidValue, nullptr);
    *stream = new CUstream_st{flags};
    handle_add(*stream);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
    return cudaStreamCreateWithFlags(stream, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream || !handle_remove(stream))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a live stream",
                    (void *)stream);
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    return msemu::stream_ok(stream)
               ? cudaSuccess
               : fail(cudaErrorInvalidResourceHandle,
                      "cudaStreamSynchronize(%p): not a live stream", (void *)stream);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    return cudaStreamSynchronize(stream);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (!msemu::stream_ok(stream) || !handle_ok(event))
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: bad stream or event");
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    if (!event || flags > (cudaEventBlockingSync | cudaEventDisableTiming | 0x4))
        return fail(cudaErrorInvalidValue, nullptr);
    *event = new CUevent_st{flags, 0, 0.0};
    handle_add(*event);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, 0);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!handle_ok(event) || !msemu::stream_ok(stream))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: bad event or stream");
    event->recorded = 1;
    event->t_ms = now_ms();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return handle_ok(event) ? cudaSuccess
                            : fail(cudaErrorInvalidResourceHandle,
                                   "cudaEventSynchronize(%p): not a live event", (void *)event);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    return cudaEventSynchronize(event);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return fail(cudaErrorInvalidValue, nullptr);
    if (!handle_ok(start) || !handle_ok(end))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: bad event");
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return fail(cudaErrorInvalidResourceHandle, nullptr);
    if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle, nullptr);
    *ms = (float)(end->t_ms - start->t_ms);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (!event || !handle_remove(event))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a live event",
                    (void *)event);
    delete event;
    return cudaSuccess;
}

/* ---- errors ---- */

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    return last_error;
}

static const struct {
    cudaError_t e;
    const char *name, *text;
} error_table[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorString(cudaError_t error) {
    for (const auto &t : error_table)
        if (t.e == error) return t.text;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error) {
    for (const auto &t : error_table)
        if (t.e == error) return t.name;
    return "cudaErrorUnknown";
}

} /* extern "C" */
