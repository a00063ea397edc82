/* cu_cast.cu - the act (bf16) copy of fp32 master weights: dst = bf16(src),
 * round to nearest even, one grid-stride pass (about 6 bytes per weight). */
#include "cu_internal.h"

__global__ void cast_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = f2bf(src[i]);
}

void cu_to_act(be_backend *be, void *dst, const float *src, size_t n) {
    cu_ctx *c = cu_of(be);
    if (!n) return;
    size_t blocks = cu_div_up(n, 256);
    size_t cap = (size_t)(c->sm_count > 0 ? c->sm_count : 1) * 8;
    MS_LAUNCH(cast_bf16_kernel, (unsigned)(blocks < cap ? blocks : cap), 256, 0, c->stream,
              (bf16 *)dst, src, n);
    CU_CHECK_LAUNCH();
}
