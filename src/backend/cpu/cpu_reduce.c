/* cpu_reduce.c - host-returning reductions over fp32 vectors: sum, sum of
 * squares (in double) and the non-finite test.  Each thread reduces a fixed
 * slice with 8 fixed lanes; slices are combined in thread order, so the
 * result depends only on the data and the thread count. */
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* Sum of x[lo..hi) (squares if sq) in double with 8 lanes. */
static double cpu_sum_slice(const float *restrict x, size_t lo, size_t hi, int sq) {
    double acc[8] = {0}, s = 0.0;
    size_t i = lo;
    if (sq) {
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += (double)x[i + j] * (double)x[i + j];
    } else {
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += (double)x[i + j];
    }
    for (int j = 0; j < 8; j++)
        s += acc[j];
    for (; i < hi; i++)
        s += sq ? (double)x[i] * (double)x[i] : (double)x[i];
    return s;
}

static double cpu_reduce(be_backend *be, const float *x, size_t n, int sq) {
    cpu_ctx *cx = cpu_ctx_of(be);
    int used = 1;
#pragma omp parallel num_threads(cx->threads)
    {
        int tid = omp_get_thread_num(), nthr = omp_get_num_threads();
        if (tid == 0) used = nthr;
        size_t lo, hi;
        cpu_split(n, nthr, tid, &lo, &hi);
        cx->dpart[tid * 16] = cpu_sum_slice(x, lo, hi, sq);
    }
    double s = 0.0;
    for (int i = 0; i < used; i++)
        s += cx->dpart[i * 16];
    return s;
}

/* Sum of squares of x (n), in double. */
double cpu_sum_squares(be_backend *be, const float *x, size_t n) {
    return cpu_reduce(be, x, n, 1);
}

/* Sum of x (n), in double. */
double cpu_sum(be_backend *be, const float *x, size_t n) {
    return cpu_reduce(be, x, n, 0);
}

/* 1 if any x (n) is NaN or Inf (exponent bits all ones). */
int cpu_has_nonfinite(be_backend *be, const float *x, size_t n) {
    uint32_t bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], sizeof b);
        bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
    }
    return bad != 0;
}
