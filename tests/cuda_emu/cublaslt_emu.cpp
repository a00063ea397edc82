/* cublaslt_emu.cpp - cuBLASLt matmul on the host in double precision, with
 * the bias / GELU / GELU_AUX epilogues and the argument checks of the real
 * library (see cublasLt.h).  Handles and descriptors are heap objects
 * kept in a registry, so a destroyed or foreign one is reported instead of
 * being read.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <mutex>
#include <set>
#include <vector>

#include "cublasLt.h"
#include "cuda_bf16.h"

struct cublasLtContext {
    int unused;
};

namespace {

struct Desc {
    int compute, scale, pointer_mode, transa, transb, transc, fill;
    uint32_t epi;
    const void *bias;
    void *aux;
    int64_t aux_ld, bias_stride, aux_stride;
    int bias_type, aux_type; /* -1: D's type */
};
struct Layout {
    int type, order, batch;
    uint64_t rows, cols;
    int64_t ld, stride;
};
struct Pref {
    uint64_t max_ws;
    uint32_t align[4]; /* A, B, C, D */
};
const uint64_t ALGO_MAGIC = 0x6d73656d75616c67ull;

std::mutex live_lock;
std::set<const void *> live;

template <class T> T *track(T *p) {
    std::lock_guard<std::mutex> g(live_lock);
    live.insert(p);
    return p;
}
bool is_live(const void *p) {
    std::lock_guard<std::mutex> g(live_lock);
    return p && live.count(p);
}
bool untrack(const void *p) {
    std::lock_guard<std::mutex> g(live_lock);
    return p && live.erase(p);
}

