/* cpu_optim.c - optimiser updates: AdamW (PyTorch's formulation) and the
 * two phases of LAMB.  Element-wise, parallel over fixed slices per thread;
 * LAMB's sums of squares are per-thread doubles combined in thread order.
 * Compiled with -fno-math-errno (CMakeLists.txt), so that sqrtf is the
 * correctly rounded vector instruction (as PyTorch's and CUDA's) and the
 * loops vectorise: an update is a few FLOPs per 28 bytes of memory, and
 * must run at the memory's speed.  (The bit-trick square root used before,
 * within 1 ulp, kept GCC from vectorising the AdamW loop: 27% of the copy
 * bandwidth.) */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"
#include "base/bf16.h"

/* Constants of one Adam step shared by AdamW and LAMB. */
typedef struct {
    float b1, b2, a1, a2; /* betas and 1 - betas */
    float ibc1, ibc2;     /* 1 / (1 - beta^t) */
    float eps, gscale;
} cpu_adam_k;

static cpu_adam_k cpu_adam_consts(float b1, float b2, float eps, int t, float gscale) {
    MS_CHECKF(t >= 1, "adam: step t must be >= 1, got %d", t);
    cpu_adam_k k = {b1, b2, 1.0f - b1, 1.0f - b2, 0.0f, 0.0f, eps, gscale};
    k.ibc1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    k.ibc2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
    return k;
}

/* Writes the new moments and returns mhat / (sqrt(vhat) + eps). */
static inline float cpu_adam_dir(const cpu_adam_k *k, float g, float *m, float *v) {
    float gs = g * k->gscale;
    float mi = k->b1 * *m + k->a1 * gs;
    float vi = k->b2 * *v + k->a2 * gs * gs;
    *m = mi;
    *v = vi;
    return (mi * k->ibc1) / (sqrtf(vi * k->ibc2) + k->eps);
}

/* Floats ahead of each of an update's streams that a line is asked for
 * (1 KB): the hardware's prefetchers alone kept too few lines in flight on
 * a Xeon with AMX (AdamW over d12's tensors at 50 GB/s, with the lines
 * asked for ahead 55: docs/perf.md, "Lines asked for ahead"). */
#define CPU_OPT_AHEAD 256

/* Ask for the lines CPU_OPT_AHEAD floats past w, g, m and v + i (by address: a prefetch
 * past an array's end is harmless, it never faults). */
static inline void cpu_opt_ahead(const float *w, const float *g, const float *m, const float *v,
                                 size_t i) {
    size_t d = (i + CPU_OPT_AHEAD) * sizeof(float);
    __builtin_prefetch((const void *)((uintptr_t)w + d), 1, 3);
    __builtin_prefetch((const void *)((uintptr_t)g + d), 1, 3);
    __builtin_prefetch((const void *)((uintptr_t)m + d), 1, 3);
    __builtin_prefetch((const void *)((uintptr_t)v + d), 1, 3);
}

/* AdamW on elements [lo, hi) of w, g, m, v, in blocks of 16 (a line of each, asked for
 * ahead); the act copy, if any, receives w: wa as floats, or wh rounded to bf16 (the bf16
 * mode); g is left 0 (its line is in the cache: the store costs the write-back that a
 * separate memset of the gradients would cost, without the pass).  Each element's
 * operations are the same whatever the blocks: the same bits. */
static void cpu_adamw_range(const cpu_adam_k *kp, float *restrict w, float *restrict wa,
                            uint16_t *restrict wh, float *restrict g, float *restrict m,
                            float *restrict v, size_t lo, size_t hi, float lr, float decay) {
    cpu_adam_k k = *kp;
    for (size_t i0 = lo; i0 < hi; i0 += 16) {
        size_t i1 = hi - i0 < 16 ? hi : i0 + 16;
        cpu_opt_ahead(w, g, m, v, i0);
        if (wa) {
            for (size_t i = i0; i < i1; i++) {
                float wi = w[i] * decay - lr * cpu_adam_dir(&k, g[i], &m[i], &v[i]);
                w[i] = wi;
                wa[i] = wi;
                g[i] = 0.0f;
            }
        } else if (wh) {
            for (size_t i = i0; i < i1; i++) {
                float wi = w[i] * decay - lr * cpu_adam_dir(&k, g[i], &m[i], &v[i]);
                w[i] = wi;
                wh[i] = ms_f32_to_bf16(wi);
                g[i] = 0.0f;
            }
        } else {
            for (size_t i = i0; i < i1; i++) {
                w[i] = w[i] * decay - lr * cpu_adam_dir(&k, g[i], &m[i], &v[i]);
                g[i] = 0.0f;
            }
        }
    }
}

/* w, g, m, v (n): m, v updated; w = w*(1 - lr*wd) - lr*mhat/(sqrt(vhat)+eps);
 * g = 0.  w_act (n, act dtype), if given and distinct from w, receives w. */
