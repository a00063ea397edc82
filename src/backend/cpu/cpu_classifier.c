/* cpu_classifier.c - fused tied classifier + softmax cross-entropy (+ its
 * gradient), a bounded chunk of rows at a time.
 *
 * Per chunk of R rows (R*V floats of scratch, sized by reserve):
 *   logits = x_chunk @ wte[0:V]^T                       (sgemm)
 *   per row: max, exp in place, sum, loss = lse - logit[target]
 *   if dx: logits -> dlogits = dloss * (softmax - onehot) in place,
 *          dx_chunk = dlogits @ wte[0:V]               (sgemm, =)
 *          dwte[0:V] += dlogits^T @ x_chunk            (sgemm, +=)
 * Padded rows V..Vp-1 of wte / dwte are never read or written.  The GEMM
 * flops are exactly those of the unfused forward + backward.
 */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* One row of logits l (V) in place: returns the loss; if grad, l becomes
 * dloss * (softmax(l) - onehot(tgt)), else l holds exp(l - max).  next
 * (V floats, or NULL) is the row the caller does next: asked into L2 a
 * line per 16 exponentials, so that its first pass (the maximum) does not
 * wait on memory (the rows of a chunk of logits, 200 KB each at GPT-2's
 * vocabulary, come from memory: 0.46 -> 0.35 ns an element on the Emerald
 * Rapids Xeon, docs/perf.md).  The same bits either way. */
float cpu_cls_row(float *restrict l, int V, int tgt, int grad, float dloss, const float *next) {
    float m = cpu_max_f(l, V), lt = l[tgt];
    int i = 0;
    for (; i + 16 <= V; i += 16) {
        if (next) __builtin_prefetch(next + i, 0, 2);
#pragma omp simd
        for (int k = 0; k < 16; k++)
            l[i + k] = cpu_expf(l[i + k] - m);
    }
    for (; i < V; i++)
        l[i] = cpu_expf(l[i] - m);
    double acc[8] = {0}, sum = 0.0;
    int j = 0;
    for (; j + 8 <= V; j += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += (double)l[j + k];
    for (int k = 0; k < 8; k++)
        sum += acc[k];
    for (; j < V; j++)
        sum += (double)l[j];
    if (grad) {
        float s = (float)((double)dloss / sum);
        for (int i = 0; i < V; i++)
            l[i] *= s;
        l[tgt] -= dloss;
    }
    return (float)((double)m + log(sum) - (double)lt);
}

size_t cpu_cls_rows(const cpu_ctx *cx, int N, int V) {
    MS_CHECKF(V > 0, "classifier: V=%d must be positive", V);
    size_t R = cx->cls_floats / (size_t)V;
    if (cx->cls_max_rows > 0 && R > (size_t)cx->cls_max_rows) R = (size_t)cx->cls_max_rows;
    MS_CHECKF(R >= 1, "classifier: no logits scratch for V=%d (call reserve)", V);
    if (N > 0) { /* equal chunks: a short last chunk runs the GEMMs slowly */
        size_t nchunks = ((size_t)N + R - 1) / R;
        R = ((size_t)N + nchunks - 1) / nchunks;
    }
    return R;
}

/* losses (N) =; if dx: dx (N,C) =, dwte (Vp,C) += (rows < V only).
 * x (N,C), wte (Vp,C), targets (N) in [0,V). */
void cpu_classifier_fwd_bwd(be_backend *be, float *losses, void *dx, float *dwte, const void *x,
                            const void *wte, const int32_t *targets, int N, int C, int V, int Vp,
                            float dloss) {
    cpu_ctx *cx = cpu_ctx_of(be);
    MS_CHECKF(V > 0 && V <= Vp, "classifier: V=%d must be in [1, Vp=%d]", V, Vp);
    size_t R = cpu_cls_rows(cx, N, V);
    const float *xs = x, *w = wte;
    float *dxs = dx, *L = cx->cls;
    int grad = dx != NULL;
    for (int r0 = 0; r0 < N; r0 += (int)R) {
        int rb = N - r0 < (int)R ? N - r0 : (int)R;
        const float *xc = xs + (size_t)r0 * C;
        cpu_sgemm(cx, 0, 1, rb, V, C, 1.0f, xc, C, w, C, 0.0f, L, V);
#pragma omp parallel for schedule(static) num_threads(cx->threads)
        for (int i = 0; i < rb; i++) {
            int tgt = targets[r0 + i];
            MS_CHECKF(tgt >= 0 && tgt < V, "classifier: target %d at row %d outside [0,%d)", tgt,
                      r0 + i, V);
            losses[r0 + i] = cpu_cls_row(L + (size_t)i * V, V, tgt, grad, dloss,
                                         i + 1 < rb ? L + (size_t)(i + 1) * V : NULL);
        }
        if (!grad) continue;
        cpu_sgemm(cx, 0, 0, rb, C, V, 1.0f, L, V, w, C, 0.0f, dxs + (size_t)r0 * C, C);
        cpu_sgemm(cx, 1, 0, V, C, rb, 1.0f, L, V, xc, C, 1.0f, dwte, C);
    }
}
