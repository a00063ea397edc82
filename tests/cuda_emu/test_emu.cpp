/* test_emu.cpp - self-tests of the CUDA emulator: kernels in the dialect of
 * cu_common.cuh launched with MS_LAUNCH, the runtime, wmma, cuBLASLt and
 * cub, each against plain host loops on fresh random inputs.  Kernels that
 * must abort (divergent barriers, bad shuffles) run in a forked child whose
 * stderr is checked for the message.  Lines starting "msemu" on stderr
 * come from the error paths under test. */
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "backend/cuda/cu_common.cuh"
#include <cub/cub.cuh>
#include <cublasLt.h>

#include "../check.h"

void cu_fatal(const char *file, int line, const char *what, const char *msg) {
    fprintf(stderr, "%s:%d: CUDA call failed: %s: %s\n", file, line, what, msg);
    abort();
}

namespace {

/* MS_LAUNCH as it could be: naming the kernel (see msemu::launch). */
#define NAMED_LAUNCH(kernel, grid, block, smem, stream, ...)                                       \
    msemu::launch(#kernel, kernel, dim3(grid), dim3(block), (size_t)(smem), (stream),              \
                  [=]() { kernel(__VA_ARGS__); })

const unsigned FULL = 0xffffffffu;
uint64_t rng_state = 0x1234abcdull;

float frand() { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

template <class T> T *dalloc(size_t n) {
    T *p = NULL;
    CU_CHECK(cudaMalloc(&p, n * sizeof(T)));
    return p;
}
template <class T> void up(T *d, const std::vector<T> &h) {
    CU_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <class T> std::vector<T> down(const T *d, size_t n) {
    std::vector<T> h(n);
    CU_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

/* One check per array: |got - ref| <= rtol |ref| + atol everywhere; prints
 * the first mismatches with both sides. */
void check_close(const char *what, const std::vector<double> &got, const std::vector<double> &ref,
                 double rtol, double atol) {
    int bad = 0;
    for (size_t i = 0; i < ref.size(); i++)
        if (!(fabs(got[i] - ref[i]) <= rtol * fabs(ref[i]) + atol) && bad++ < 3)
            fprintf(stderr, "  %s[%zu]: got %.9g, want %.9g\n", what, i, got[i], ref[i]);
    if (bad) fprintf(stderr, "  %s: %d of %zu elements off\n", what, bad, ref.size());
    T_OK(bad == 0 && got.size() == ref.size());
}

/* Runs fn in a child; passes if it dies by SIGABRT with `needle` on stderr. */
void expect_abort(void (*fn)(), const char *needle) {
    int p[2];
    if (pipe(p) != 0) abort();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit r = {0, 0};
        setrlimit(RLIMIT_CORE, &r);
        dup2(p[1], 2);
        close(p[0]);
        fn();
        _exit(0);
    }
    close(p[1]);
    std::string out;
    char buf[512];
    ssize_t k;
    while ((k = read(p[0], buf, sizeof buf)) > 0)
        out.append(buf, (size_t)k);
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    T_OK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    T_STR_CONTAINS(out.c_str(), needle);
}

/* ---- block reductions ---- */

/* Every thread writes the block's sum, max and (reusing buf) sum of 2x. */
__global__ void k_block_reduce(float *sum, float *mx, float *sum2, const float *x, int n) {
    __shared__ float buf[32];
    const float *row = x + (size_t)blockIdx.x * n;
    float s = 0.0f, m = -FLT_MAX;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        s += row[i];
        m = fmaxf(m, row[i]);
    }
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    sum[o] = cu_block_sum(s, buf);
    mx[o] = cu_block_max(m, buf);
    sum2[o] = cu_block_sum(2.0f * s, buf);
}

void test_block_reduce() {
    const int rows = 5, n = 1000;
    std::vector<float> hx((size_t)rows * n);
    for (auto &v : hx)
        v = frand();
    float *x = dalloc<float>(hx.size());
    up(x, hx);
    for (int bs : {32, 256, 1024}) {
        float *s = dalloc<float>((size_t)rows * bs), *m = dalloc<float>((size_t)rows * bs);
        float *s2 = dalloc<float>((size_t)rows * bs);
        MS_LAUNCH(k_block_reduce, rows, bs, 0, 0, s, m, s2, x, n);
        CU_CHECK_LAUNCH();
        std::vector<float> gs = down(s, (size_t)rows * bs), gm = down(m, (size_t)rows * bs),
                           gs2 = down(s2, (size_t)rows * bs);
        std::vector<double> got, ref;
        for (int r = 0; r < rows; r++) {
            double rs = 0.0, rm = -1e30;
            for (int i = 0; i < n; i++) {
                rs += hx[(size_t)r * n + i];
                rm = fmax(rm, hx[(size_t)r * n + i]);
            }
            for (int t = 0; t < bs; t++) {
                size_t o = (size_t)r * bs + t;
                got.insert(got.end(), {gs[o], gm[o], gs2[o]});
                ref.insert(ref.end(), {rs, rm, 2.0 * rs});
            }
        }
        check_close(bs == 32    ? "block_sum/max bs=32"
                    : bs == 256 ? "block_sum/max bs=256"
                                : "block_sum/max bs=1024",
                    got, ref, 1e-5, 1e-4);
        cudaFree(s);
        cudaFree(m);
        cudaFree(s2);
    }
    cudaFree(x);
}

/* ---- shuffles and votes ---- */

__global__ void k_shfl(int *xo, float *dn, unsigned *idx, int *upv, unsigned *bal) {
    int t = threadIdx.x, lane = t & 31;
    xo[t] = __shfl_xor_sync(FULL, t * 10, 5);
    dn[t] = __shfl_down_sync(FULL, (float)t + 0.5f, 3);
    idx[t] = __shfl_sync(FULL, (unsigned)t * 7u, 31 - lane);
    upv[t] = __shfl_up_sync(FULL, t, 2);
    bal[t] = __ballot_sync(FULL, lane % 3 == 0);
}

void test_shuffles() {
    const int n = 64;
    int *xo = dalloc<int>(n), *upv = dalloc<int>(n);
    float *dn = dalloc<float>(n);
    unsigned *idx = dalloc<unsigned>(n), *bal = dalloc<unsigned>(n);
    MS_LAUNCH(k_shfl, 1, n, 0, 0, xo, dn, idx, upv, bal);
    CU_CHECK_LAUNCH();
    std::vector<int> hx = down(xo, n), hu = down(upv, n);
    std::vector<float> hd = down(dn, n);
    std::vector<unsigned> hi = down(idx, n), hb = down(bal, n);
    unsigned want_bal = 0;
    for (int l = 0; l < 32; l += 3)
        want_bal |= 1u << l;
    int bad = 0;
    for (int t = 0; t < n; t++) {
        int lane = t & 31, w = t >> 5;
        bad += hx[t] != (w * 32 + (lane ^ 5)) * 10;
        bad += hd[t] != (lane + 3 < 32 ? (float)(t + 3) + 0.5f : (float)t + 0.5f);
        bad += hi[t] != (unsigned)(w * 32 + 31 - lane) * 7u;
        bad += hu[t] != (lane >= 2 ? t - 2 : t);
        bad += hb[t] != want_bal;
    }
    T_EQ_INT(bad, 0);
    cudaFree(xo);
    cudaFree(upv);
    cudaFree(dn);
    cudaFree(idx);
    cudaFree(bal);
}

/* __syncthreads_count/and/or, a shared int atomic, and the resume order. */
__global__ void k_votes(int *out, int *order) {
    __shared__ int counter, pos;
    if (threadIdx.x == 0) counter = pos = 0;
    __syncthreads();
    atomicAdd(&counter, 1);
    order[atomicAdd(&pos, 1)] = threadIdx.x;
    int c = __syncthreads_count(threadIdx.x % 3 == 0);
    int a = __syncthreads_and(threadIdx.x < 1000);
    int o = __syncthreads_or(threadIdx.x == 7);
    int none = __syncthreads_or(0);
    if (threadIdx.x == 0) {
        out[0] = c;
        out[1] = a;
        out[2] = o;
        out[3] = counter;
        out[4] = none;
    }
}

void test_votes() {
    int *out = dalloc<int>(5), *order = dalloc<int>(96);
    MS_LAUNCH(k_votes, 1, 96, 0, 0, out, order);
    CU_CHECK_LAUNCH();
    std::vector<int> h = down(out, 5), ho = down(order, 96);
    T_EQ_INT(h[0], 32);
    T_EQ_INT(h[1], 1);
    T_EQ_INT(h[2], 1);
    T_EQ_INT(h[3], 96);
    T_EQ_INT(h[4], 0);
    int identity = 1, sum = 0;
    for (int i = 0; i < 96; i++) {
        identity &= ho[i] == i;
        sum += ho[i];
    }
    T_OK(!identity);            /* fibers resume in a shuffled order */
    T_EQ_INT(sum, 95 * 96 / 2); /* ... each exactly once */
    cudaFree(out);
    cudaFree(order);
}

/* ---- races between warps: the schedule must expose them ---- */

/* Warp 0 writes s, warp 1 reads it (out (32)), ordered by only a __syncwarp
 * (how 0), only a shuffle (1) or __syncthreads (2): a race unless 2. */
__global__ void k_cross_warp(int *out, int base, int how) {
    __shared__ int s[32];
    int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) s[lane] = base + lane;
    if (how == 0) __syncwarp();
    if (how == 1) lane = __shfl_xor_sync(FULL, lane, 0);
    if (how == 2) __syncthreads();
    if (threadIdx.x >= 32) out[lane] = s[lane];
}

/* Layernorm backward's pattern: each round, every warp computes a value
 * with a shuffle and lane 0 publishes it, __syncthreads, every thread sums
 * all of them (out, one per thread).  Without the trailing barrier a warp
 * that runs ahead overwrites its value for round 1 while others still read
 * round 0's. */
__global__ void k_rounds(int *out, int base, int trailing) {
    __shared__ int s[32];
    int warp = threadIdx.x >> 5, nw = blockDim.x >> 5, tot = 0;
    for (int r = 0; r < 2; r++) {
        int v = __shfl_xor_sync(FULL, base + 100 * r + warp, 1);
        if ((threadIdx.x & 31) == 0) s[warp] = v;
        __syncthreads();
        for (int k = 0; k < nw; k++)
            tot += s[k];
        if (trailing) __syncthreads();
    }
    out[threadIdx.x] = tot;
}

/* Each racy kernel gives a wrong answer with some of 8 seeds and the right
 * one with others (the schedule depends on the seed); with the barrier it
 * is right with every seed. */
void test_races() {
    const int seeds = 8, nt = 256;
    int *out = dalloc<int>(nt);
    uint64_t saved = msemu::reseed(1);
    int wrong[5] = {0, 0, 0, 0, 0}; /* k_cross_warp how 0..2, k_rounds trailing 0..1 */
    for (int seed = 1; seed <= seeds; seed++)
        for (int v = 0; v < 5; v++) {
            int base = seed * 100000 + v * 1000, bad = 0;
            msemu::reseed((uint64_t)seed);
            if (v < 3) {
                MS_LAUNCH(k_cross_warp, 1, 64, 0, 0, out, base, v);
                CU_CHECK_LAUNCH();
                std::vector<int> h = down(out, 32);
                for (int l = 0; l < 32; l++)
                    bad += h[l] != base + l;
            } else {
                MS_LAUNCH(k_rounds, 1, nt, 0, 0, out, base, v - 3);
                CU_CHECK_LAUNCH();
                std::vector<int> h = down(out, nt);
                int nw = nt / 32, want = 2 * nw * base + 100 * nw + nw * (nw - 1);
                for (int t = 0; t < nt; t++)
                    bad += h[t] != want;
            }
            wrong[v] += bad != 0;
        }
    msemu::reseed(saved);
    printf("races: wrong with %d, %d of %d seeds (after __syncwarp, a shuffle), %d with "
           "__syncthreads; %d without the trailing barrier, %d with it\n",
           wrong[0], wrong[1], seeds, wrong[2], wrong[3], wrong[4]);
    T_OK(wrong[0] >= 1 && wrong[0] < seeds);
    T_OK(wrong[1] >= 1 && wrong[1] < seeds);
    T_EQ_INT(wrong[2], 0);
    T_OK(wrong[3] >= 1);
    T_EQ_INT(wrong[4], 0);
    cudaFree(out);
}

/* ---- 3-D indexing, dynamic shared memory ---- */

__global__ void k_index(int *hits) {
    int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    hits[b * (blockDim.x * blockDim.y * blockDim.z) + t] += 1 + (int)(threadIdx.z * 1000);
}

void test_index() {
    dim3 g(3, 2, 2), b(8, 4, 2);
    int n = 12 * 64;
    int *hits = dalloc<int>(n);
    CU_CHECK(cudaMemset(hits, 0, n * sizeof(int)));
    MS_LAUNCH(k_index, g, b, 0, 0, hits);
    CU_CHECK_LAUNCH();
    std::vector<int> h = down(hits, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != 1 + ((i % 64) / 32) * 1000;
    T_EQ_INT(bad, 0);
    cudaFree(hits);
}

/* out[b][i] = s[n-1-i] after every thread wrote s[i]; word n of the buffer
 * is never written, so it shows the fill pattern. */
__device__ void dyn_body(float *out, unsigned *pattern, int n) {
    MS_DYN_SMEM(float, s);
    if (threadIdx.x == 0) memcpy(&pattern[blockIdx.x], &s[n], sizeof(unsigned));
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s[i] = (float)(blockIdx.x * 1000 + i);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[blockIdx.x * n + i] = s[n - 1 - i];
}
__global__ void k_dyn(float *out, unsigned *pattern, int n) {
    dyn_body(out, pattern, n);
}

__global__ void k_dyn2(float *out, unsigned *pattern, int n) {
    dyn_body(out, pattern, n);
}

void test_dyn_smem() {
    const int n = 300, blocks = 3;
    float *out = dalloc<float>(blocks * n);
    unsigned *pat = dalloc<unsigned>(blocks);
    MS_LAUNCH(k_dyn, blocks, 128, (n + 1) * sizeof(float), 0, out, pat, n);
    CU_CHECK_LAUNCH();
    std::vector<float> h = down(out, blocks * n);
    std::vector<unsigned> hp = down(pat, blocks);
    int bad = 0;
    for (int b = 0; b < blocks; b++)
        for (int i = 0; i < n; i++)
            bad += h[b * n + i] != (float)(b * 1000 + n - 1 - i);
    T_EQ_INT(bad, 0);
    for (int b = 0; b < blocks; b++)
        T_EQ_INT(hp[b], 0xA5A5A5A5u);
    cudaFree(out);
    cudaFree(pat);
}

/* More than 48 KiB of dynamic shared memory needs the attribute first. */
void test_smem_optin() {
    unsigned *pat = dalloc<unsigned>(1);
    int big = 64 * 1024 / 4 - 1;
    float *out2 = dalloc<float>(big);
    fprintf(stderr, "(expected: a refused launch)\n");
    MS_LAUNCH(k_dyn, 1, 256, 64 * 1024, 0, out2, pat, big);
    T_EQ_INT(cudaGetLastError(), cudaErrorInvalidValue);
    CU_CHECK(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    MS_LAUNCH(k_dyn, 1, 256, 64 * 1024, 0, out2, pat, big);
    T_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<float> h2 = down(out2, big);
    T_EQ_INT(h2[0], big - 1);
    /* a launch that names its kernel is checked against that kernel's value */
    NAMED_LAUNCH(k_dyn, 1, 256, 64 * 1024, 0, out2, pat, big);
    T_EQ_INT(cudaGetLastError(), cudaSuccess);
    fprintf(stderr, "(expected: a refused launch of k_dyn2)\n");
    NAMED_LAUNCH(k_dyn2, 1, 256, 64 * 1024, 0, out2, pat, big);
    T_EQ_INT(cudaGetLastError(), cudaErrorInvalidValue);
    cudaFree(out2);
    cudaFree(pat);
}

/* ---- launch errors ---- */

__global__ void k_flag(int *f) {
    f[0] = 1;
}

void test_launch_errors() {
    int *f = dalloc<int>(1);
    CU_CHECK(cudaMemset(f, 0, sizeof(int)));
    fprintf(stderr, "(expected: four refused launches)\n");
    MS_LAUNCH(k_flag, 1, 0, 0, 0, f);
    T_EQ_INT(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    T_EQ_INT(cudaGetLastError(), cudaErrorInvalidConfiguration);
    T_EQ_INT(cudaGetLastError(), cudaSuccess);
    MS_LAUNCH(k_flag, 1, 1025, 0, 0, f);
    T_EQ_INT(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MS_LAUNCH(k_flag, 1, dim3(16, 16, 8), 0, 0, f);
    T_EQ_INT(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MS_LAUNCH(k_flag, 1, 32, 228 * 1024, 0, f);
    T_EQ_INT(cudaGetLastError(), cudaErrorInvalidValue);
    cudaStream_t s;
    CU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    MS_LAUNCH(k_flag, 1, 32, 0, s, f);
    T_EQ_INT(cudaGetLastError(), cudaSuccess);
    T_EQ_INT(down(f, 1)[0], 0 + 1);
    CU_CHECK(cudaMemset(f, 0, sizeof(int)));
    CU_CHECK(cudaStreamDestroy(s));
    fprintf(stderr, "(expected: a launch on a destroyed stream)\n");
    MS_LAUNCH(k_flag, 1, 32, 0, s, f);
    T_EQ_INT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    T_EQ_INT(down(f, 1)[0], 0); /* no refused launch ran */
    cudaFree(f);
}

/* ---- kernels that must abort ---- */

__global__ void k_divergent(float *out) {
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncwarp();
    out[threadIdx.x] = 1.0f;
}
__global__ void k_exited_shfl(float *out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_xor_sync(FULL, 1.0f, 1);
}
__global__ void k_partial_mask(float *out) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffu, 1.0f, 1);
}
__global__ void k_wmma_misaligned(float *out) {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
    nvcuda::wmma::fill_fragment(acc, 0.0f);
    nvcuda::wmma::store_matrix_sync(out + 1, acc, 16, nvcuda::wmma::mem_row_major);
}

__device__ int deep(int n) {
    volatile char pad[1024];
    pad[0] = (char)n;
    return n ? deep(n - 1) + pad[0] : 0;
}
__global__ void k_deep(int *out) {
    out[threadIdx.x] = deep(1000); /* ~1 MiB of stack */
}

void child_deep() {
    int *o = dalloc<int>(32);
    MS_LAUNCH(k_deep, 1, 32, 0, 0, o);
}
void child_divergent() {
    float *o = dalloc<float>(64);
    MS_LAUNCH(k_divergent, 2, 64, 0, 0, o);
}
void child_divergent_named() {
    float *o = dalloc<float>(64);
    NAMED_LAUNCH(k_divergent, 2, 64, 0, 0, o);
}
void child_exited_shfl() {
    float *o = dalloc<float>(64);
    MS_LAUNCH(k_exited_shfl, 1, 64, 0, 0, o);
}
void child_partial_mask() {
    float *o = dalloc<float>(64);
    MS_LAUNCH(k_partial_mask, 1, 32, 0, 0, o);
}
void child_wmma_misaligned() {
    float *o = dalloc<float>(1024);
    MS_LAUNCH(k_wmma_misaligned, 1, 32, 0, 0, o);
}

void test_aborts() {
    expect_abort(child_divergent, "deadlock/divergent barrier in kernel");
    expect_abort(child_divergent_named, "in kernel k_divergent");
    expect_abort(child_exited_shfl, "lanes have exited");
    expect_abort(child_partial_mask, "only the full mask");
    expect_abort(child_wmma_misaligned, "not 32-byte aligned");
}

/* A segfault (not an abort) that names its cause. */
void test_stack_overflow() {
    int p[2];
    if (pipe(p) != 0) abort();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit r = {0, 0};
        setrlimit(RLIMIT_CORE, &r);
        dup2(p[1], 2);
        close(p[0]);
        child_deep();
        _exit(0);
    }
    close(p[1]);
    char buf[512] = {0};
    ssize_t k = read(p[0], buf, sizeof buf - 1);
    (void)k;
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    T_OK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    T_STR_CONTAINS(buf, "overflowed its fiber stack");
}

/* ---- wmma ---- */

/* C (M,N) f32 (+)= A (M,K) B (K,N), bf16; layouts as the template says,
 * C row- or col-major.  Block: 2 warps, warp w takes tile row w of the
 * block's tile column blockIdx.x; blockIdx.y picks the pair of tile rows. */
template <class LA, class LB>
__device__ void wmma_tiles(float *C, const bf16 *A, const bf16 *B, int K, int lda, int ldb, int ldc,
                           int c_col, int accumulate) {
    using namespace nvcuda;
    bool a_col = std::is_same<LA, wmma::col_major>::value;
    bool b_col = std::is_same<LB, wmma::col_major>::value;
    int tm = (blockIdx.y * 2 + threadIdx.x / 32) * 16, tn = blockIdx.x * 16;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LA> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    float *pc = c_col ? C + tm + (size_t)tn * ldc : C + (size_t)tm * ldc + tn;
    wmma::layout_t cl = c_col ? wmma::mem_col_major : wmma::mem_row_major;
    if (accumulate)
        wmma::load_matrix_sync(acc, pc, ldc, cl);
    else
        wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(a, a_col ? A + tm + (size_t)k * lda : A + (size_t)tm * lda + k, lda);
        wmma::load_matrix_sync(b, b_col ? B + k + (size_t)tn * ldb : B + (size_t)k * ldb + tn, ldb);
        wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(pc, acc, ldc, cl);
}
__global__ void k_wmma_rr(float *C, const bf16 *A, const bf16 *B, int K, int lda, int ldb, int ldc,
                          int c_col, int acc) {
    wmma_tiles<nvcuda::wmma::row_major, nvcuda::wmma::row_major>(C, A, B, K, lda, ldb, ldc, c_col,
                                                                 acc);
}
__global__ void k_wmma_rc(float *C, const bf16 *A, const bf16 *B, int K, int lda, int ldb, int ldc,
                          int c_col, int acc) {
    wmma_tiles<nvcuda::wmma::row_major, nvcuda::wmma::col_major>(C, A, B, K, lda, ldb, ldc, c_col,
                                                                 acc);
}
__global__ void k_wmma_cr(float *C, const bf16 *A, const bf16 *B, int K, int lda, int ldb, int ldc,
                          int c_col, int acc) {
    wmma_tiles<nvcuda::wmma::col_major, nvcuda::wmma::row_major>(C, A, B, K, lda, ldb, ldc, c_col,
                                                                 acc);
}
__global__ void k_wmma_cc(float *C, const bf16 *A, const bf16 *B, int K, int lda, int ldb, int ldc,
                          int c_col, int acc) {
    wmma_tiles<nvcuda::wmma::col_major, nvcuda::wmma::col_major>(C, A, B, K, lda, ldb, ldc, c_col,
                                                                 acc);
}

void test_wmma() {
    const int M = 32, N = 48, K = 64;
    for (int v = 0; v < 8; v++) {
        int a_col = v & 1, b_col = (v >> 1) & 1, c_col = (v >> 2) & 1,
            accumulate = v == 3 || v == 4;
        int lda = a_col ? M : K, ldb = b_col ? K : N, ldc = c_col ? M : N;
        std::vector<bf16> ha((size_t)M * K), hb((size_t)K * N);
        std::vector<float> hc((size_t)M * N);
        for (auto &x : ha)
            x = f2bf(frand());
        for (auto &x : hb)
            x = f2bf(frand());
        for (auto &x : hc)
            x = frand();
        bf16 *A = dalloc<bf16>(ha.size()), *B = dalloc<bf16>(hb.size());
        float *C = dalloc<float>(hc.size());
        up(A, ha);
        up(B, hb);
        up(C, hc);
        dim3 grid(N / 16, M / 32);
        if (!a_col && !b_col)
            MS_LAUNCH(k_wmma_rr, grid, 64, 0, 0, C, A, B, K, lda, ldb, ldc, c_col, accumulate);
        if (!a_col && b_col)
            MS_LAUNCH(k_wmma_rc, grid, 64, 0, 0, C, A, B, K, lda, ldb, ldc, c_col, accumulate);
        if (a_col && !b_col)
            MS_LAUNCH(k_wmma_cr, grid, 64, 0, 0, C, A, B, K, lda, ldb, ldc, c_col, accumulate);
        if (a_col && b_col)
            MS_LAUNCH(k_wmma_cc, grid, 64, 0, 0, C, A, B, K, lda, ldb, ldc, c_col, accumulate);
        CU_CHECK_LAUNCH();
        std::vector<float> got = down(C, hc.size());
        std::vector<double> g, r;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                size_t ci = c_col ? i + (size_t)j * ldc : (size_t)i * ldc + j;
                double s = accumulate ? hc[ci] : 0.0;
                for (int k = 0; k < K; k++)
                    s += (double)bf2f(ha[a_col ? i + (size_t)k * lda : (size_t)i * lda + k]) *
                         bf2f(hb[b_col ? k + (size_t)j * ldb : (size_t)k * ldb + j]);
                g.push_back(got[ci]);
                r.push_back(s);
            }
        char name[64];
        snprintf(name, sizeof name, "wmma A%c B%c C%c%s", a_col ? 'c' : 'r', b_col ? 'c' : 'r',
                 c_col ? 'c' : 'r', accumulate ? " +=" : "");
        check_close(name, g, r, 1e-5, 1e-4);
        cudaFree(A);
        cudaFree(B);
        cudaFree(C);
    }
}

/* ---- cuBLASLt ---- */

#define LT_OK(call) T_EQ_INT((call), CUBLAS_STATUS_SUCCESS)

double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

struct LtCase {
    int ta, tb, out_f32;
    cublasLtEpilogue_t epi;
    float beta;
};

/* Column-major D (m,n) = epi(alpha op(A) op(B) + beta C + bias), checked
 * against a double loop over the same bf16 inputs. */
void lt_case(cublasLtHandle_t h, const LtCase &c) {
    const int m = 24, n = 40, k = 32;
    const float alpha = 0.75f;
    int ar = c.ta ? k : m, ac = c.ta ? m : k, br = c.tb ? n : k, bc = c.tb ? k : n;
    int lda = ar + 5, ldb = br + 3, ldd = m + 8;
    cudaDataType dt = c.out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    size_t es = c.out_f32 ? 4 : 2;
    bool has_bias = c.epi & CUBLASLT_EPILOGUE_BIAS, has_aux = c.epi & 128,
         has_gelu = c.epi & CUBLASLT_EPILOGUE_GELU;
    std::vector<bf16> ha((size_t)lda * ac), hb((size_t)ldb * bc);
    for (auto &x : ha)
        x = f2bf(frand());
    for (auto &x : hb)
        x = f2bf(frand());
    std::vector<double> cin((size_t)ldd * n), bias(m);
    std::vector<unsigned char> hc((size_t)ldd * n * es), hbias(m * es);
    for (size_t i = 0; i < cin.size(); i++) {
        float v = frand();
        if (c.out_f32)
            memcpy(&hc[i * 4], &v, 4);
        else {
            bf16 b = f2bf(v);
            memcpy(&hc[i * 2], &b, 2);
            v = bf2f(b);
        }
        cin[i] = v;
    }
    for (int i = 0; i < m; i++) {
        float v = frand();
        if (c.out_f32)
            memcpy(&hbias[i * 4], &v, 4);
        else {
            bf16 b = f2bf(v);
            memcpy(&hbias[i * 2], &b, 2);
            v = bf2f(b);
        }
        bias[i] = v;
    }
    bf16 *A = dalloc<bf16>(ha.size()), *B = dalloc<bf16>(hb.size());
    unsigned char *D = dalloc<unsigned char>(hc.size()), *bd = dalloc<unsigned char>(hbias.size());
    unsigned char *aux = dalloc<unsigned char>(hc.size());
    up(A, ha);
    up(B, hb);
    up(D, hc);
    up(bd, hbias);

    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_OK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof c.epi));
    if (has_bias) {
        const void *bp = bd;
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp,
                                             sizeof bp));
        if (!c.out_f32) /* explicit for bf16, the default (D's type) for f32 */
            LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt,
                                                 sizeof dt));
    }
    if (has_aux) {
        void *ap = aux;
        int64_t ald = ldd;
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap,
                                             sizeof ap));
        LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ald,
                                             sizeof ald));
    }
    LT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ar, ac, lda));
    LT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, br, bc, ldb));
    LT_OK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = 1 << 20;
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                               sizeof ws));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    LT_OK(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &res, &found));
    T_EQ_INT(found, 1);
    LT_OK(cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &c.beta, D, ld, D, ld, &res.algo, NULL, 0,
                         0));
    std::vector<unsigned char> hd = down(D, hc.size()), hx = down(aux, hc.size());
    std::vector<double> g, r, ga, ra;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int q = 0; q < k; q++) {
                double a = bf2f(ha[c.ta ? q + (size_t)i * lda : i + (size_t)q * lda]);
                double b = bf2f(hb[c.tb ? j + (size_t)q * ldb : q + (size_t)j * ldb]);
                s += a * b;
            }
            size_t o = i + (size_t)j * ldd;
            double v = alpha * s + c.beta * cin[o] + (has_bias ? bias[i] : 0.0);
            if (has_aux) ra.push_back(v);
            r.push_back(has_gelu ? gelu_ref(v) : v);
            auto rd = [&](const std::vector<unsigned char> &buf) {
                if (c.out_f32) {
                    float f;
                    memcpy(&f, &buf[o * 4], 4);
                    return (double)f;
                }
                bf16 b;
                memcpy(&b, &buf[o * 2], 2);
                return (double)bf2f(b);
            };
            g.push_back(rd(hd));
            if (has_aux) ga.push_back(rd(hx));
        }
    char name[96];
    snprintf(name, sizeof name, "cublasLt ta=%d tb=%d epi=%d %s beta=%g", c.ta, c.tb, (int)c.epi,
             c.out_f32 ? "f32" : "bf16", c.beta);
    double tol = c.out_f32 ? 1e-5 : 1e-2;
    check_close(name, g, r, tol, 1e-7);
    if (has_aux) check_close("  ... aux", ga, ra, tol, 1e-7);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(A);
    cudaFree(B);
    cudaFree(D);
    cudaFree(bd);
    cudaFree(aux);
}

