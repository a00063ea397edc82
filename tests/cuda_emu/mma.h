/* mma.h (cuda-emu) - nvcuda::wmma for bf16 m16n16k16 with float
 * accumulators.  Every thread holds the WHOLE 16x16 tile (x[256],
 * row-major inside the fragment); the 32 lanes of a warp do the same work
 * redundantly and store identical values.  This is why the dialect lets
 * kernels touch x[] only with operations that treat every element alike.
 * Each load / store / mma is a warp sync point (before, and for loads and
 * stores after the memory access too), like the warp-collective originals.
 * The real preconditions are checked (the kernel aborts with a message):
 * the pointer 32-byte aligned, ldm a multiple of 16 bytes.
 */
#ifndef MSEMU_MMA_H
#define MSEMU_MMA_H

#include <stdint.h>

#include "cuda_bf16.h"
#include "cuda_emu.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "msemu: only m16n16k16 wmma fragments");
    static_assert(std::is_same<Use, accumulator>::value
                      ? std::is_same<T, float>::value && std::is_same<Layout, void>::value
                      : std::is_same<T, __nv_bfloat16>::value &&
                            (std::is_same<Layout, row_major>::value ||
                             std::is_same<Layout, col_major>::value),
                  "msemu: wmma fragments are bf16 matrix_a/b with a layout, or float accumulator");
    typedef T element_type;
    enum { num_elements = 256 };
    T x[256];
};

namespace detail {
template <class T> static inline void check_ptr(const T *p, unsigned ldm, const char *what) {
    if ((uintptr_t)p % 32)
        msemu::kernel_fault("wmma::%s: pointer %p is not 32-byte aligned", what, (const void *)p);
    if ((ldm * sizeof(T)) % 16)
        msemu::kernel_fault("wmma::%s: ldm %u is not a multiple of 16 bytes", what, ldm);
}
/* Element (r,c) of a row- or col-major matrix with leading dimension ldm. */
static inline size_t at(int r, int c, unsigned ldm, bool col) {
    return col ? (size_t)r + (size_t)c * ldm : (size_t)r * ldm + (size_t)c;
}
} // namespace detail

template <class Use, int M, int N, int K, class T, class L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f,
                                 const typename fragment<Use, M, N, K, T, L>::element_type &v) {
    for (int i = 0; i < 256; i++)
        f.x[i] = v;
}

template <class Use, class L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f,
                                    const __nv_bfloat16 *p, unsigned ldm) {
    detail::check_ptr(p, ldm, "load_matrix_sync");
    msemu::warp_sync(0xffffffffu, "wmma::load_matrix_sync");
    bool col = std::is_same<L, col_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = p[detail::at(r, c, ldm, col)];
    msemu::warp_sync(0xffffffffu, "wmma::load_matrix_sync");
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ldm, layout_t layout) {
    detail::check_ptr(p, ldm, "load_matrix_sync");
    msemu::warp_sync(0xffffffffu, "wmma::load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = p[detail::at(r, c, ldm, layout == mem_col_major)];
    msemu::warp_sync(0xffffffffu, "wmma::load_matrix_sync");
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t layout) {
    detail::check_ptr(p, ldm, "store_matrix_sync");
    msemu::warp_sync(0xffffffffu, "wmma::store_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            p[detail::at(r, c, ldm, layout == mem_col_major)] = f.x[r * 16 + c];
    msemu::warp_sync(0xffffffffu, "wmma::store_matrix_sync");
}

/* d = a b + c in fp32 (d may be c). */
template <class LA, class LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    msemu::warp_sync(0xffffffffu, "wmma::mma_sync");
    float out[256];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.x[i * 16 + j];
            for (int k = 0; k < 16; k++)
                s += __bfloat162float(a.x[i * 16 + k]) * __bfloat162float(b.x[k * 16 + j]);
            out[i * 16 + j] = s;
        }
    for (int i = 0; i < 256; i++)
        d.x[i] = out[i];
}

} // namespace wmma
} // namespace nvcuda

#endif