cublasStatus_t bad(cublasStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cublasStatus_t bad(cublasStatus_t s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "msemu cublasLt: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return s;
}

template <class T> cublasStatus_t set_val(T *dst, const void *buf, size_t size, const char *what) {
    if (!buf || size != sizeof(T))
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s takes %zu bytes, got %zu%s", what, sizeof(T),
                   size, buf ? "" : " (NULL buffer)");
    memcpy(dst, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

size_t type_bytes(int t) {
    return t == CUDA_R_32F ? 4 : 2;
}
bool type_ok(int t) {
    return t == CUDA_R_32F || t == CUDA_R_16BF;
}
const char *type_name(int t) {
    return t == CUDA_R_32F ? "f32" : t == CUDA_R_16BF ? "bf16" : "?";
}

size_t index_of(const Layout *l, int64_t r, int64_t c, int b) {
    size_t i = l->order == CUBLASLT_ORDER_ROW ? (size_t)(r * l->ld + c) : (size_t)(r + c * l->ld);
    return i + (size_t)b * (size_t)l->stride;
}
/* Bytes spanned by all batches of a layout. */
size_t extent(const Layout *l) {
    size_t last = index_of(l, (int64_t)l->rows - 1, (int64_t)l->cols - 1, l->batch - 1);
    return (last + 1) * type_bytes(l->type);
}

double get(const void *p, int type, size_t i) {
    if (type == CUDA_R_32F) return ((const float *)p)[i];
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}
void put(void *p, int type, size_t i, double v) {
    if (type == CUDA_R_32F)
        ((float *)p)[i] = (float)v;
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16((float)v);
}

double gelu(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

bool epi_known(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

cublasStatus_t check_layout(const char *fn, const char *name, const Layout *l) {
    if (!type_ok(l->type))
        return bad(CUBLAS_STATUS_NOT_SUPPORTED,
                   "%s: %s has data type %d (emulated: CUDA_R_16BF, "
                   "CUDA_R_32F)",
                   fn, name, l->type);
    uint64_t need = l->order == CUBLASLT_ORDER_ROW ? l->cols : l->rows;
    if (!l->rows || !l->cols || l->ld < 1 || (uint64_t)l->ld < need || l->batch < 1)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: %s is %llux%llu with ld %lld, batch %d", fn,
                   name, (unsigned long long)l->rows, (unsigned long long)l->cols, (long long)l->ld,
                   l->batch);
    return CUBLAS_STATUS_SUCCESS;
}

/* The checks that need no pointers; on success *m,*n,*k are D (m,n) = (m,k)(k,n). */
cublasStatus_t check_problem(const char *fn, const Desc *d, const Layout *a, const Layout *b,
                             const Layout *c, const Layout *dd, int64_t *m, int64_t *n,
                             int64_t *k) {
    if (!is_live(d) || !is_live(a) || !is_live(b) || !is_live(c) || !is_live(dd))
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: a descriptor or layout is NULL or destroyed",
                   fn);
    if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_FAST_16BF &&
        d->compute != CUBLAS_COMPUTE_32F_PEDANTIC)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, "%s: compute type %d is not emulated", fn,
                   d->compute);
    if (d->scale != CUDA_R_32F || d->pointer_mode != CUBLASLT_POINTER_MODE_HOST)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, "%s: only f32 scale, host pointer mode", fn);
    if (d->transa < 0 || d->transa > 2 || d->transb < 0 || d->transb > 2 || d->transc != 0)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: bad transa %d / transb %d / transc %d", fn,
                   d->transa, d->transb, d->transc);
    if (!epi_known(d->epi))
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, "%s: epilogue %u is not emulated", fn, d->epi);
    cublasStatus_t s;
    if ((s = check_layout(fn, "A", a)) || (s = check_layout(fn, "B", b)) ||
        (s = check_layout(fn, "C", c)) || (s = check_layout(fn, "D", dd)))
        return s;
    if (a->type != b->type || c->type != dd->type || (a->type == CUDA_R_32F && dd->type != a->type))
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, "%s: types A %s B %s C %s D %s not supported", fn,
                   type_name(a->type), type_name(b->type), type_name(c->type), type_name(dd->type));
    int64_t am = d->transa ? a->cols : a->rows, ak = d->transa ? a->rows : a->cols;
    int64_t bk = d->transb ? b->cols : b->rows, bn = d->transb ? b->rows : b->cols;
    *m = dd->rows;
    *n = dd->cols;
    *k = ak;
    if (am != *m || bn != *n || bk != ak || c->rows != dd->rows || c->cols != dd->cols)
        return bad(CUBLAS_STATUS_INVALID_VALUE,
                   "%s: shapes do not match: op(A) %lldx%lld, op(B) %lldx%lld, C %llux%llu, "
                   "D %llux%llu",
                   fn, (long long)am, (long long)ak, (long long)bk, (long long)bn,
                   (unsigned long long)c->rows, (unsigned long long)c->cols,
                   (unsigned long long)dd->rows, (unsigned long long)dd->cols);
    if (a->batch != dd->batch || b->batch != dd->batch || c->batch != dd->batch)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: batch counts differ (%d %d %d %d)", fn,
                   a->batch, b->batch, c->batch, dd->batch);
    if (d->epi & CUBLASLT_EPILOGUE_BIAS) {
        int bt = d->bias_type < 0 ? dd->type : d->bias_type;
        if (!type_ok(bt)) return bad(CUBLAS_STATUS_NOT_SUPPORTED, "%s: bias type %d", fn, bt);
    }
    if (d->epi & 128) {
        if (d->aux_ld < *m || d->aux_ld % 8)
            return bad(CUBLAS_STATUS_INVALID_VALUE,
                       "%s: EPILOGUE_AUX_LD %lld must be >= %lld "
                       "rows and a multiple of 8",
                       fn, (long long)d->aux_ld, (long long)*m);
        if (d->aux_type >= 0 && d->aux_type != dd->type)
            return bad(CUBLAS_STATUS_NOT_SUPPORTED, "%s: aux type %s differs from D's %s", fn,
                       type_name(d->aux_type), type_name(dd->type));
    }
    return CUBLAS_STATUS_SUCCESS;
}

bool same_layout(const Layout *x, const Layout *y) {
    return x->type == y->type && x->order == y->order && x->rows == y->rows && x->cols == y->cols &&
           x->ld == y->ld && x->batch == y->batch && (x->batch == 1 || x->stride == y->stride);
}

cublasStatus_t check_ptr(const char *what, const void *p, size_t bytes, uint32_t align) {
    if (!p) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: %s is NULL", what);
    if (!msemu::device_range_ok(p, bytes, what)) return CUBLAS_STATUS_INVALID_VALUE;
    if (align > 16) align = 16;
    if (align && (uintptr_t)p % align)
        return bad(CUBLAS_STATUS_INVALID_VALUE,
                   "cublasLtMatmul: %s %p is not %u-byte aligned, "
                   "as the preference given to the heuristic promised",
                   what, p, align);
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = track(new cublasLtContext{0});
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!untrack(handle)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: bad handle");
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported";
    default:
        return cublasLtGetStatusName(s);
    }
}

