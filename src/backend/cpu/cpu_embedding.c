/* cpu_embedding.c - token + position embedding, forward and backward, over
 * the whole vocabulary or over one slice of it (vocabulary parallelism). */
#include <limits.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* out (B,T,C) = (v0 <= tok < v0+Vs ? wte[tok-v0] : 0) [+ wpe[t]]; tok (B,T),
 * wte (Vs,C), wpe (Tmax,C) or NULL.  Parallel over rows. */
static void emb_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte, const void *wpe,
                    int B, int T, int C, int v0, int Vs) {
    float *o = out;
    const float *te = wte, *pe = wpe;
    long rows = (long)B * T;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (long r = 0; r < rows; r++) {
        int32_t id = tok[r];
        MS_CHECKF(id >= 0, "embedding: negative token id %d at row %ld", (int)id, r);
        float *restrict y = o + (size_t)r * C;
        int in = id - v0 >= 0 && id - v0 < Vs;
        const float *restrict a = te + (size_t)(in ? id - v0 : 0) * C;
        const float *restrict p = pe ? pe + (size_t)(r % T) * C : NULL;
        if (in && p)
            for (int c = 0; c < C; c++)
                y[c] = a[c] + p[c];
        else if (in)
            for (int c = 0; c < C; c++)
                y[c] = a[c];
        else
            for (int c = 0; c < C; c++)
                y[c] = p ? p[c] : 0.0f;
    }
}

/* dwte (Vs,C) += rows of dout whose token is in [v0, v0+Vs); dwpe (Tmax,C)
 * += dout when not NULL.  Each thread owns a slice of the channels and walks
 * all tokens in order, so repeated tokens accumulate in a fixed order with
 * no partial buffers. */
static void emb_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout, const int32_t *tok,
                    int B, int T, int C, int v0, int Vs) {
    const float *d = dout;
    size_t rows = (size_t)B * T;
    size_t lines = ((size_t)C + CPU_LINE_FLOATS - 1) / CPU_LINE_FLOATS;
#pragma omp parallel num_threads(cpu_ctx_of(be)->threads)
    {
        size_t lo, hi;
        cpu_split(lines, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
        size_t c0 = lo * CPU_LINE_FLOATS, c1 = hi * CPU_LINE_FLOATS;
        if (c1 > (size_t)C) c1 = (size_t)C;
        for (size_t r = 0; r < rows && c0 < c1; r++) {
            const float *restrict g = d + r * C;
            int id = tok[r] - v0;
            if (id >= 0 && id < Vs) {
                float *restrict te = dwte + (size_t)id * C;
                for (size_t c = c0; c < c1; c++)
                    te[c] += g[c];
            }
            if (dwpe) {
                float *restrict pe = dwpe + (r % (size_t)T) * C;
                for (size_t c = c0; c < c1; c++)
                    pe[c] += g[c];
            }
        }
    }
}

void cpu_embedding_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                       const void *wpe, int B, int T, int C) {
    emb_fwd(be, out, tok, wte, wpe, B, T, C, 0, INT_MAX);
}

void cpu_embedding_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                       const int32_t *tok, int B, int T, int C) {
    emb_bwd(be, dwte, dwpe, dout, tok, B, T, C, 0, INT_MAX);
}

void cpu_embedding_slice_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                             const void *wpe, int B, int T, int C, int v0, int Vs) {
    MS_CHECKF(v0 >= 0 && Vs >= 0, "embedding slice: bad slice v0=%d Vs=%d", v0, Vs);
    emb_fwd(be, out, tok, wte, wpe, B, T, C, v0, Vs);
}

void cpu_embedding_slice_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                             const int32_t *tok, int B, int T, int C, int v0, int Vs) {
    MS_CHECKF(v0 >= 0 && Vs >= 0, "embedding slice: bad slice v0=%d Vs=%d", v0, Vs);
    emb_bwd(be, dwte, dwpe, dout, tok, B, T, C, v0, Vs);
}