/* Calls the real library rejects. */
void lt_rejects(cublasLtHandle_t h) {
    fprintf(stderr, "(expected: six cublasLt rejections)\n");
    const int m = 16, n = 16, k = 16;
    bf16 *A = dalloc<bf16>(m * k), *B = dalloc<bf16>(k * n), *D = dalloc<bf16>(m * n);
    CU_CHECK(cudaMemset(A, 0, m * k * 2));
    CU_CHECK(cudaMemset(B, 0, k * n * 2));
    std::vector<bf16> host_a(m * k);
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t l16, l8;
    LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_OK(cublasLtMatrixLayoutCreate(&l16, CUDA_R_16BF, 16, 16, 16));
    LT_OK(cublasLtMatrixLayoutCreate(&l8, CUDA_R_16BF, 8, 16, 8));
    float one = 1.0f, zero = 0.0f;
    /* shapes: op(A) 8x16 but D 16x16 */
    T_EQ_INT(cublasLtMatmul(h, desc, &one, A, l8, B, l16, &zero, D, l16, D, l16, NULL, NULL, 0, 0),
             CUBLAS_STATUS_INVALID_VALUE);
    /* A is host memory */
    T_EQ_INT(cublasLtMatmul(h, desc, &one, host_a.data(), l16, B, l16, &zero, D, l16, D, l16, NULL,
                            NULL, 0, 0),
             CUBLAS_STATUS_INVALID_VALUE);
    /* AUX_LD is an int64_t */
    int small_ld = 16;
    T_EQ_INT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &small_ld,
                                            sizeof small_ld),
             CUBLAS_STATUS_INVALID_VALUE);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU_AUX;
    void *aux = D;
    int64_t ald = 20; /* not a multiple of 8 */
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                         sizeof aux));
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ald,
                                         sizeof ald));
    T_EQ_INT(cublasLtMatmul(h, desc, &one, A, l16, B, l16, &zero, D, l16, D, l16, NULL, NULL, 0, 0),
             CUBLAS_STATUS_INVALID_VALUE);
    ald = 16;
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ald,
                                         sizeof ald));
    /* GELU_AUX with beta != 0 */
    T_EQ_INT(cublasLtMatmul(h, desc, &one, A, l16, B, l16, &one, D, l16, D, l16, NULL, NULL, 0, 0),
             CUBLAS_STATUS_INVALID_VALUE);
    /* ... and with beta 0 it runs */
    LT_OK(cublasLtMatmul(h, desc, &one, A, l16, B, l16, &zero, D, l16, D, l16, NULL, NULL, 0, 0));
    /* an aux buffer that is too small (ld 16 x 16 cols of bf16 = 512 B; give 256) */
    void *aux_small = NULL;
    CU_CHECK(cudaMalloc(&aux_small, 256));
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                         &aux_small, sizeof aux_small));
    T_EQ_INT(cublasLtMatmul(h, desc, &one, A, l16, B, l16, &zero, D, l16, D, l16, NULL, NULL, 0, 0),
             CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatrixLayoutDestroy(l16);
    cublasLtMatrixLayoutDestroy(l8);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(aux_small);
    cudaFree(A);
    cudaFree(B);
    cudaFree(D);
}

