/* cpu_norm.c - LayerNorm forward and backward (eps 1e-5, biased variance,
 * like torch.nn.LayerNorm). */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

#define CPU_LN_EPS 1e-5f

/* out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N).  Parallel over
 * rows; two passes over each row (mean, then variance + output). */
void cpu_layernorm_fwd(be_backend *be, void *out, float *mean, float *rstd, const void *inp,
                       const void *w, const void *b, int N, int C) {
    const float *x = inp, *wt = w, *bs = b;
    float *o = out;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (int r = 0; r < N; r++) {
        const float *restrict xr = x + (size_t)r * C;
        float *restrict yr = o + (size_t)r * C;
        float m = cpu_sum_f(xr, C) / (float)C;
        float acc[16] = {0};
        int i = 0;
        for (; i + 16 <= C; i += 16)
            for (int j = 0; j < 16; j++) {
                float d = xr[i + j] - m;
                acc[j] += d * d;
            }
        float var = 0.0f;
        for (int j = 0; j < 16; j++)
            var += acc[j];
        for (; i < C; i++)
            var += (xr[i] - m) * (xr[i] - m);
        /* a variance past fp32 (activations above ~1e19) gave 1/sqrt(inf) = 0: the row
         * collapsed to the bias, finite, and a broken model's loss looked plausible; NaN
         * makes it the non-finite value it is (a non-finite row is NaN already) */
        float s = isinf(var) ? NAN : 1.0f / sqrtf(var / (float)C + CPU_LN_EPS);
        for (int c = 0; c < C; c++)
            yr[c] = (xr[c] - m) * s * wt[c] + bs[c];
        mean[r] = m;
        rstd[r] = s;
    }
}

/* One row of the backward: adds into dx and into the thread's partials
 * pdw/pdb.  dy, x, w, dx, pdw, pdb (C); m, s the row's mean and rstd. */
static void cpu_ln_bwd_row(float *restrict dx, float *restrict pdw, float *restrict pdb,
                           const float *restrict dy, const float *restrict x,
                           const float *restrict w, float m, float s, int C) {
    float a1[16] = {0}, a2[16] = {0};
    int i = 0;
    /* omp simd: the lanes are the vector.  Left to itself GCC 12 vectorised
     * the outer loop too, 16 blocks at a time through permutes: 3544
     * instructions, 2.2-2.5x slower for the same bits (docs/perf.md). */
    for (; i + 16 <= C; i += 16)
#pragma omp simd
        for (int j = 0; j < 16; j++) {
            float dn = dy[i + j] * w[i + j];
            a1[j] += dn;
            a2[j] += dn * (x[i + j] - m) * s;
        }
    float sdn = 0.0f, sdnx = 0.0f;
    for (int j = 0; j < 16; j++) {
        sdn += a1[j];
        sdnx += a2[j];
    }
    for (; i < C; i++) {
        float dn = dy[i] * w[i];
        sdn += dn;
        sdnx += dn * (x[i] - m) * s;
    }
    float mdn = sdn / (float)C, mdnx = sdnx / (float)C;
    for (int c = 0; c < C; c++) {
        float xh = (x[c] - m) * s;
        dx[c] += (dy[c] * w[c] - mdn - xh * mdnx) * s;
        pdw[c] += dy[c] * xh;
        pdb[c] += dy[c];
    }
}

/* dinp (N,C) +=, dw, db (C) += ; from dout (N,C), inp (N,C), w (C), mean,
 * rstd (N).  Rows are split in fixed slices per thread; each thread sums
 * dw/db of its rows into its own partials, combined in thread order. */
void cpu_layernorm_bwd(be_backend *be, void *dinp, float *dw, float *db, const void *dout,
                       const void *inp, const void *w, const float *mean, const float *rstd, int N,
                       int C) {
    cpu_ctx *cx = cpu_ctx_of(be);
    MS_CHECKF(C <= cx->part_C, "layernorm_bwd: C=%d exceeds reserved %d (call reserve)", C,
              cx->part_C);
    const float *dy = dout, *x = inp, *wt = w;
    float *dx = dinp;
#pragma omp parallel num_threads(cx->threads)
    {
        int tid = omp_get_thread_num(), nthr = omp_get_num_threads();
        float *pdw = cx->part + (size_t)tid * cx->part_stride, *pdb = pdw + C;
        memset(pdw, 0, 2 * (size_t)C * sizeof(float));
        size_t lo, hi;
        cpu_split((size_t)N, nthr, tid, &lo, &hi);
        for (size_t r = lo; r < hi; r++)
            cpu_ln_bwd_row(dx + r * C, pdw, pdb, dy + r * C, x + r * C, wt, mean[r], rstd[r], C);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int c = 0; c < C; c++) {
            float sw = 0.0f, sb = 0.0f;
            for (int t = 0; t < nthr; t++) {
                sw += cx->part[(size_t)t * cx->part_stride + c];
                sb += cx->part[(size_t)t * cx->part_stride + C + c];
            }
            dw[c] += sw;
            db[c] += sb;
        }
    }
}
