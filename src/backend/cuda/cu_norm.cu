/* cu_norm.cu - LayerNorm forward and backward on bf16 activations with fp32
 * statistics (eps 1e-5, biased variance, the CPU's formulas and operation
 * order in cpu_norm.c).
 *
 * Launch:
 *  - forward: one warp per row, 8 rows per block of 256 threads; lane l
 *    reads the row's groups of 8 elements l, l+32, ... (one 16-byte load
 *    when C % 8 == 0 and the pointers are aligned, else 8 scalar loads of
 *    the same elements; the last C % 8 elements go to lanes 0..C%8-1), three
 *    passes (mean, variance, output), warp sums with the _sync shuffles.
 *  - backward: G = min(ceil(N/LN_MIN_ROWS), LN_MAX_BLOCKS) blocks of 256
 *    threads, block b owning the fixed rows [b*R, min((b+1)*R, N)).  Per
 *    group of 8 rows: each warp computes one row's two sums as above; then
 *    thread t walks columns t, t+256, ... of the 8 rows in row order, adding
 *    into dinp and into its own dw/db accumulators in shared memory (8C
 *    bytes, opted in beyond 47 KB; C <= LN_MAX_C).  The block writes its
 *    dw/db partials (2C f32) to the scratch; a second kernel (one thread
 *    per column) sums the G partials in block order and adds them into
 *    dw/db.
 * Deterministic: every sum has a fixed order that depends only on N and C
 * (not on alignment or scheduling); no atomics.
 */
#include "cu_ops.cuh"

#define LN_EPS 1e-5f
#define LN_THREADS 256 /* 8 warps */
#define LN_WARPS (LN_THREADS / 32)
#define LN_MIN_ROWS 16            /* fewest rows per backward block before adding blocks */
#define LN_MAX_BLOCKS 512         /* most backward blocks, i.e. dw/db partials */
#define LN_MAX_C CU_MAX_DIM       /* dw/db accumulators: 8C bytes of shared memory (128 KB) */
#define LN_SMEM_PLAIN (47 * 1024) /* dynamic shared memory that needs no opt-in */

/* out (N,C) bf16 = (inp - mean) * rstd * w + b; mean, rstd (N) f32 =. */
__global__ void ln_fwd_kernel(bf16 *out, float *mean, float *rstd, const bf16 *inp, const bf16 *w,
                              const bf16 *b, int N, int C, int vec) {
    int lane = threadIdx.x % 32, r = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    if (r >= N) return; /* the whole warp */
    const bf16 *x = inp + (size_t)r * C;
    bf16 *y = out + (size_t)r * C;
    int G8 = C / 8, tail = G8 * 8 + lane;
    float f[8], s = 0.0f;
    for (int g = lane; g < G8; g += 32) {
        cu_ld8_bf16(f, x, g, vec);
        for (int j = 0; j < 8; j++)
            s += f[j];
    }
    if (tail < C) s += bf2f(x[tail]);
    float m = cu_warp_sum(s) / (float)C, v = 0.0f;
    for (int g = lane; g < G8; g += 32) {
        cu_ld8_bf16(f, x, g, vec);
        for (int j = 0; j < 8; j++)
            v += (f[j] - m) * (f[j] - m);
    }
    if (tail < C) v += (bf2f(x[tail]) - m) * (bf2f(x[tail]) - m);
    /* a variance past fp32: NaN, not 1/sqrt(inf) = 0 (the row collapsed to the bias, finite;
     * cpu_norm.c) */
    float var = cu_warp_sum(v);
    float rs = isinf(var) ? __int_as_float(0x7fc00000) : 1.0f / sqrtf(var / (float)C + LN_EPS);
    for (int g = lane; g < G8; g += 32) {
        float fw[8], fb[8];
        cu_ld8_bf16(f, x, g, vec);
        cu_ld8_bf16(fw, w, g, vec);
        cu_ld8_bf16(fb, b, g, vec);
        cu_bf16x8 o;
        for (int j = 0; j < 8; j++)
            o.v[j] = f2bf((f[j] - m) * rs * fw[j] + fb[j]);
        if (vec)
            ((cu_bf16x8 *)y)[g] = o;
        else
            for (int j = 0; j < 8; j++)
                y[8 * g + j] = o.v[j];
    }
    if (tail < C) y[tail] = f2bf((bf2f(x[tail]) - m) * rs * bf2f(w[tail]) + bf2f(b[tail]));
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

/* out (N,C) bf16 =, mean/rstd (N) f32 = ; from inp (N,C), w, b (C) bf16. */
void cu_layernorm_fwd(be_backend *be, void *out, float *mean, float *rstd, const void *inp,
                      const void *w, const void *b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    int vec = C % 8 == 0 && cu_al16(out) && cu_al16(inp) && cu_al16(w) && cu_al16(b);
    MS_LAUNCH(ln_fwd_kernel, cu_div_up((size_t)N, LN_WARPS), LN_THREADS, 0, cu_of(be)->stream,
              (bf16 *)out, mean, rstd, (const bf16 *)inp, (const bf16 *)w, (const bf16 *)b, N, C,
              vec);
    CU_CHECK_LAUNCH();
}

/* Backward blocks for N rows (a function of N only). */
static int ln_bwd_blocks(int N) {
    int g = (int)cu_div_up((size_t)N, LN_MIN_ROWS);
    return g > LN_MAX_BLOCKS ? LN_MAX_BLOCKS : g;
}

/* Block b: dinp rows [b*R, min((b+1)*R, N)) += the LayerNorm input gradient;
 * part (G, 2C) f32 row b = [dw partial | db partial] of those rows. */
__global__ void ln_bwd_kernel(float *part, bf16 *dinp, const bf16 *dout, const bf16 *inp,
                              const bf16 *w, const float *mean, const float *rstd, int N, int C,
                              int R, int vec) {
    MS_DYN_SMEM(float, acc); /* [dw (C) | db (C)], column c owned by thread c % LN_THREADS */
    __shared__ float s_m[LN_WARPS], s_s[LN_WARPS], s_mdn[LN_WARPS], s_mdnx[LN_WARPS];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int r0 = blockIdx.x * R, r1 = r0 + R < N ? r0 + R : N;
    int G8 = C / 8, tail = G8 * 8 + lane;
    for (int c = threadIdx.x; c < C; c += LN_THREADS)
        acc[c] = acc[C + c] = 0.0f;
    for (int g0 = r0; g0 < r1; g0 += LN_WARPS) {
        int r = g0 + warp;
        if (r < r1) { /* the row's sums of dy*w and dy*w*xhat (warp-uniform branch) */
            const bf16 *dy = dout + (size_t)r * C, *x = inp + (size_t)r * C;
            float m = mean[r], s = rstd[r], sdn = 0.0f, sdnx = 0.0f;
            float fy[8], fx[8], fw[8];
            for (int g = lane; g < G8; g += 32) {
                cu_ld8_bf16(fy, dy, g, vec);
                cu_ld8_bf16(fx, x, g, vec);
                cu_ld8_bf16(fw, w, g, vec);
                for (int j = 0; j < 8; j++) {
                    float dn = fy[j] * fw[j];
                    sdn += dn;
                    sdnx += dn * (fx[j] - m) * s;
                }
            }
            if (tail < C) {
                float dn = bf2f(dy[tail]) * bf2f(w[tail]);
                sdn += dn;
                sdnx += dn * (bf2f(x[tail]) - m) * s;
            }
            sdn = cu_warp_sum(sdn);
            sdnx = cu_warp_sum(sdnx);
            if (lane == 0) {
                s_m[warp] = m;
                s_s[warp] = s;
                s_mdn[warp] = sdn / (float)C;
                s_mdnx[warp] = sdnx / (float)C;
            }
        }
        __syncthreads();
        int rows = r1 - g0 < LN_WARPS ? r1 - g0 : LN_WARPS;
        for (int c = threadIdx.x; c < C; c += LN_THREADS) {
            float wc = bf2f(w[c]), adw = acc[c], adb = acc[C + c];
            for (int k = 0; k < rows; k++) {
                size_t i = (size_t)(g0 + k) * C + c;
                float dy = bf2f(dout[i]), xh = (bf2f(inp[i]) - s_m[k]) * s_s[k];
                float d = (dy * wc - s_mdn[k] - xh * s_mdnx[k]) * s_s[k];
                dinp[i] = f2bf(bf2f(dinp[i]) + d);
                adw += dy * xh;
                adb += dy;
            }
            acc[c] = adw;
            acc[C + c] = adb;
        }
        __syncthreads(); /* the row statistics are rewritten next group */
    }
    float *p = part + (size_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < C; c += LN_THREADS) {
        p[c] = acc[c];
        p[C + c] = acc[C + c];
    }
}

/* dw, db (C) += sum over blocks b < G of part (G, 2C), in block order. */
__global__ void ln_bwd_final_kernel(float *dw, float *db, const float *part, int G, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int b = 0; b < G; b++) {
        sw += part[(size_t)b * 2 * C + c];
        sb += part[(size_t)b * 2 * C + C + c];
    }
    dw[c] += sw;
    db[c] += sb;
}

