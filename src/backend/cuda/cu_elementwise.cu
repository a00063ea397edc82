/* cu_elementwise.cu - GeLU forward/backward, the residual add, the bias add,
 * the f32 add and the bias gradient (column sums).
 *
 * Launch: the element-wise ops run one thread per group of 8 bf16 (one
 * 16-byte load/store when every pointer is aligned; 4 f32 for add_f32) in
 * blocks of 256, with a scalar path for the last partial group and for
 * unaligned views.  bias_bwd runs two kernels: grid (ceil(N/32), K) blocks of
 * 32 columns x 8 row lanes, block k summing rows [k*R, (k+1)*R) of its
 * columns into partial row k of the scratch (K <= BB_MAX_CHUNKS, fixed by M);
 * then one thread per column sums the K partials in order and adds to dbias.
 * Deterministic: element-wise ops do no cross-element arithmetic; bias_bwd's
 * chunks and every summation order depend only on M and N; no atomics.
 */
#include "cu_ops.cuh"

#define EW_THREADS 256
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* GeLU (tanh approximation) and its derivative, the CPU's formulas (cpu_gelu,
 * cpu_gelu_grad): 0.5*(1+tanh(u)) = 1/(1+exp(-2u)). */
__device__ static inline float ew_gelu(float x) {
    float u2 = 2.0f * GELU_K * (x + GELU_A * x * x * x);
    float c = u2 < -80.0f ? -80.0f : (u2 > 80.0f ? 80.0f : u2);
    float g = x / (1.0f + expf(-c));
    return u2 < -80.0f ? x * 0.0f : g; /* past the clamp its limit (a NaN stays NaN) */
}
__device__ static inline float ew_gelu_grad(float x) {
    float u2 = 2.0f * GELU_K * (x + GELU_A * x * x * x);
    float c = u2 < -80.0f ? -80.0f : (u2 > 80.0f ? 80.0f : u2);
    float e = expf(-c);
    float s = 1.0f / (1.0f + e);
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    float d = s + 2.0f * x * s * (e * s) * du;
    return u2 < -80.0f ? x * 0.0f : u2 > 80.0f ? 1.0f : d; /* the limits past the clamp */
}

struct ew_gelu_f {
    __device__ float operator()(float x, float) const { return ew_gelu(x); }
};
struct ew_gelu_bwd_f {
    __device__ float operator()(float x, float dy) const { return ew_gelu_grad(x) * dy; }
};
struct ew_add_f {
    __device__ float operator()(float a, float b) const { return a + b; }
};

/* out (n) = f(a, b) element-wise, bf16; b may be NULL (passes 0); out may
 * alias a or b (each element is read before it is written, by one thread). */
template <class F>
__global__ void ew_map_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n, int vec, F f) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    if (vec && i0 + 8 <= n) {
        cu_bf16x8 x = *(const cu_bf16x8 *)(a + i0), o;
        cu_bf16x8 y = b ? *(const cu_bf16x8 *)(b + i0) : x;
        for (int j = 0; j < 8; j++)
            o.v[j] = f2bf(f(bf2f(x.v[j]), b ? bf2f(y.v[j]) : 0.0f));
        *(cu_bf16x8 *)(out + i0) = o;
        return;
    }
    size_t i1 = i0 + 8 < n ? i0 + 8 : n;
    for (size_t i = i0; i < i1; i++)
        out[i] = f2bf(f(bf2f(a[i]), b ? bf2f(b[i]) : 0.0f));
}

template <class F>
static void ew_map(be_backend *be, void *out, const void *a, const void *b, size_t n, F f) {
    if (n == 0) return;
    int vec = cu_al16(out) && cu_al16(a) && cu_al16(b);
    MS_LAUNCH(ew_map_kernel<F>, cu_div_up(n, 8 * EW_THREADS), EW_THREADS, 0, cu_of(be)->stream,
              (bf16 *)out, (const bf16 *)a, (const bf16 *)b, n, vec, f);
    CU_CHECK_LAUNCH();
}

/* out (n) = gelu_tanh(inp) (n), bf16. */
void cu_gelu_fwd(be_backend *be, void *out, const void *inp, size_t n) {
    ew_map(be, out, inp, NULL, n, ew_gelu_f());
}

/* dinp (n) = gelu'(inp) * dout, bf16; dinp may alias dout. */
void cu_gelu_bwd(be_backend *be, void *dinp, const void *inp, const void *dout, size_t n) {
    ew_map(be, dinp, inp, dout, n, ew_gelu_bwd_f());
}

/* out (n) = a + b, bf16; out may alias a or b. */
void cu_residual_add(be_backend *be, void *out, const void *a, const void *b, size_t n) {
    ew_map(be, out, a, b, n, ew_add_f());
}

/* out (M,N) += bias (N), bf16, flat groups of 8; vec needs N % 8 == 0 so a
 * group never crosses a row. */
__global__ void bias_add_kernel(bf16 *out, const bf16 *bias, size_t n, int N, int vec) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    if (vec && i0 + 8 <= n) {
        cu_bf16x8 y = *(const cu_bf16x8 *)(out + i0);
        cu_bf16x8 c = *(const cu_bf16x8 *)(bias + i0 % (size_t)N);
        for (int j = 0; j < 8; j++)
            y.v[j] = f2bf(bf2f(y.v[j]) + bf2f(c.v[j]));
        *(cu_bf16x8 *)(out + i0) = y;
        return;
    }
    size_t i1 = i0 + 8 < n ? i0 + 8 : n;
    for (size_t i = i0; i < i1; i++)
        out[i] = f2bf(bf2f(out[i]) + bf2f(bias[i % (size_t)N]));
}

