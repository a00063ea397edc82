/* cu_backend.cu - the CUDA backend object: device memory, copies, scratch
 * sizing (reserve), creation and the op table.
 *
 * One non-blocking stream per backend carries every op, so ops are ordered
 * without device-wide synchronisation.  The host waits for the stream only
 * where a value is needed on the host: to_host (the loss once per step, and
 * checkpoint copies), the reductions that return a double, and sync().
 * to_device copies small buffers (tokens, targets: < CU_STAGE_BYTES) through
 * a pinned staging buffer so they are asynchronous too; the staging buffer
 * is reused only after an event says its previous copy has finished.
 * Memory comes from cudaMalloc once at model creation (the model allocates
 * few, large buffers); nothing is allocated in the step loop.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cu_internal.h"

extern "C" {
#include "base/log.h"
}

#define CU_STAGE_BYTES ((size_t)4 << 20)
#define CU_MAX_ALLOCS 4096
#define CU_LT_WS_BYTES ((size_t)32 << 20) /* cuBLASLt workspace (Hopper kernels want 32 MiB) */

typedef struct {
    cu_ctx c;
    void *stage; /* pinned, CU_STAGE_BYTES */
    cudaEvent_t stage_done;
    int stage_pending;
    /* device memory accounting (allocations are few and large) */
    struct {
        void *p;
        size_t n;
    } allocs[CU_MAX_ALLOCS];
    int n_allocs;
    size_t bytes, peak;
} cu_backend_ctx;

void cu_fatal(const char *file, int line, const char *what, const char *msg) {
    fprintf(stderr, "%s:%d: CUDA call failed: %s: %s\n", file, line, what, msg);
    fflush(stderr);
    abort();
}

static cu_backend_ctx *cbx(be_backend *be) {
    return (cu_backend_ctx *)be->ctx;
}

/* Zeroed device memory; NULL (and the error cleared) when the device is out
 * of memory, so the caller can report what it was allocating. */
static void account(cu_backend_ctx *x, void *p, size_t n) {
    x->bytes += n;
    if (x->bytes > x->peak) x->peak = x->bytes;
    if (x->n_allocs < CU_MAX_ALLOCS) {
        x->allocs[x->n_allocs].p = p;
        x->allocs[x->n_allocs++].n = n;
    }
}

static void unaccount(cu_backend_ctx *x, void *p) {
    for (int i = 0; i < x->n_allocs; i++)
        if (x->allocs[i].p == p) {
            x->bytes -= x->allocs[i].n;
            x->allocs[i] = x->allocs[--x->n_allocs];
            return;
        }
}

static void *cu_alloc(be_backend *be, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    CU_CHECK(cudaMemsetAsync(p, 0, bytes, cu_of(be)->stream));
    account(cbx(be), p, bytes);
    return p;
}

static void cu_free(be_backend *be, void *p) {
    if (!p) return;
    CU_CHECK(cudaStreamSynchronize(cu_of(be)->stream));
    CU_CHECK(cudaFree(p));
    unaccount(cbx(be), p);
}

static void cu_to_device(be_backend *be, void *dst, const void *src, size_t bytes) {
    cu_backend_ctx *x = cbx(be);
    if (!bytes) return;
    if (bytes > CU_STAGE_BYTES) { /* large: setup-time loads; plain synchronous copy */
        CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, x->c.stream));
        CU_CHECK(cudaStreamSynchronize(x->c.stream));
        return;
    }
    if (x->stage_pending) CU_CHECK(cudaEventSynchronize(x->stage_done));
    memcpy(x->stage, src, bytes);
    CU_CHECK(cudaMemcpyAsync(dst, x->stage, bytes, cudaMemcpyHostToDevice, x->c.stream));
    CU_CHECK(cudaEventRecord(x->stage_done, x->c.stream));
    x->stage_pending = 1;
}

static void cu_to_host(be_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cu_of(be)->stream));
    CU_CHECK(cudaStreamSynchronize(cu_of(be)->stream));
}

static void cu_copy(be_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu_of(be)->stream));
}

static void cu_zero(be_backend *be, void *p, size_t bytes) {
    if (bytes) CU_CHECK(cudaMemsetAsync(p, 0, bytes, cu_of(be)->stream));
}

static void cu_sync(be_backend *be) {
    CU_CHECK(cudaStreamSynchronize(cu_of(be)->stream));
}

/* Device memory: anything cudaMalloc returned (managed memory counts too;
 * the host could address it, but staging it is harmless). */