void cpu_adamw_step(be_backend *be, float *w, void *w_act, float *g, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, float wd, int t, float gscale) {
    cpu_adam_k k = cpu_adam_consts(b1, b2, eps, t, gscale);
    float decay = 1.0f - lr * wd;
    void *act = w_act != (void *)w ? w_act : NULL;
    float *wa = be->act_dtype == BE_F32 ? act : NULL;
    uint16_t *wh = be->act_dtype == BE_BF16 ? act : NULL;
#pragma omp parallel num_threads(cpu_ctx_of(be)->threads)
    {
        size_t lo, hi;
        cpu_split(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
        cpu_adamw_range(&k, w, wa, wh, g, m, v, lo, hi, lr, decay);
    }
}

/* LAMB phase 1 on elements [lo, hi): u into g; sums of w^2 and u^2 in
 * 8 fixed double lanes (lane j: elements lo + j, lo + 8 + j, ... in turn)
 * into sq[0], sq[1].  Blocks of 16 are read into locals, computed at the
 * full vector width and stored from the locals.  Written as one loop of 8
 * through pointers (cpu_adam_dir's m and v), the pass made GCC test the
 * four arrays for overlap on every block (restrict is lost when the helper
 * is inlined) and run the floats at half width: 0.6 of AdamW's speed with
 * the operands in cache, now AdamW's.  The same operations in the same
 * order as that loop: the same bits. */
static void cpu_lamb_range(const cpu_adam_k *kp, float *restrict g, const float *restrict w,
                           float *restrict m, float *restrict v, size_t lo, size_t hi, float wd,
                           double *sq) {
    cpu_adam_k k = *kp;
    double aw[8] = {0}, au[8] = {0}, sw = 0.0, su = 0.0;
    size_t i = lo;
    for (; i + 16 <= hi; i += 16) { /* lane j: element i + j, then i + 8 + j */
        float gb[16], wb[16], mb[16], vb[16];
        cpu_opt_ahead(w, g, m, v, i);
        for (int j = 0; j < 16; j++) {
            gb[j] = g[i + j];
            wb[j] = w[i + j];
            mb[j] = m[i + j];
            vb[j] = v[i + j];
        }
        for (int j = 0; j < 16; j++)
            gb[j] = cpu_adam_dir(&k, gb[j], &mb[j], &vb[j]) + wd * wb[j];
        for (int h = 0; h < 16; h += 8)
            for (int j = 0; j < 8; j++) {
                aw[j] += (double)wb[h + j] * wb[h + j];
                au[j] += (double)gb[h + j] * gb[h + j];
            }
        for (int j = 0; j < 16; j++) {
            g[i + j] = gb[j];
            m[i + j] = mb[j];
            v[i + j] = vb[j];
        }
    }
    for (; i + 8 <= hi; i += 8)
        for (int j = 0; j < 8; j++) {
            float u = cpu_adam_dir(&k, g[i + j], &m[i + j], &v[i + j]) + wd * w[i + j];
            g[i + j] = u;
            aw[j] += (double)w[i + j] * w[i + j];
            au[j] += (double)u * u;
        }
    for (int j = 0; j < 8; j++)
        sw += aw[j], su += au[j];
    for (; i < hi; i++) {
        float u = cpu_adam_dir(&k, g[i], &m[i], &v[i]) + wd * w[i];
        g[i] = u;
        sw += (double)w[i] * w[i];
        su += (double)u * u;
    }
    sq[0] = sw;
    sq[1] = su;
}

/* LAMB phase 1: m, v (n) updated; g_to_u (n) = mhat/(sqrt(vhat)+eps) + wd*w
 * in place of the gradient; *w_sq = sum w^2, *u_sq = sum u^2 (doubles,
 * per-thread slices combined in thread order). */
void cpu_lamb_moments(be_backend *be, float *g_to_u, const float *w, float *m, float *v, size_t n,
                      float b1, float b2, float eps, float wd, int t, float gscale, double *w_sq,
                      double *u_sq) {
    cpu_ctx *cx = cpu_ctx_of(be);
    cpu_adam_k k = cpu_adam_consts(b1, b2, eps, t, gscale);
    int used = 1;
#pragma omp parallel num_threads(cx->threads)
    {
        int tid = omp_get_thread_num(), nthr = omp_get_num_threads();
        if (tid == 0) used = nthr;
        size_t lo, hi;
        cpu_split(n, nthr, tid, &lo, &hi);
        cpu_lamb_range(&k, g_to_u, w, m, v, lo, hi, wd, cx->dpart + tid * 16);
    }
    double sw = 0.0, su = 0.0;
    for (int i = 0; i < used; i++) {
        sw += cx->dpart[i * 16];
        su += cx->dpart[i * 16 + 1];
    }
    *w_sq = sw;
    *u_sq = su;
}

/* LAMB phase 2: w (n) -= step * u (n), u = 0; w_act as in adamw_step. */
void cpu_lamb_apply(be_backend *be, float *w, void *w_act, float *u, size_t n, float step) {
    void *act = w_act != (void *)w ? w_act : NULL;
    float *wa = be->act_dtype == BE_F32 ? act : NULL;
    uint16_t *wh = be->act_dtype == BE_BF16 ? act : NULL;
    /* (lines asked for ahead, as AdamW's, made this pass 8% slower on the AMX Xeon) */
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++) {
        float wi = w[i] - step * u[i];
        w[i] = wi;
        u[i] = 0.0f;
        if (wa) wa[i] = wi;
        if (wh) wh[i] = ms_f32_to_bf16(wi);
    }
}
