/* cpu_reduce.c - host-returning reductions over fp32 vectors: sum, sum of
 * squares (in double) and the non-finite test.  Each thread reduces a fixed
 * slice, as CPU_SUM_PARTS parts read side by side with 8 fixed lanes each;
 * parts and slices are combined in a fixed order, so the result depends
 * only on the data and the thread count. */
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* Parts of a thread's slice summed side by side.  One sequential stream a
 * core reads memory slower than several: on the Emerald Rapids Xeon the
 * sum of squares of the 124M model's gradients took 24-29 ms a step with
 * one (20 GB/s on 2 cores, where a float read of the same memory runs at
 * 30 GB/s) and 18.6-19.2 ms with four (docs/perf.md). */
#define CPU_SUM_PARTS 4

/* Floats ahead of each part that a line is asked for (2 KB).  The four
 * streams alone kept too few lines in flight on a Xeon with AMX: d12's
 * gradients, tensor by tensor, read at 15 GB/s, and at 31 GB/s with the
 * lines asked for ahead (docs/perf.md, "Lines asked for ahead").  A
 * prefetch past the end of x is harmless: it never faults. */
#define CPU_SUM_AHEAD 512

/* Ask for the line CPU_SUM_AHEAD floats past p (by address: p may be near its array's end). */
static inline void cpu_sum_ahead(const float *p) {
    __builtin_prefetch((const void *)((uintptr_t)p + CPU_SUM_AHEAD * sizeof(float)), 0, 3);
}

/* acc[j] += x[j] (x[j]^2 if sq), j < 8: one part's lanes (vectorises). */
static inline void cpu_sum_lanes(double *restrict acc, const float *restrict x, int sq) {
    for (int j = 0; j < 8; j++)
        acc[j] += sq ? (double)x[j] * (double)x[j] : (double)x[j];
}

/* Sum of x[lo..hi) (squares if sq) in double: CPU_SUM_PARTS parts of q
 * elements (a multiple of 8) in 8 lanes each, then the tail in order. */
static double cpu_sum_slice(const float *restrict x, size_t lo, size_t hi, int sq) {
    size_t q = (hi - lo) / CPU_SUM_PARTS / 8 * 8;
    double a0[8] = {0}, a1[8] = {0}, a2[8] = {0}, a3[8] = {0}, s = 0.0;
    const float *p0 = x + lo, *p1 = p0 + q, *p2 = p1 + q, *p3 = p2 + q;
    _Static_assert(CPU_SUM_PARTS == 4, "cpu_sum_slice reads four parts");
    if (sq) {
        for (size_t i = 0; i < q; i += 8) {
            if (!(i & 15)) { /* a line a part, every second block */
                cpu_sum_ahead(p0 + i);
                cpu_sum_ahead(p1 + i);
                cpu_sum_ahead(p2 + i);
                cpu_sum_ahead(p3 + i);
            }
            cpu_sum_lanes(a0, p0 + i, 1);
            cpu_sum_lanes(a1, p1 + i, 1);
            cpu_sum_lanes(a2, p2 + i, 1);
            cpu_sum_lanes(a3, p3 + i, 1);
        }
    } else {
        for (size_t i = 0; i < q; i += 8) {
            if (!(i & 15)) {
                cpu_sum_ahead(p0 + i);
                cpu_sum_ahead(p1 + i);
                cpu_sum_ahead(p2 + i);
                cpu_sum_ahead(p3 + i);
            }
            cpu_sum_lanes(a0, p0 + i, 0);
            cpu_sum_lanes(a1, p1 + i, 0);
            cpu_sum_lanes(a2, p2 + i, 0);
            cpu_sum_lanes(a3, p3 + i, 0);
        }
    }
    for (int j = 0; j < 8; j++)
        s += a0[j];
    for (int j = 0; j < 8; j++)
        s += a1[j];
    for (int j = 0; j < 8; j++)
        s += a2[j];
    for (int j = 0; j < 8; j++)
        s += a3[j];
    for (size_t i = lo + CPU_SUM_PARTS * q; i < hi; i++)
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