void test_cublaslt() {
    cublasLtHandle_t h;
    LT_OK(cublasLtCreate(&h));
    const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_DEFAULT,  CUBLASLT_EPILOGUE_BIAS,
                                       CUBLASLT_EPILOGUE_GELU,     CUBLASLT_EPILOGUE_GELU_BIAS,
                                       CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int f = 0; f < 2; f++) {
                for (cublasLtEpilogue_t e : epis)
                    lt_case(h, LtCase{ta, tb, f, e, 0.0f});
                lt_case(h, LtCase{ta, tb, f, CUBLASLT_EPILOGUE_DEFAULT, 1.0f});
                lt_case(h, LtCase{ta, tb, f, CUBLASLT_EPILOGUE_BIAS, -0.5f});
            }
    lt_rejects(h);
    LT_OK(cublasLtDestroy(h));
}

/* ---- cub, runtime ---- */

void test_sort() {
    const int n = 1000;
    std::vector<int> hk(n), hv(n);
    for (int i = 0; i < n; i++) {
        hk[i] = (int)(frand() * 5.0f);
        hv[i] = i;
    }
    int *ki = dalloc<int>(n), *ko = dalloc<int>(n), *vi = dalloc<int>(n), *vo = dalloc<int>(n);
    up(ki, hk);
    up(vi, hv);
    size_t tb = 0;
    CU_CHECK(cub::DeviceRadixSort::SortPairs(NULL, tb, ki, ko, vi, vo, n));
    T_OK(tb > 0);
    void *tmp = dalloc<unsigned char>(tb);
    CU_CHECK(cub::DeviceRadixSort::SortPairs(tmp, tb, ki, ko, vi, vo, n));
    std::vector<int> gk = down(ko, n), gv = down(vo, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        bad += gk[i] != hk[gv[i]]; /* pairs stay together */
        if (i) bad += gk[i] < gk[i - 1] || (gk[i] == gk[i - 1] && gv[i] < gv[i - 1]);
    }
    T_EQ_INT(bad, 0);
    T_OK(gk[0] < 0); /* negative keys first */

    /* unsigned keys by bits [4, 8) only */
    std::vector<unsigned> uk(n);
    for (int i = 0; i < n; i++)
        uk[i] = (unsigned)(frand() * 1e6f + 1e6f);
    unsigned *uki = dalloc<unsigned>(n), *uko = dalloc<unsigned>(n);
    up(uki, uk);
    CU_CHECK(cub::DeviceRadixSort::SortPairs(tmp, tb, uki, uko, vi, vo, n, 4, 8));
    std::vector<unsigned> guk = down(uko, n);
    gv = down(vo, n);
    bad = 0;
    for (int i = 1; i < n; i++) {
        unsigned a = (guk[i - 1] >> 4) & 15, b = (guk[i] >> 4) & 15;
        bad += a > b || (a == b && gv[i] < gv[i - 1]) || guk[i] != uk[gv[i]];
    }
    T_EQ_INT(bad, 0);
    cudaFree(ki);
    cudaFree(ko);
    cudaFree(vi);
    cudaFree(vo);
    cudaFree(uki);
    cudaFree(uko);
    cudaFree(tmp);
}

