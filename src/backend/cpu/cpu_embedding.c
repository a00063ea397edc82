/* cpu_embedding.c - token + position embedding, forward and backward. */
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* out (B,T,C) = wte[tok[b,t]] + wpe[t];  tok (B,T), wte (Vp,C), wpe (Tmax,C).
 * Parallel over rows. */
void cpu_embedding_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                       const void *wpe, int B, int T, int C) {
    float *o = out;
    const float *te = wte, *pe = wpe;
    long rows = (long)B * T;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (long r = 0; r < rows; r++) {
        int32_t id = tok[r];
        MS_CHECKF(id >= 0, "embedding: negative token id %d at row %ld", (int)id, r);
        const float *restrict a = te + (size_t)id * C;
        const float *restrict p = pe + (size_t)(r % T) * C;
        float *restrict y = o + (size_t)r * C;
        for (int c = 0; c < C; c++)
            y[c] = a[c] + p[c];
    }
}

/* dwte (Vp,C) +=, dwpe (Tmax,C) += from dout (B,T,C).  Each thread owns a
 * slice of the channels and walks all tokens in order, so repeated tokens
 * accumulate in a fixed order with no partial buffers. */
void cpu_embedding_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                       const int32_t *tok, int B, int T, int C) {
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
            float *restrict te = dwte + (size_t)tok[r] * C;
            float *restrict pe = dwpe + (r % (size_t)T) * C;
            for (size_t c = c0; c < c1; c++) {
                te[c] += g[c];
                pe[c] += g[c];
            }
        }
    }
}
