/* cpu_elementwise.c - GeLU forward/backward, the residual add, the bias add
 * and the f32 add, parallel over elements (memory-bound, vectorised). */
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* out (n) = gelu_tanh(inp) (n). */
void cpu_gelu_fwd(be_backend *be, void *out, const void *inp, size_t n) {
    float *restrict y = out;
    const float *restrict x = inp;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++)
        y[i] = cpu_gelu(x[i]);
}

/* dinp (n) = gelu'(inp) * dout; dinp may alias dout. */
void cpu_gelu_bwd(be_backend *be, void *dinp, const void *inp, const void *dout, size_t n) {
    float *dx = dinp;
    const float *x = inp, *dy = dout;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++)
        dx[i] = cpu_gelu_grad(x[i]) * dy[i];
}

/* out (n) = a + b; out may alias a or b. */
void cpu_residual_add(be_backend *be, void *out, const void *a, const void *b, size_t n) {
    float *y = out;
    const float *p = a, *q = b;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++)
        y[i] = p[i] + q[i];
}

/* out (M,N) += bias (N), broadcast over the rows. */
void cpu_bias_add(be_backend *be, void *out, const void *bias, int M, int N) {
    float *y = out;
    const float *b = bias;
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (long r = 0; r < (long)M; r++) {
        float *restrict yr = y + (size_t)r * N;
        for (int c = 0; c < N; c++)
            yr[c] += b[c];
    }
}

/* y (n) += x (n), f32. */
void cpu_add_f32(be_backend *be, float *y, const float *x, size_t n) {
#pragma omp parallel for schedule(static) num_threads(cpu_ctx_of(be)->threads)
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}