void test_events() {
    cudaEvent_t a, b, nt;
    CU_CHECK(cudaEventCreate(&a));
    CU_CHECK(cudaEventCreate(&b));
    CU_CHECK(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
    CU_CHECK(cudaEventRecord(a, 0));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t1);
    while ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6 < 3.0);
    CU_CHECK(cudaEventRecord(b, 0));
    CU_CHECK(cudaEventRecord(nt, 0));
    CU_CHECK(cudaEventSynchronize(b));
    T_EQ_INT(cudaEventQuery(b), cudaSuccess);
    float ms = -1.0f, back = 1.0f;
    CU_CHECK(cudaEventElapsedTime(&ms, a, b));
    CU_CHECK(cudaEventElapsedTime(&back, b, a));
    T_OK(ms >= 3.0f && ms < 1000.0f);
    T_OK(back <= 0.0f);
    T_EQ_INT(cudaEventElapsedTime(&ms, a, nt), cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    CU_CHECK(cudaEventDestroy(a));
    CU_CHECK(cudaEventDestroy(b));
    CU_CHECK(cudaEventDestroy(nt));
}

void test_device_and_memory() {
    int count = -1;
    setenv("MS_EMU_NO_DEVICE", "1", 1);
    T_EQ_INT(cudaGetDeviceCount(&count), cudaErrorNoDevice);
    T_EQ_INT(count, 0);
    T_EQ_INT(cudaGetLastError(), cudaErrorNoDevice);
    unsetenv("MS_EMU_NO_DEVICE");
    T_EQ_INT(cudaGetDeviceCount(&count), cudaSuccess);
    T_EQ_INT(count, 1);
    cudaDeviceProp p;
    CU_CHECK(cudaGetDeviceProperties(&p, 0));
    T_STR_CONTAINS(p.name, "cuda-emu");
    T_EQ_INT(p.multiProcessorCount, 8);
    T_EQ_INT(p.major, 9);
    int v = 0;
    CU_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    T_EQ_INT(v, 227 * 1024);
    T_EQ_INT(cudaSetDevice(1), cudaErrorInvalidDevice);
    (void)cudaGetLastError();

    fprintf(stderr, "(expected: four rejected memory calls)\n");
    float *d = NULL, *h = NULL;
    CU_CHECK(cudaMalloc(&d, 1000 * sizeof(float)));
    T_EQ_INT((uintptr_t)d % 256, 0);
    CU_CHECK(cudaMallocHost(&h, 1000 * sizeof(float)));
    std::vector<float> plain(1001);
    cudaPointerAttributes at;
    CU_CHECK(cudaPointerGetAttributes(&at, d + 10));
    T_EQ_INT(at.type, cudaMemoryTypeDevice);
    CU_CHECK(cudaPointerGetAttributes(&at, h));
    T_EQ_INT(at.type, cudaMemoryTypeHost);
    CU_CHECK(cudaPointerGetAttributes(&at, plain.data()));
    T_EQ_INT(at.type, cudaMemoryTypeUnregistered);
    T_EQ_INT(cudaMemcpy(d, plain.data(), 1001 * sizeof(float), cudaMemcpyHostToDevice),
             cudaErrorInvalidValue); /* overrun */
    T_EQ_INT(cudaMemcpy(d, plain.data(), 10, cudaMemcpyDeviceToHost),
             cudaErrorInvalidValue); /* swapped */
    T_EQ_INT(cudaFree(plain.data()), cudaErrorInvalidValue);
    T_EQ_INT(cudaMemset(plain.data(), 0, 4), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    std::vector<float> back(1000);
    CU_CHECK(cudaMemcpy(back.data(), d, 4, cudaMemcpyDeviceToHost));
    T_OK(isnan(back[0])); /* fresh device memory reads as NaN */
    size_t fr = 0, tot = 0;
    CU_CHECK(cudaMemGetInfo(&fr, &tot));
    T_OK(fr > 0 && fr <= tot);
    CU_CHECK(cudaFree(d));
    CU_CHECK(cudaFreeHost(h));
}

void test_bf16() {
    T_EQ_INT(__float2bfloat16(1.0f).__x, 0x3F80);
    T_EQ_INT(__float2bfloat16(1.0f + 1.0f / 256).__x, 0x3F80); /* tie: to even */
    T_EQ_INT(__float2bfloat16(1.0f + 3.0f / 256).__x, 0x3F82); /* tie: to even (up) */
    T_EQ_INT(__float2bfloat16(1.0f + 1.5f / 256).__x, 0x3F81); /* above the tie */
    T_EQ_INT(__float2bfloat16(-0.0f).__x, 0x8000);
    T_EQ_INT(__float2bfloat16(INFINITY).__x, 0x7F80);
    T_OK(isnan(__bfloat162float(__float2bfloat16(NAN))));
    T_OK(isnan(__bfloat162float(__float2bfloat16(-NAN))));
    T_NEAR(__bfloat162float(__float2bfloat16(3.14159f)), 3.140625, 0.0);
    __nv_bfloat162 two = __floats2bfloat162_rn(0.5f, -2.0f);
    float2 f2 = __bfloat1622float2(two);
    T_NEAR(f2.x, 0.5, 0.0);
    T_NEAR(__high2float(two), -2.0, 0.0);
}

/* Not a correctness test: how fast barriers go (printed). */
void report_speed() {
    const int rows = 64, n = 4096, bs = 512;
    std::vector<float> hx((size_t)rows * n, 1.0f);
    float *x = dalloc<float>(hx.size()), *s = dalloc<float>(rows * bs),
          *m = dalloc<float>(rows * bs), *s2 = dalloc<float>(rows * bs);
    up(x, hx);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    MS_LAUNCH(k_block_reduce, rows, bs, 0, 0, s, m, s2, x, n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    /* per thread: 3 block reductions = 6 __syncthreads + 30 shuffles */
    printf("speed: %d blocks x %d threads x 36 sync points in %.3f s (%.0f ns per fiber switch)\n",
           rows, bs, sec, sec * 1e9 / ((double)rows * bs * 37));
    T_NEAR(down(s, 1)[0], n, 0.0);
    cudaFree(x);
    cudaFree(s);
    cudaFree(m);
    cudaFree(s2);
}

} // namespace

int main(void) {
    test_bf16();
    test_device_and_memory();
    test_block_reduce();
    test_shuffles();
    test_votes();
    test_races();
    test_index();
    test_dyn_smem();
    test_smem_optin();
    test_launch_errors();
    test_aborts();
    test_stack_overflow();
    test_wmma();
    test_cublaslt();
    test_sort();
    test_events();
    report_speed();
    /* the portable context switch too (the default is the x86-64 one) */
    setenv("MS_EMU_UCONTEXT", "1", 1);
    test_block_reduce();
    test_shuffles();
    test_votes();
    test_dyn_smem();
    test_wmma();
    report_speed();
    unsetenv("MS_EMU_UCONTEXT");
    return ms_test_summary("test_emu");
}