static int cu_is_device(be_backend *be, const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static void *cu_host_alloc(be_backend *be, size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(be_backend *be, void *p) {
    if (p) CU_CHECK(cudaFreeHost(p));
}

static double cu_mem_peak(be_backend *be) {
    return (double)cbx(be)->peak;
}

/* Grow the shared scratch to the largest need of any module for lim. */
static ms_status cu_reserve(be_backend *be, const be_limits *lim) {
    cu_ctx *c = cu_of(be);
    if (lim->B < 0 || lim->T < 0 || lim->C < 0 || lim->NH < 0 || lim->Vp < 0)
        return ms_error(MS_ERR_ARG, "cuda backend: negative limits B=%d T=%d C=%d NH=%d Vp=%d",
                        lim->B, lim->T, lim->C, lim->NH, lim->Vp);
    be_limits m = c->lim;
    if (lim->B > m.B) m.B = lim->B;
    if (lim->T > m.T) m.T = lim->T;
    if (lim->C > m.C) m.C = lim->C;
    if (lim->NH > m.NH) m.NH = lim->NH;
    if (lim->Vp > m.Vp) m.Vp = lim->Vp;
    if (lim->max_n > m.max_n) m.max_n = lim->max_n;
    size_t need = 0, s;
#define CU_NEED(f)                                                                                 \
    s = f(&m);                                                                                     \
    if (s > need) need = s
    CU_NEED(cu_embedding_scratch_bytes);
    CU_NEED(cu_norm_scratch_bytes);
    CU_NEED(cu_elementwise_scratch_bytes);
    CU_NEED(cu_attention_scratch_bytes);
    CU_NEED(cu_classifier_scratch_bytes);
    CU_NEED(cu_optim_scratch_bytes);
    CU_NEED(cu_reduce_scratch_bytes);
#undef CU_NEED
    c->lim = m;
    if (need <= c->scratch_bytes) return MS_OK;
    void *p = NULL;
    CU_CHECK(cudaStreamSynchronize(c->stream));
    if (cudaMalloc(&p, need) != cudaSuccess) {
        (void)cudaGetLastError();
        return ms_error(MS_ERR_NOMEM, "cuda backend: cannot allocate %.1f MB of op scratch",
                        (double)need / 1e6);
    }
    if (c->scratch) {
        CU_CHECK(cudaFree(c->scratch));
        unaccount(cbx(be), c->scratch);
    }
    c->scratch = p;
    c->scratch_bytes = need;
    account(cbx(be), p, need);
    return MS_OK;
}

static void cu_destroy(be_backend *be) {
    cu_backend_ctx *x = cbx(be);
    if (x) {
        cu_ctx *c = &x->c;
        if (c->profile) {
            cu_profile_report(be);
            cu_profile_free(be);
        }
        if (c->stream) (void)cudaStreamSynchronize(c->stream);
        if (x->peak)
            ms_info("cuda backend: peak device memory %.1f MB (model, optimiser, activations and "
                    "op scratch; plus the %.0f MB cuBLASLt workspace and the CUDA context)",
                    (double)x->peak / 1e6, (double)c->lt_ws_bytes / 1e6);
        cu_gemm_cache_free(c);
        if (c->lt) cu_lt.Destroy(c->lt);
        if (c->lt_ws) cudaFree(c->lt_ws);
        if (c->scratch) cudaFree(c->scratch);
        if (c->host) cudaFreeHost(c->host);
        if (x->stage) cudaFreeHost(x->stage);
        if (x->stage_done) cudaEventDestroy(x->stage_done);
        cu_events_free(be);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(x);
    }
    free(be);
}

static void cu_fill_table(be_backend *be) {
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->to_device = cu_to_device;
    be->to_host = cu_to_host;
    be->copy = cu_copy;
    be->zero = cu_zero;
    be->sync = cu_sync;
    be->reserve = cu_reserve;
    be->destroy = cu_destroy;
    be->is_device = cu_is_device;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->ev_record = cu_ev_record;
    be->ev_poll = cu_ev_poll;
    be->ev_anchor = cu_ev_anchor;
    be->mem_peak = cu_mem_peak;
    be->embedding_fwd = cu_embedding_fwd;
    be->embedding_bwd = cu_embedding_bwd;
    be->embedding_slice_fwd = cu_embedding_slice_fwd;
    be->embedding_slice_bwd = cu_embedding_slice_bwd;
    be->layernorm_fwd = cu_layernorm_fwd;
    be->layernorm_bwd = cu_layernorm_bwd;
    be->gemm = cu_gemm;
    be->bias_bwd = cu_bias_bwd;
    be->attention_state_bytes = cu_attention_state_bytes;
    be->attention_fwd = cu_attention_fwd;
    be->attention_bwd = cu_attention_bwd;
    be->gelu_fwd = cu_gelu_fwd;
    be->gelu_bwd = cu_gelu_bwd;
    be->residual_add = cu_residual_add;
    be->bias_add = cu_bias_add;
    be->add_f32 = cu_add_f32;
    be->to_act = cu_to_act;
    be->classifier_fwd_bwd = cu_classifier_fwd_bwd;
    be->classifier_slice_stats = cu_classifier_slice_stats;
    be->classifier_slice_finish = cu_classifier_slice_finish;
    be->adamw_step = cu_adamw_step;
    be->lamb_moments = cu_lamb_moments;
    be->lamb_apply = cu_lamb_apply;
    be->sum_squares = cu_sum_squares;
    be->sum = cu_sum;
    be->has_nonfinite = cu_has_nonfinite;
}

#define CU_TRY_INIT(call, what)                                                                    \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            st = ms_error(MS_ERR_INTERNAL, "cuda backend: %s failed on GPU %d: %s", what, dev,     \
                          cudaGetErrorString(e_));                                                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

extern "C" ms_status be_cuda_create(be_backend **out, int device, const be_options *o) {
    be_options d = be_options_default();
    if (!o) o = &d;
    *out = NULL;
    int count = 0, dev = device;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        /* without a loaded driver the runtime says "driver version is
         * insufficient", which misleads: say what is missing first */
        int no_driver = access("/dev/nvidiactl", F_OK) != 0;
        return ms_error(MS_ERR_NOTFOUND, "cuda backend: no usable GPU (%s%s%s)",
                        no_driver ? "no NVIDIA driver loaded: /dev/nvidiactl is missing; " : "",
                        e != cudaSuccess ? "CUDA runtime: " : "",
                        e != cudaSuccess ? cudaGetErrorString(e) : "the runtime sees 0 devices");
    }
    if (dev < 0) dev = ms_ctx_get()->local_rank % count;
    if (dev >= count)
        return ms_error(MS_ERR_ARG, "cuda backend: GPU %d requested, but only %d visible", dev,
                        count);
    ms_status st = cu_lt_load();
    if (st != MS_OK) return st;
    be_backend *be = (be_backend *)calloc(1, sizeof *be);
    cu_backend_ctx *x = (cu_backend_ctx *)calloc(1, sizeof *x);
    cu_ctx *c = x ? &x->c : NULL;
    cudaDeviceProp prop;
    if (!be || !x) {
        st = ms_error(MS_ERR_NOMEM, "cuda backend: out of host memory");
        goto out;
    }
    be->name = "cuda";
    be->max_head_size = CU_MAX_HEAD_SIZE;
    be->max_dim = CU_MAX_DIM;
    be->act_dtype = BE_BF16;
    be->threads = 1;
    be->ctx = x;
    cu_fill_table(be);
    c->device = dev;
    c->fuse_gelu = o->cuda_fuse_gelu != 0;
    CU_TRY_INIT(cudaSetDevice(dev), "cudaSetDevice");
    CU_TRY_INIT(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    c->sm_count = prop.multiProcessorCount;
    snprintf(be->device_name, sizeof be->device_name, "%.127s", prop.name);
    CU_TRY_INIT(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream creation");
    be->stream = c->stream;
    if ((st = cu_events_init(be)) != MS_OK) goto out;
    CU_TRY_INIT(cudaEventCreateWithFlags(&x->stage_done, cudaEventDisableTiming),
                "event creation");
    CU_TRY_INIT(cudaMallocHost((void **)&c->host, 64 * sizeof(double)), "pinned allocation");
    CU_TRY_INIT(cudaMallocHost(&x->stage, CU_STAGE_BYTES), "pinned allocation");
    CU_TRY_INIT(cudaMalloc(&c->lt_ws, CU_LT_WS_BYTES), "cuBLASLt workspace allocation");
    c->lt_ws_bytes = CU_LT_WS_BYTES;
    if (cu_lt.Create(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        st = ms_error(MS_ERR_INTERNAL, "cuda backend: cublasLtCreate failed on GPU %d", dev);
        goto out;
    }
    ms_info("cuda backend: GPU %d of %d, %s, %d SMs, %.1f GB, sm_%d%d, cuBLASLt %zu%s", dev, count,
            prop.name, c->sm_count, (double)prop.totalGlobalMem / 1e9, prop.major, prop.minor,
            cu_lt.GetVersion(), c->fuse_gelu ? "" : "; GeLU unfused (--cuda-fuse-gelu 0)");
    if (o->cuda_profile) st = cu_profile_install(be);
out:
    if (st != MS_OK) {
        if (be) {
            if (x) cu_destroy(be);
            else free(be);
        }
        return st;
    }
    *out = be;
    return MS_OK;
}
