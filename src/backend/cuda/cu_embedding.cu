/* cu_embedding.cu - token + position embedding, forward and backward, over
 * the whole vocabulary or one slice of it (vocabulary parallelism).
 *
 * Launch:
 *  - forward: one block of 128 threads per row (b,t), threads over groups of
 *    8 channels (one 16-byte load/store when C % 8 == 0 and the pointers
 *    are aligned, else scalar).
 *  - backward, dwte: (1) one thread per position writes the key (token -
 *    v0 if the token is in the slice, else EMB_SKIP) and the value (the
 *    position); (2) cub::DeviceRadixSort::SortPairs sorts the pairs by key,
 *    stably, so each run of equal keys lists its positions in ascending
 *    order; (3) grid (ceil(n/32), ceil(C/256)) of 256 threads, one channel
 *    per thread: block x takes the runs that start (key differs from its
 *    predecessor, not EMB_SKIP) at sorted indices [32x, 32x+32), and for
 *    each sums the run's dout rows in position order in fp32 and adds the
 *    sum into dwte[key] (a long run costs its block a walk of its length).
 *    Keys, values and the sort's temporary storage live in the scratch.
 *  - backward, dwpe: one block per position t, threads over channels, summing
 *    dout[b,t,:] over b in order and adding into dwpe[t].
 * Deterministic: the stable sort fixes the order of the positions of every
 * token; every sum runs in that order in one thread; no float atomics.
 */
#include <limits.h>

#include <cub/cub.cuh>

#include "cu_ops.cuh"

#define EMB_FWD_THREADS 128
#define EMB_BWD_THREADS 256
#define EMB_SKIP 0xFFFFFFFFu /* key of a position whose token is outside the slice */
#define EMB_RUN_CHUNK 32     /* sorted indices whose runs one block handles */

/* Row r of out (B*T, C) = (v0 <= tok < v0+Vs ? wte[tok-v0] : 0) [+ wpe[r % T]]. */
__global__ void emb_fwd_kernel(bf16 *out, const int32_t *tok, const bf16 *wte, const bf16 *wpe,
                               int T, int C, int v0, int Vs, int vec) {
    size_t r = blockIdx.x;
    long long id = (long long)tok[r] - v0;
    const bf16 *a = id >= 0 && id < Vs ? wte + (size_t)id * C : NULL;
    const bf16 *p = wpe ? wpe + (r % (size_t)T) * C : NULL;
    bf16 *y = out + r * C;
    int G8 = C / 8;
    for (int g = threadIdx.x; g < G8; g += blockDim.x) {
        float fa[8], fp[8];
        cu_bf16x8 o;
        cu_ld8_bf16(fa, a, g, vec);
        cu_ld8_bf16(fp, p, g, vec);
        for (int j = 0; j < 8; j++)
            o.v[j] = f2bf(a && p ? fa[j] + fp[j] : (a ? fa[j] : fp[j]));
        if (vec)
            ((cu_bf16x8 *)y)[g] = o;
        else
            for (int j = 0; j < 8; j++)
                y[8 * g + j] = o.v[j];
    }
    for (int c = G8 * 8 + threadIdx.x; c < C; c += blockDim.x) {
        float s = a && p ? bf2f(a[c]) + bf2f(p[c]) : (a ? bf2f(a[c]) : (p ? bf2f(p[c]) : 0.0f));
        y[c] = f2bf(s);
    }
}

static void emb_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte, const void *wpe,
                    int B, int T, int C, int v0, int Vs) {
    size_t rows = (size_t)B * (size_t)T;
    if (B <= 0 || T <= 0 || C <= 0) return;
    int vec = C % 8 == 0 && cu_al16(out) && cu_al16(wte) && cu_al16(wpe);
    MS_LAUNCH(emb_fwd_kernel, (unsigned)rows, EMB_FWD_THREADS, 0, cu_of(be)->stream, (bf16 *)out,
              tok, (const bf16 *)wte, (const bf16 *)wpe, T, C, v0, Vs, vec);
    CU_CHECK_LAUNCH();
}

/* Where the backward's arrays lie in the scratch for n positions. */
typedef struct {
    size_t keys_in, keys_out, vals_in, vals_out, temp, temp_bytes, total;
} emb_plan;

static size_t emb_align(size_t x) {
    return (x + 255) & ~(size_t)255;
}

static emb_plan emb_plan_for(int n) {
    emb_plan p;
    size_t arr = emb_align((size_t)n * 4);
    p.temp_bytes = 0;
    CU_CHECK(cub::DeviceRadixSort::SortPairs(NULL, p.temp_bytes, (const unsigned *)NULL,
                                             (unsigned *)NULL, (const int *)NULL, (int *)NULL, n));
    p.keys_in = 0;
    p.keys_out = arr;
    p.vals_in = 2 * arr;
    p.vals_out = 3 * arr;
    p.temp = 4 * arr;
    p.total = p.temp + emb_align(p.temp_bytes);
    return p;
}

/* keys (n) = the token's row in the slice or EMB_SKIP; vals (n) = position. */
__global__ void emb_keys_kernel(unsigned *keys, int *vals, const int32_t *tok, int n, int v0,
                                int Vs) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long id = (long long)tok[i] - v0;
    keys[i] = id >= 0 && id < Vs ? (unsigned)id : EMB_SKIP;
    vals[i] = i;
}

/* Block (b, y), channel c = y*blockDim.x + threadIdx.x: for each sorted
 * index i in [b*EMB_RUN_CHUNK, (b+1)*EMB_RUN_CHUNK) that starts a run of key
 * k (!= EMB_SKIP), dwte[k][c] += the sum of dout rows vals[i], vals[i+1],
 * ... while the key stays k (possibly past the chunk), in that order. */