/* dinp (N,C) bf16 +=, dw/db (C) f32 += ; from dout, inp (N,C), w (C) bf16,
 * mean, rstd (N) f32.  Scratch: G*2C floats. */
void cu_layernorm_bwd(be_backend *be, void *dinp, float *dw, float *db, const void *dout,
                      const void *inp, const void *w, const float *mean, const float *rstd, int N,
                      int C) {
    cu_ctx *cx = cu_of(be);
    if (N <= 0 || C <= 0) return;
    MS_CHECKF(C <= LN_MAX_C, "layernorm_bwd: C=%d exceeds %d", C, LN_MAX_C);
    int G = ln_bwd_blocks(N), R = (int)cu_div_up((size_t)N, (size_t)G);
    size_t need = (size_t)G * 2 * C * sizeof(float);
    MS_CHECKF(need <= cx->scratch_bytes, "layernorm_bwd: C=%d needs %zu scratch bytes, have %zu", C,
              need, cx->scratch_bytes);
    int vec = C % 8 == 0 && cu_al16(dout) && cu_al16(inp) && cu_al16(w);
    float *part = (float *)cx->scratch;
    size_t smem = 2 * (size_t)C * sizeof(float);
    if (smem > LN_SMEM_PLAIN)
        CU_CHECK(cudaFuncSetAttribute(ln_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)smem));
    MS_LAUNCH(ln_bwd_kernel, G, LN_THREADS, smem, cx->stream, part, (bf16 *)dinp,
              (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)w, mean, rstd, N, C, R, vec);
    CU_CHECK_LAUNCH();
    MS_LAUNCH(ln_bwd_final_kernel, cu_div_up((size_t)C, LN_THREADS), LN_THREADS, 0, cx->stream, dw,
              db, (const float *)part, G, C);
    CU_CHECK_LAUNCH();
}

/* The backward's dw/db partials for the largest C. */
size_t cu_norm_scratch_bytes(const be_limits *lim) {
    return (size_t)LN_MAX_BLOCKS * 2 * (size_t)(lim->C > 0 ? lim->C : 0) * sizeof(float);
}
