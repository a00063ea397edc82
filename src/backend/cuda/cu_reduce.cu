/* cu_reduce.cu - host-returning reductions over f32 vectors: sum, sum of
 * squares (both in double) and the non-finite test, plus the second pass
 * they share with LAMB (cu_optim.cu).
 *
 * Launch: pass 1 runs G = cu_reduce_blocks(n) blocks (4 per SM, at most
 * CU_RED_MAX_BLOCKS) of CU_RED_THREADS threads in a grid-stride loop over
 * groups of 4 elements (one 16-byte load when x is aligned), accumulating
 * per thread in double; each block reduces its threads in a fixed tree into
 * one partial in scratch.  Pass 2 is one block that sums the G partials in a
 * fixed order; the double is copied to pinned host memory and the stream
 * waited for.
 * Deterministic: G depends only on n and the device, the elements a thread
 * visits and their order do not depend on alignment (the vector and scalar
 * paths read the same groups), both trees are fixed, and there are no
 * atomics.  The non-finite test sums 0/1 flags in the same shape (exact).
 */
#include "cu_ops.cuh"

enum { RED_SUM = 0, RED_SQ = 1, RED_BAD = 2 };

template <int MODE> __device__ static inline double red_term(float x) {
    if (MODE == RED_SUM) return (double)x;
    if (MODE == RED_SQ) return (double)x * (double)x;
    return isfinite(x) ? 0.0 : 1.0;
}

/* part (G) = per-block sums of red_term(x) over x (n); vec: x is 16-byte
 * aligned. */
template <int MODE>
__global__ void red_part_kernel(double *part, const float *x, size_t n, int vec) {
    __shared__ double buf[CU_RED_THREADS];
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, n4 = n / 4;
    double acc = 0.0;
    for (size_t g = tid; g < n4; g += stride) {
        cu_f32x4 v;
        if (vec)
            v = ((const cu_f32x4 *)x)[g];
        else
            for (int j = 0; j < 4; j++)
                v.v[j] = x[4 * g + j];
        for (int j = 0; j < 4; j++)
            acc += red_term<MODE>(v.v[j]);
    }
    if (tid < n - 4 * n4) acc += red_term<MODE>(x[4 * n4 + tid]);
    double s = cu_block_sum_d(acc, buf);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* part (k,G): part[k*G + j] = sum of row j, in a fixed order. */
__global__ void red_final_kernel(double *part, int G, int k) {
    __shared__ double buf[CU_RED_THREADS];
    for (int j = 0; j < k; j++) {
        double acc = 0.0;
        for (int i = threadIdx.x; i < G; i += blockDim.x)
            acc += part[(size_t)j * G + i];
        double s = cu_block_sum_d(acc, buf);
        if (threadIdx.x == 0) part[(size_t)k * G + j] = s;
    }
}

int cu_reduce_blocks(be_backend *be, size_t n) {
    size_t g = 4 * (size_t)(cu_of(be)->sm_count > 0 ? cu_of(be)->sm_count : 1);
    size_t need = (n + 4 * (size_t)CU_RED_THREADS - 1) / (4 * (size_t)CU_RED_THREADS);
    if (g > CU_RED_MAX_BLOCKS) g = CU_RED_MAX_BLOCKS;
    if (g > need) g = need;
    return g < 1 ? 1 : (int)g;
}

void cu_reduce_finish(be_backend *be, double *part, int G, int k, double *out) {
    cu_ctx *cx = cu_of(be);
    MS_CHECKF(k >= 1 && k <= 2 && G >= 1 && G <= CU_RED_MAX_BLOCKS, "reduce: bad k=%d G=%d", k, G);
    MS_LAUNCH(red_final_kernel, 1, CU_RED_THREADS, 0, cx->stream, part, G, k);
    CU_CHECK_LAUNCH();
    CU_CHECK(cudaMemcpyAsync(cx->host, part + (size_t)k * G, (size_t)k * sizeof(double),
                             cudaMemcpyDeviceToHost, cx->stream));
    CU_CHECK(cudaStreamSynchronize(cx->stream));
    for (int j = 0; j < k; j++)
        out[j] = cx->host[j];
}

/* Both passes of one reduction of x (n). */
template <int MODE> static double red_run(be_backend *be, const float *x, size_t n) {
    cu_ctx *cx = cu_of(be);
    if (n == 0) return 0.0;
    MS_CHECKF(cx->scratch_bytes >= CU_RED_SCRATCH_BYTES(1),
              "reduce: scratch %zu bytes < %zu (call reserve)", cx->scratch_bytes,
              CU_RED_SCRATCH_BYTES(1));
    int G = cu_reduce_blocks(be, n);
    double *part = (double *)cx->scratch, r = 0.0;
    MS_LAUNCH(red_part_kernel<MODE>, G, CU_RED_THREADS, 0, cx->stream, part, x, n, cu_al16(x));
    CU_CHECK_LAUNCH();
    cu_reduce_finish(be, part, G, 1, &r);
    return r;
}

/* Sum of squares of x (n) f32, in double. */
double cu_sum_squares(be_backend *be, const float *x, size_t n) {
    return red_run<RED_SQ>(be, x, n);
}

/* Sum of x (n) f32, in double. */
double cu_sum(be_backend *be, const float *x, size_t n) {
    return red_run<RED_SUM>(be, x, n);
}

/* 1 if any of x (n) f32 is NaN or Inf. */
int cu_has_nonfinite(be_backend *be, const float *x, size_t n) {
    return red_run<RED_BAD>(be, x, n) != 0.0;
}

size_t cu_reduce_scratch_bytes(const be_limits *lim) {
    (void)lim;
    return CU_RED_SCRATCH_BYTES(1);
}