__global__ void emb_wte_bwd_kernel(float *dwte, const bf16 *dout, const unsigned *keys,
                                   const int *vals, int n, int C) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    int i0 = blockIdx.x * EMB_RUN_CHUNK, i1 = i0 + EMB_RUN_CHUNK < n ? i0 + EMB_RUN_CHUNK : n;
    if (c >= C) return;
    for (int i = i0; i < i1; i++) {
        unsigned k = keys[i];
        if (k == EMB_SKIP) break; /* sorted last: the rest are skipped too */
        if (i > 0 && keys[i - 1] == k) continue;
        float acc = 0.0f;
        for (int j = i; j < n && keys[j] == k; j++)
            acc += bf2f(dout[(size_t)vals[j] * C + c]);
        dwte[(size_t)k * C + c] += acc;
    }
}

/* dwpe[t] (C) += sum over b < B of dout[b,t] (C), in b order. */
__global__ void emb_wpe_bwd_kernel(float *dwpe, const bf16 *dout, int B, int T, int C) {
    int t = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int b = 0; b < B; b++)
            acc += bf2f(dout[((size_t)b * T + t) * C + c]);
        dwpe[(size_t)t * C + c] += acc;
    }
}

static void emb_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout, const int32_t *tok,
                    int B, int T, int C, int v0, int Vs) {
    cu_ctx *cx = cu_of(be);
    if (B <= 0 || T <= 0 || C <= 0) return;
    MS_CHECKF((size_t)B * T <= (size_t)cx->lim.B * cx->lim.T,
              "embedding_bwd: B*T=%d exceeds the reserved %d (call reserve)", B * T,
              cx->lim.B * cx->lim.T);
    int n = B * T;
    const bf16 *dy = (const bf16 *)dout;
    if (Vs > 0) {
        emb_plan p = emb_plan_for(n);
        MS_CHECKF(p.total <= cx->scratch_bytes,
                  "embedding_bwd: %d positions need %zu scratch bytes, have %zu", n, p.total,
                  cx->scratch_bytes);
        char *s = (char *)cx->scratch;
        unsigned *kin = (unsigned *)(s + p.keys_in), *kout = (unsigned *)(s + p.keys_out);
        int *vin = (int *)(s + p.vals_in), *vout = (int *)(s + p.vals_out);
        MS_LAUNCH(emb_keys_kernel, cu_div_up((size_t)n, EMB_BWD_THREADS), EMB_BWD_THREADS, 0,
                  cx->stream, kin, vin, tok, n, v0, Vs);
        CU_CHECK_LAUNCH();
        size_t tb = p.temp_bytes;
        CU_CHECK(cub::DeviceRadixSort::SortPairs((void *)(s + p.temp), tb, (const unsigned *)kin,
                                                 kout, (const int *)vin, vout, n, 0, 32,
                                                 cx->stream));
        dim3 grid(cu_div_up((size_t)n, EMB_RUN_CHUNK), cu_div_up((size_t)C, EMB_BWD_THREADS));
        MS_LAUNCH(emb_wte_bwd_kernel, grid, EMB_BWD_THREADS, 0, cx->stream, dwte, dy,
                  (const unsigned *)kout, (const int *)vout, n, C);
        CU_CHECK_LAUNCH();
    }
    if (dwpe) {
        MS_LAUNCH(emb_wpe_bwd_kernel, (unsigned)T, EMB_BWD_THREADS, 0, cx->stream, dwpe, dy, B, T,
                  C);
        CU_CHECK_LAUNCH();
    }
}

/* out (B,T,C) bf16 = wte[tok] + wpe[t]. */
void cu_embedding_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                      const void *wpe, int B, int T, int C) {
    emb_fwd(be, out, tok, wte, wpe, B, T, C, 0, INT_MAX);
}

/* dwte (Vp,C), dwpe (Tmax,C) f32 += from dout (B,T,C) bf16. */
void cu_embedding_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                      const int32_t *tok, int B, int T, int C) {
    emb_bwd(be, dwte, dwpe, dout, tok, B, T, C, 0, INT_MAX);
}

/* out (B,T,C) bf16 = (tok in [v0, v0+Vs) ? wte[tok-v0] : 0) [+ wpe[t]]. */
void cu_embedding_slice_fwd(be_backend *be, void *out, const int32_t *tok, const void *wte,
                            const void *wpe, int B, int T, int C, int v0, int Vs) {
    MS_CHECKF(v0 >= 0 && Vs >= 0, "embedding slice: bad slice v0=%d Vs=%d", v0, Vs);
    emb_fwd(be, out, tok, wte, wpe, B, T, C, v0, Vs);
}

/* dwte (Vs,C) f32 += rows of dout whose token is in the slice; dwpe (Tmax,C)
 * f32 += dout when not NULL. */
void cu_embedding_slice_bwd(be_backend *be, float *dwte, float *dwpe, const void *dout,
                            const int32_t *tok, int B, int T, int C, int v0, int Vs) {
    MS_CHECKF(v0 >= 0 && Vs >= 0, "embedding slice: bad slice v0=%d Vs=%d", v0, Vs);
    emb_bwd(be, dwte, dwpe, dout, tok, B, T, C, v0, Vs);
}

/* Keys, values and radix-sort storage for B*T positions. */
size_t cu_embedding_scratch_bytes(const be_limits *lim) {
    size_t n = (size_t)(lim->B > 0 ? lim->B : 0) * (size_t)(lim->T > 0 ? lim->T : 0);
    return n ? emb_plan_for((int)n).total : 0;
}
