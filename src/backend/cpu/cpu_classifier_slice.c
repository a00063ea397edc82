/* cpu_classifier_slice.c - the vocabulary-parallel classifier: the fused
 * tied classifier + softmax cross-entropy of cpu_classifier.c split into two
 * phases over one slice of the vocabulary, so that tensor-parallel ranks can
 * exchange per-row statistics (max, sum of exponentials, target logit)
 * between them and never gather full-vocabulary logits.
 *
 * Phase 1 (stats):  logits (R,Vs) = x @ wte^T (sgemm), per-row statistics.
 * Phase 2 (finish): per row the global log-sum-exp from the statistics of
 *   all slices (in slice order: deterministic, identical on every slice),
 *   the loss, and optionally dlogits in place, dx = dlogits @ wte (sgemm, =)
 *   and dwte += dlogits^T @ x (sgemm).
 * The logits buffer belongs to the caller and carries one chunk of rows
 * from phase 1 to phase 2.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* Sum of exp(l[j] - m), j < n, in double with 8 fixed lanes. */
static double sum_exp(const float *restrict l, int n, float m) {
    double acc[8] = {0}, sum = 0.0;
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += (double)cpu_expf(l[j + k] - m);
    for (int k = 0; k < 8; k++)
        sum += acc[k];
    for (; j < n; j++)
        sum += (double)cpu_expf(l[j] - m);
    return sum;
}

/* stats (R,3) =, logits (R,Vs) = from x (R,C), wte (Vs,C); targets (R). */
void cpu_classifier_slice_stats(be_backend *be, float *stats, void *logits, const void *x,
                                const void *wte, const int32_t *targets, int R, int C, int Vs,
                                int v0) {
    cpu_ctx *cx = cpu_ctx_of(be);
    MS_CHECKF(R >= 0 && Vs >= 0 && v0 >= 0, "classifier slice: bad R=%d Vs=%d v0=%d", R, Vs, v0);
    float *L = logits;
    if (Vs > 0 && R > 0) {
        cpu_sgemm(cx, 0, 1, R, Vs, C, 1.0f, x, C, wte, C, 0.0f, L, Vs);
    }
#pragma omp parallel for schedule(static) num_threads(cx->threads)
    for (int i = 0; i < R; i++) {
        float *st = stats + (size_t)i * 3;
        const float *l = L + (size_t)i * Vs;
        int tg = targets[i] - v0;
        MS_CHECKF(targets[i] >= 0, "classifier slice: negative target %d at row %d", targets[i], i);
        if (Vs == 0) {
            st[0] = -FLT_MAX, st[1] = 0.0f, st[2] = 0.0f;
            continue;
        }
        float m = cpu_max_f(l, Vs);
        st[0] = m;
        st[1] = (float)sum_exp(l, Vs, m);
        st[2] = tg >= 0 && tg < Vs ? l[tg] : 0.0f;
    }
}

double cpu_cls_row_sum_exp(const float *stats, int P, int R, int i, float *mx) {
    float M = -FLT_MAX;
    for (int p = 0; p < P; p++) {
        float m = stats[((size_t)p * R + i) * 3];
        M = m > M ? m : M;
    }
    double S = 0.0;
    int nan = 0; /* a slice's NaN logit: its sum is NaN, and so is the row's (it was skipped as
                  * an empty slice, and the loss was the other slices', finite) */
    for (int p = 0; p < P; p++) {
        const float *st = stats + ((size_t)p * R + i) * 3;
        nan |= isnan(st[1]);
        if (st[1] > 0.0f) S += (double)st[1] * exp((double)st[0] - (double)M);
    }
    *mx = M;
    return nan ? NAN : S;
}

float cpu_cls_slice_loss(const float *stats, int P, int R, int i, float M, double S) {
    double lse = (double)M + log(S), lt = 0.0;
    for (int p = 0; p < P; p++)
        lt += (double)stats[((size_t)p * R + i) * 3 + 2];
    return (float)(lse - lt);
}

/* losses (R) =; if dx: logits (R,Vs) -> dlogits, dx (R,C) =, dwte (Vs,C) +=. */
void cpu_classifier_slice_finish(be_backend *be, float *losses, void *dx, float *dwte, void *logits,
                                 const void *x, const void *wte, const int32_t *targets,
                                 const float *stats, int P, int R, int C, int Vs, int v0,
                                 float dloss) {
    cpu_ctx *cx = cpu_ctx_of(be);
    MS_CHECKF(P >= 1 && R >= 0 && Vs >= 0, "classifier slice: bad P=%d R=%d Vs=%d", P, R, Vs);
    float *L = logits;
    int grad = dx != NULL;
#pragma omp parallel for schedule(static) num_threads(cx->threads)
    for (int i = 0; i < R; i++) {
        float M;
        double S = cpu_cls_row_sum_exp(stats, P, R, i, &M);
        losses[i] = cpu_cls_slice_loss(stats, P, R, i, M, S);
        if (!grad || Vs == 0) continue;
        float *restrict l = L + (size_t)i * Vs; /* softmax = exp(l - M) / S */
        float s = (float)((double)dloss / S);
        for (int j = 0; j < Vs; j++)
            l[j] = cpu_expf(l[j] - M) * s;
        int tg = targets[i] - v0;
        if (tg >= 0 && tg < Vs) l[tg] -= dloss;
    }
    if (!grad) return;
    if (Vs == 0 || R == 0) {
        memset(dx, 0, (size_t)R * C * sizeof(float));
        return;
    }
    cpu_sgemm(cx, 0, 0, R, C, Vs, 1.0f, L, Vs, wte, C, 0.0f, dx, C);
    cpu_sgemm(cx, 1, 0, Vs, C, R, 1.0f, L, Vs, x, C, 1.0f, dwte, C);
}