/* out (M,N) bf16 += bias (N) bf16, broadcast over the rows. */
void cu_bias_add(be_backend *be, void *out, const void *bias, int M, int N) {
    size_t n = (size_t)M * (size_t)(N > 0 ? N : 0);
    if (M <= 0 || N <= 0) return;
    int vec = N % 8 == 0 && cu_al16(out) && cu_al16(bias);
    MS_LAUNCH(bias_add_kernel, cu_div_up(n, 8 * EW_THREADS), EW_THREADS, 0, cu_of(be)->stream,
              (bf16 *)out, (const bf16 *)bias, n, N, vec);
    CU_CHECK_LAUNCH();
}

/* y (n) += x (n), f32, groups of 4. */
__global__ void add_f32_kernel(float *y, const float *x, size_t n, int vec) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= n) return;
    if (vec && i0 + 4 <= n) {
        cu_f32x4 a = *(const cu_f32x4 *)(y + i0), b = *(const cu_f32x4 *)(x + i0);
        for (int j = 0; j < 4; j++)
            a.v[j] += b.v[j];
        *(cu_f32x4 *)(y + i0) = a;
        return;
    }
    size_t i1 = i0 + 4 < n ? i0 + 4 : n;
    for (size_t i = i0; i < i1; i++)
        y[i] += x[i];
}

/* y (n) f32 += x (n) f32. */
void cu_add_f32(be_backend *be, float *y, const float *x, size_t n) {
    if (n == 0) return;
    int vec = cu_al16(y) && cu_al16(x);
    MS_LAUNCH(add_f32_kernel, cu_div_up(n, 4 * EW_THREADS), EW_THREADS, 0, cu_of(be)->stream, y, x,
              n, vec);
    CU_CHECK_LAUNCH();
}

/* ---- bias_bwd ---- */

#define BB_COLS 32       /* columns per block (one warp wide) */
#define BB_LANES 8       /* row lanes per block */
#define BB_MAX_CHUNKS 64 /* most row chunks, i.e. partial rows */
#define BB_MIN_ROWS 64   /* fewest rows per chunk before adding chunks */

/* Row chunks of M rows: enough blocks to fill the GPU, bounded partials. */
static int bb_chunks(int M) {
    int k = (int)cu_div_up((size_t)M, BB_MIN_ROWS);
    return k < 1 ? 1 : (k > BB_MAX_CHUNKS ? BB_MAX_CHUNKS : k);
}

/* part (K,N) f32 = column sums of rows [k*R, min((k+1)*R, M)) of dout (M,N)
 * bf16, for block (tile, k); R = rows per chunk. */
__global__ void bias_bwd_part_kernel(float *part, const bf16 *dout, int M, int N, int R) {
    __shared__ float s[BB_LANES][BB_COLS];
    int lane = threadIdx.x % BB_COLS, rl = threadIdx.x / BB_COLS;
    int c = blockIdx.x * BB_COLS + lane, k = blockIdx.y;
    int r0 = k * R, r1 = r0 + R < M ? r0 + R : M;
    float acc = 0.0f;
    if (c < N)
        for (int r = r0 + rl; r < r1; r += BB_LANES)
            acc += bf2f(dout[(size_t)r * N + c]);
    s[rl][lane] = acc;
    __syncthreads();
    if (rl == 0 && c < N) {
        float t = 0.0f;
        for (int j = 0; j < BB_LANES; j++)
            t += s[j][lane];
        part[(size_t)k * N + c] = t;
    }
}

/* dbias (N) += sum over k < K of part (K,N), in order. */
__global__ void bias_bwd_final_kernel(float *dbias, const float *part, int K, int N) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= N) return;
    float t = 0.0f;
    for (int k = 0; k < K; k++)
        t += part[(size_t)k * N + c];
    dbias[c] += t;
}

/* dbias (N) f32 += column sums of dout (M,N) bf16.  Scratch: K*N floats. */
void cu_bias_bwd(be_backend *be, float *dbias, const void *dout, int M, int N) {
    cu_ctx *cx = cu_of(be);
    if (M <= 0 || N <= 0) return;
    int K = bb_chunks(M), R = (int)cu_div_up((size_t)M, (size_t)K);
    size_t need = (size_t)K * N * sizeof(float);
    MS_CHECKF(need <= cx->scratch_bytes, "bias_bwd: N=%d needs %zu scratch bytes, have %zu", N,
              need, cx->scratch_bytes);
    float *part = (float *)cx->scratch;
    MS_LAUNCH(bias_bwd_part_kernel, dim3(cu_div_up((size_t)N, BB_COLS), K), BB_COLS * BB_LANES, 0,
              cx->stream, part, (const bf16 *)dout, M, N, R);
    CU_CHECK_LAUNCH();
    MS_LAUNCH(bias_bwd_final_kernel, cu_div_up((size_t)N, EW_THREADS), EW_THREADS, 0, cx->stream,
              dbias, (const float *)part, K, N);
    CU_CHECK_LAUNCH();
}

/* bias_bwd's partials for N up to 4C (the MLP's first layer). */
size_t cu_elementwise_scratch_bytes(const be_limits *lim) {
    return (size_t)BB_MAX_CHUNKS * 4 * (size_t)(lim->C > 0 ? lim->C : 0) * sizeof(float);
}