size_t cublasLtGetVersion(void) {
    return 130000;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = (cublasLtMatrixLayout_t)track(
        new Layout{(int)type, CUBLASLT_ORDER_COL, 1, rows, cols, ld, 0});
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    if (!untrack(layout)) return bad(CUBLAS_STATUS_INVALID_VALUE, "layout destroyed twice");
    delete (Layout *)layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
    Layout *l = (Layout *)layout;
    if (!is_live(l)) return bad(CUBLAS_STATUS_INVALID_VALUE, "bad matrix layout");
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
        return set_val(&l->type, buf, size, "LAYOUT_TYPE");
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
        return set_val(&l->order, buf, size, "LAYOUT_ORDER");
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
        return set_val(&l->rows, buf, size, "LAYOUT_ROWS");
    case CUBLASLT_MATRIX_LAYOUT_COLS:
        return set_val(&l->cols, buf, size, "LAYOUT_COLS");
    case CUBLASLT_MATRIX_LAYOUT_LD:
        return set_val(&l->ld, buf, size, "LAYOUT_LD");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        return set_val(&l->batch, buf, size, "LAYOUT_BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        return set_val(&l->stride, buf, size, "LAYOUT_STRIDED_BATCH_OFFSET");
    }
    return bad(CUBLAS_STATUS_NOT_SUPPORTED, "layout attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc,
                                        cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    Desc *d = new Desc{};
    d->compute = compute_type;
    d->scale = scale_type;
    d->epi = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = d->aux_type = -1;
    *desc = (cublasLtMatmulDesc_t)track(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    if (!untrack(desc)) return bad(CUBLAS_STATUS_INVALID_VALUE, "matmul desc destroyed twice");
    delete (Desc *)desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size) {
    Desc *d = (Desc *)desc;
    if (!is_live(d)) return bad(CUBLAS_STATUS_INVALID_VALUE, "bad matmul desc");
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
        return set_val(&d->compute, buf, size, "COMPUTE_TYPE");
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        return set_val(&d->scale, buf, size, "SCALE_TYPE");
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        return set_val(&d->pointer_mode, buf, size, "POINTER_MODE");
    case CUBLASLT_MATMUL_DESC_TRANSA:
        return set_val(&d->transa, buf, size, "TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB:
        return set_val(&d->transb, buf, size, "TRANSB");
    case CUBLASLT_MATMUL_DESC_TRANSC:
        return set_val(&d->transc, buf, size, "TRANSC");
    case CUBLASLT_MATMUL_DESC_FILL_MODE:
        return set_val(&d->fill, buf, size, "FILL_MODE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        return set_val(&d->epi, buf, size, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return set_val(&d->bias, buf, size, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
        return set_val(&d->bias_stride, buf, size, "BIAS_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return set_val(&d->aux, buf, size, "EPILOGUE_AUX_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        return set_val(&d->aux_ld, buf, size, "EPILOGUE_AUX_LD (int64_t)");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
        return set_val(&d->aux_stride, buf, size, "EPILOGUE_AUX_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
        return set_val(&d->aux_type, buf, size, "EPILOGUE_AUX_DATA_TYPE");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        return set_val(&d->bias_type, buf, size, "BIAS_DATA_TYPE");
    }
    return bad(CUBLAS_STATUS_NOT_SUPPORTED, "matmul desc attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = (cublasLtMatmulPreference_t)track(new Pref{0, {256, 256, 256, 256}});
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (!untrack(pref)) return bad(CUBLAS_STATUS_INVALID_VALUE, "preference destroyed twice");
    delete (Pref *)pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    Pref *p = (Pref *)pref;
    uint32_t u32;
    uint64_t u64;
    float f;
    if (!is_live(p)) return bad(CUBLAS_STATUS_INVALID_VALUE, "bad matmul preference");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        return set_val(&p->max_ws, buf, size, "PREF_MAX_WORKSPACE_BYTES (uint64_t)");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        return set_val(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size,
                       "PREF_MIN_ALIGNMENT_*_BYTES (uint32_t)");
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
        return set_val(&u32, buf, size, "PREF (uint32_t)");
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
        return set_val(&f, buf, size, "PREF (float)");
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
        return set_val(&u64, buf, size, "PREF (uint64_t)");
    }
    return bad(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute %d is not emulated", (int)attr);
}

cublasStatus_t
cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                               cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                               cublasLtMatmulPreference_t pref, int requested,
                               cublasLtMatmulHeuristicResult_t results[], int *returned) {
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    if (returned) *returned = 0;
    if (!is_live(handle) || !is_live(pref) || requested < 1 || !results || !returned)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: bad handle, preference or result array", fn);
    int64_t m, n, k;
    cublasStatus_t s = check_problem(fn, (Desc *)desc, (Layout *)Adesc, (Layout *)Bdesc,
                                     (Layout *)Cdesc, (Layout *)Ddesc, &m, &n, &k);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    const Pref *p = (const Pref *)pref;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = ALGO_MAGIC;
    for (int i = 0; i < 4; i++)
        results[0].algo.data[1 + i] = p->align[i];
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    const char *fn = "cublasLtMatmul";
    const Desc *d = (const Desc *)desc;
    const Layout *la = (const Layout *)Adesc, *lb = (const Layout *)Bdesc;
    const Layout *lc = (const Layout *)Cdesc, *ld = (const Layout *)Ddesc;
    if (!is_live(handle)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "%s: bad handle", fn);
    if (!alpha || !beta) return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha/beta NULL", fn);
    if (!msemu::stream_ok(stream))
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: stream %p is not live", fn, (void *)stream);
    int64_t m, n, k;
    cublasStatus_t s = check_problem(fn, d, la, lb, lc, ld, &m, &n, &k);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    double al = *(const float *)alpha, be = *(const float *)beta;
    bool has_bias = d->epi & CUBLASLT_EPILOGUE_BIAS, has_aux = d->epi & 128,
         has_gelu = d->epi & CUBLASLT_EPILOGUE_GELU;
    if (has_aux && be != 0.0)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: GELU_AUX epilogues need beta == 0", fn);
    if (algo && algo->data[0] != ALGO_MAGIC)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: algo not from the heuristic", fn);
    uint32_t al_a = algo ? (uint32_t)algo->data[1] : 0, al_b = algo ? (uint32_t)algo->data[2] : 0;
    uint32_t al_c = algo ? (uint32_t)algo->data[3] : 0, al_d = algo ? (uint32_t)algo->data[4] : 0;
    if ((s = check_ptr("A", A, extent(la), al_a)) || (s = check_ptr("B", B, extent(lb), al_b)) ||
        (s = check_ptr("D", D, extent(ld), al_d)))
        return s;
    if ((C || be != 0.0) && (s = check_ptr("C", C, extent(lc), al_c))) return s;
    if (C == D && !same_layout(lc, ld))
        return bad(CUBLAS_STATUS_INVALID_VALUE, "%s: in place (C == D) needs Cdesc == Ddesc", fn);
    int bias_t = d->bias_type < 0 ? ld->type : d->bias_type;
    if (has_bias &&
        (s = check_ptr("bias", d->bias,
                       ((size_t)(ld->batch - 1) * d->bias_stride + m) * type_bytes(bias_t), 0)))
        return s;
    Layout aux_l = {ld->type,    CUBLASLT_ORDER_COL, ld->batch,    (uint64_t)m,
                    (uint64_t)n, d->aux_ld,          d->aux_stride};
    if (has_aux && (s = check_ptr("aux", d->aux, extent(&aux_l), 0))) return s;
    if (workspace_bytes && workspace &&
        !msemu::device_range_ok(workspace, workspace_bytes, "cublasLtMatmul workspace"))
        return CUBLAS_STATUS_INVALID_VALUE;

    std::vector<double> ao((size_t)(m * k)), bo((size_t)(n * k));
    for (int bt = 0; bt < ld->batch; bt++) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t q = 0; q < k; q++)
                ao[i * k + q] =
                    get(A, la->type, d->transa ? index_of(la, q, i, bt) : index_of(la, i, q, bt));
        for (int64_t j = 0; j < n; j++)
            for (int64_t q = 0; q < k; q++)
                bo[j * k + q] =
                    get(B, lb->type, d->transb ? index_of(lb, j, q, bt) : index_of(lb, q, j, bt));
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                const double *x = &ao[i * k], *y = &bo[j * k];
                double acc = 0.0;
                for (int64_t q = 0; q < k; q++)
                    acc += x[q] * y[q];
                double v = al * acc;
                if (be != 0.0) v += be * get(C, lc->type, index_of(lc, i, j, bt));
                if (has_bias) v += get(d->bias, bias_t, (size_t)bt * d->bias_stride + i);
                if (has_aux) put(d->aux, ld->type, index_of(&aux_l, i, j, bt), v);
                if (has_gelu) v = gelu(v);
                put(D, ld->type, index_of(ld, i, j, bt), v);
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
