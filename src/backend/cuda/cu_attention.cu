/* cu_attention.cu - causal (optionally windowed) multi-head attention on bf16
 * qkv, forward and backward, FlashAttention-2 style: the (T,T) scores are
 * never stored; the forward saves the log-sum-exp of every query row and the
 * backward recomputes the probabilities from it.
 *
 * Semantics are those of backend.h / cpu_attention.c: qkv (B,T,3C) holds
 * [q | k | v], head h at columns h*hs.. of each third, scores are
 * q.k / sqrt(hs), query t sees keys lo(t)..t with lo(t) = max(0, t-W+1)
 * (W > 0) or 0 (W <= 0).
 *
 * Tiles: a block is 4 warps (128 threads) and owns 64 rows (queries in the
 * forward and in the dQ kernel, keys in the dK/dV kernel); each warp owns 16
 * of them and loops over tiles of 64 columns (keys, or queries for dK/dV)
 * staged in shared memory.  Products go through the tensor cores with
 * nvcuda::wmma bf16 m16n16k16 and fp32 accumulators; each warp's 16x64 score
 * tile is stored to shared memory as fp32, where lane pairs own a row (32
 * columns each, in a rotated order that keeps the 32 lanes on distinct
 * banks) for the softmax arithmetic: scale, mask, exp in fp32; probabilities
 * (and dS) are rounded to bf16 only as the wmma input of the next product.
 * The forward keeps its output rows in registers (a lane owns hs/2 columns of
 * its row) so the online-softmax rescale is a per-lane multiply; P.V of each
 * tile comes back through shared memory.  The head size is a template
 * parameter HSP in {32, 64, 128}; any hs <= 128 runs on the smallest HSP >= hs
 * with the extra columns zero-filled in shared memory and never written.
 * Shared memory per block (hs = 64 / 128): forward 53 / 93 KB, dQ 79 / 111
 * KB, dK/dV 79.5 / 111.5 KB (opted in with cudaFuncSetAttribute at every
 * launch), i.e. 4 / 2 forward blocks and 2 / 2 backward blocks per H100 SM.
 * Tiles move global -> shared memory (and output rows shared -> global) in
 * 16-byte chunks of 8 bf16 (one uint4 access), consecutive threads on
 * consecutive chunks of a row, when hs % 8 == 0 and the tensors are 16-byte
 * aligned (checked at every launch, att_vec_ok, which picks the kernels'
 * VEC variant); otherwise (odd hs, unaligned views) one bf16 element per
 * access.  Either way the copies are synchronous (the dialect has no
 * cp.async), so loads overlap the tensor-core work only through the other
 * resident blocks.
 *
 * Skipping: a block loops only over the column tiles its rows can see:
 * forward and dQ from tile lo(q0)/64 to (q1-1)/64 for queries [q0,q1);
 * dK/dV from query tile k0/64 to min(T-1, k1-1+W-1)/64 for keys [k0,k1).
 * Within a tile a warp skips the tile entirely when none of its 16 rows sees
 * any column of it, and restricts its products to the 16-column slices its
 * rows' span touches.  Tiles that every row sees whole skip the per-element
 * mask; partly visible ones mask per element (probability exactly 0).
 * Rows and columns beyond T are zero-filled tiles, masked, and never written.
 *
 * Backward: (1) D = rowsum(dO * O) per query row, fp32, into scratch
 * (B,NH,T); (2) dK/dV, parallel over key tiles: each block recomputes
 * P^T = exp(scale K Q^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D) for every
 * query tile that can see it and accumulates dV += P^T dO, dK += dS^T Q in
 * wmma accumulators, written once as bf16; (3) dQ, parallel over query tiles
 * (FA2's "two kernels" choice): recomputes P and dP per key tile and
 * accumulates dQ += dS K.  The alternative, per-key-tile fp32 dQ partials
 * summed in a fixed order, needs (T/64) x the size of dQ in fp32 scratch
 * (T=1024: 64x a bf16 activation), so we pay instead for recomputing Q K^T and
 * dO V^T in kernel (3): the backward does 7 tile products per (query, key)
 * tile pair instead of 5 (1.4x the flops of the atomic-based FA2 backward).
 *
 * Determinism: no atomics; every output element is owned by one warp of one
 * block, which accumulates over tiles in a fixed loop order, and every
 * reduction (warp shuffles, wmma) has a fixed order, so results are bitwise
 * reproducible run after run.
 *
 * Limits: hs <= 128 (aborts otherwise; hs other than 32/64/128 pays for the
 * padding); the grid is (B*NH, T/64 tiles), so T <= 64 * 65535.
 */
#include "cu_internal.h"
#include "cu_ops.cuh"

using namespace nvcuda;

#define ATT_BQ 64 /* rows per block (queries; keys in the dK/dV kernel) */
#define ATT_BK 64 /* columns per tile (keys; queries in the dK/dV kernel) */
#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_LDS (ATT_BK + 4) /* fp32 score tiles: stride = 4 mod 32 banks */
#define ATT_LDP (ATT_BK + 8) /* bf16 probability tiles */
#define ATT_FULL_MASK 0xffffffffu

/* Full unrolling keeps the per-lane arrays (o[], fragments) in registers;
 * ATT_UNROLL_BY(n) unrolls n times.  g++ (the emulator build) does not know
 * the pragma and warns, so pragmas go through these macros only. */
#ifdef MS_CUDA_EMU
#define ATT_UNROLL
#define ATT_UNROLL_BY(n)
#else
#define ATT_UNROLL _Pragma("unroll")
#define ATT_PRAGMA_(x) _Pragma(#x)
#define ATT_UNROLL_BY(n) ATT_PRAGMA_(unroll n)
#endif

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> att_frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> att_frag_b;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> att_frag_bt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> att_frag_c;

/* Shared-memory geometry for head size HSP (a multiple of 16, <= 128). */
template <int HSP> struct att_geom {
    static constexpr int LDH = HSP + 8; /* bf16 q/k/v/dO tiles */
    static constexpr int LDO = HSP + 4; /* fp32 output staging */
    /* fp32 floats per warp: two 16 x ATT_LDS tiles (S, dP), which also hold
     * the 16 x LDO output staging */
    static constexpr int WBUF = 2 * 16 * ATT_LDS > 16 * LDO ? 2 * 16 * ATT_LDS : 16 * LDO;
    static constexpr size_t TILE = (size_t)ATT_BQ * LDH * sizeof(bf16);
    static constexpr size_t WARPBUF = (size_t)ATT_WARPS * WBUF * sizeof(float);
    static constexpr size_t PBUF = (size_t)ATT_WARPS * 16 * ATT_LDP * sizeof(bf16);
    /* forward: Q, K, V tiles, one fp32 tile per warp (S, then P.V), P */
    static constexpr int FWBUF = 16 * LDO > 16 * ATT_LDS ? 16 * LDO : 16 * ATT_LDS;
    static constexpr size_t FWD = 3 * TILE + (size_t)ATT_WARPS * FWBUF * sizeof(float) + PBUF;
    /* backward kernels: four tiles (K, V, Q, dO), S and dP per warp, one
     * bf16 tile per warp (P or dS); dK/dV also lse and D of ATT_BQ queries */
    static constexpr size_t DQ = 4 * TILE + WARPBUF + PBUF;
    static constexpr size_t DKDV = DQ + 2 * ATT_BQ * sizeof(float);
    static_assert(HSP % 16 == 0 && HSP <= 128, "head size");
    /* Blocks per SM that fit in sm_90's 228 KB of shared memory (1 KB of it
     * reserved per block), at most 4; passed to __launch_bounds__ so that
     * ptxas may use the registers that this occupancy leaves. */
    static constexpr int occ(size_t smem) {
        return 233472 / (smem + 1024) < 4 ? (int)(233472 / (smem + 1024)) : 4;
    }
    static constexpr int FWD_OCC = occ(FWD), DQ_OCC = occ(DQ), DKDV_OCC = occ(DKDV);
    static_assert(ATT_BQ == ATT_BK, "square tiles (lane mapping and staging)");
};

__host__ __device__ static inline int att_imin(int a, int b) {
    return a < b ? a : b;
}
__host__ __device__ static inline int att_imax(int a, int b) {
    return a > b ? a : b;
}

/* First key query t sees (window W > 0; W <= 0 is full causal). */
__host__ __device__ static inline int att_lo(int t, int W) {
    return W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
}

/* Column of a lane's j-th element in a warp tile of width `wid`: lanes 2r
 * and 2r+1 share row r and take the even / odd columns, rotated by 2 for rows
 * 8..15 so that with a row stride of 4 (mod 32) floats the 32 lanes of one
 * access hit 32 distinct banks. */
__device__ static inline int att_col(int j, int rot, int wid) {
    int c = 2 * j + rot;
    return c >= wid ? c - wid : c;
}

/* The 16-byte chunk of bf16 array p (16-byte aligned) that starts at element
 * i (i % 8 == 0).  Addressed in uint4 units: nvcc 13 splits a 16-byte store
 * through (uint4 *)(p + i) into 4-byte stores in these kernels. */
__device__ static inline uint4 *att_chunk(bf16 *p, size_t i) {
    return (uint4 *)p + i / 8;
}
__device__ static inline const uint4 *att_chunk(const bf16 *p, size_t i) {
    return (const uint4 *)p + i / 8;
}

/* Two floats as bf16 (f2bf each) packed in 32 bits, lo at the lower address
 * (little-endian, as sm_90 and the emulator's hosts are). */
__device__ static inline unsigned att_bf16x2(float lo, float hi) {
    unsigned a = __bfloat16_as_ushort(f2bf(lo)), b = __bfloat16_as_ushort(f2bf(hi));
    return a | b << 16;
}

/* dst (ATT_BQ, LDH) bf16 shared = rows 0..nrows-1, columns 0..hs-1 of src
 * (row stride ld); the rest of the tile (rows >= nrows, columns >= hs) is 0.
 * VEC (att_vec_ok held at launch): one 16-byte access per 8 columns,
 * consecutive threads on consecutive chunks of a row, up to 4 loads in
 * flight per thread (unrolling all 8 of HSP = 128 costs the dK/dV kernel
 * its last registers); else one bf16 per access. */
template <int HSP, bool VEC>
__device__ static inline void att_load_tile(bf16 *dst, const bf16 *src, size_t ld, int nrows,
                                            int hs) {
    const int ldh = att_geom<HSP>::LDH;
    if (VEC) {
        const int nch = HSP / 8; /* chunks per tile row */
        static_assert(ATT_BQ * nch % ATT_THREADS == 0, "whole chunk rounds");
        ATT_UNROLL_BY(4)
        for (int k = 0; k < ATT_BQ * nch / ATT_THREADS; k++) {
            int i = threadIdx.x + k * ATT_THREADS, r = i / nch, c = 8 * (i - r * nch);
            *att_chunk(dst, r * ldh + c) = r < nrows && c < hs
                                               ? *att_chunk(src, (size_t)r * ld + c)
                                               : make_uint4(0u, 0u, 0u, 0u); /* bf16 +0 */
        }
    } else {
        const bf16 z = f2bf(0.0f);
        for (int i = threadIdx.x; i < ATT_BQ * HSP; i += ATT_THREADS) {
            int r = i / HSP, c = i - r * HSP;
            dst[r * ldh + c] = r < nrows && c < hs ? src[(size_t)r * ld + c] : z;
        }
    }
}

/* Write a warp's 16 staged rows (fp32, stride LDO) as bf16 to dst (row
 * stride ld): rows 0..nrows-1, columns 0..hs-1; VEC as for att_load_tile
 * (a lane reads 8 staged columns as two float4, 16-byte aligned since LDO %
 * 4 == 0, and stores them as bf16 in one 16-byte access). */
template <int HSP, bool VEC>
__device__ static inline void att_store_rows(bf16 *dst, size_t ld, const float *stage, int nrows,
                                             int hs, int lane) {
    const int ldo = att_geom<HSP>::LDO;
    if (VEC) {
        const int nch = HSP / 8;
        for (int i = lane; i < nrows * nch; i += 32) {
            int rr = i / nch, c = 8 * (i - rr * nch);
            if (c >= hs) continue;
            const float4 *s = (const float4 *)(stage + rr * ldo + c);
            float4 a = s[0], b = s[1];
            *att_chunk(dst, (size_t)rr * ld + c) =
                make_uint4(att_bf16x2(a.x, a.y), att_bf16x2(a.z, a.w), att_bf16x2(b.x, b.y),
                           att_bf16x2(b.z, b.w));
        }
    } else {
        for (int rr = 0; rr < nrows; rr++)
            for (int c = lane; c < hs; c += 32)
                dst[(size_t)rr * ld + c] = f2bf(stage[rr * ldo + c]);
    }
}

/* dst (16, ATT_LDS) fp32 = A (16, HSP) Bt (64, HSP)^T, both bf16 with row
 * stride LDH, for the 16-column slices nlo..nhi of dst (a warp's scores). */
template <int HSP>
__device__ static inline void att_warp_abt(float *dst, const bf16 *A, const bf16 *Bt, int nlo,
                                           int nhi) {
    const int ldh = att_geom<HSP>::LDH;
    ATT_UNROLL
    for (int n = 0; n < ATT_BK / 16; n++) {
        if (n < nlo || n > nhi) continue;
        att_frag_c acc;
        wmma::fill_fragment(acc, 0.0f);
        ATT_UNROLL
        for (int k = 0; k < HSP / 16; k++) {
            att_frag_a af;
            att_frag_bt bf;
            wmma::load_matrix_sync(af, A + 16 * k, ldh);
            wmma::load_matrix_sync(bf, Bt + 16 * n * ldh + 16 * k, ldh);
            wmma::mma_sync(acc, af, bf, acc);
        }
        wmma::store_matrix_sync(dst + 16 * n, acc, ATT_LDS, wmma::mem_row_major);
    }
}

/* acc (16, HSP) += P (16, 64; row stride ATT_LDP) Bm (64, HSP; row stride
 * LDH), over the 16-row slices nlo..nhi of Bm (P is 0 elsewhere). */
template <int HSP>
__device__ static inline void att_warp_pb(att_frag_c (&acc)[HSP / 16], const bf16 *P,
                                          const bf16 *Bm, int nlo, int nhi) {
    const int ldh = att_geom<HSP>::LDH;
    for (int kk = nlo; kk <= nhi; kk++) {
        att_frag_a pf;
        wmma::load_matrix_sync(pf, P + 16 * kk, ATT_LDP);
        ATT_UNROLL
        for (int n = 0; n < HSP / 16; n++) {
            att_frag_b bf;
            wmma::load_matrix_sync(bf, Bm + 16 * kk * ldh + 16 * n, ldh);
            wmma::mma_sync(acc[n], pf, bf, acc[n]);
        }
    }
}

/* dst rows 0..nrows-1 (row stride ld), columns 0..hs-1, bf16 = scale * acc
 * (a warp's 16 x HSP result), staged through the warp's fp32 buffer `stage`
 * (16 x LDO).  acc is scaled in place. */
template <int HSP, bool VEC>
__device__ static inline void att_warp_write(bf16 *dst, size_t ld, att_frag_c (&acc)[HSP / 16],
                                             float scale, float *stage, int nrows, int hs,
                                             int lane) {
    __syncwarp(); /* lanes of this warp may still read stage */
    ATT_UNROLL
    for (int n = 0; n < HSP / 16; n++) {
        for (int i = 0; i < acc[n].num_elements; i++)
            acc[n].x[i] *= scale;
        wmma::store_matrix_sync(stage + 16 * n, acc[n], att_geom<HSP>::LDO, wmma::mem_row_major);
    }
    __syncwarp();
    att_store_rows<HSP, VEC>(dst, ld, stage, nrows, hs, lane);
}

/* ---- forward ---- */

/* out (B,T,C) =, lse (B,NH,T) = from qkv (B,T,3C).  Grid (B*NH, query
 * tiles), the last query tiles (most keys) first. */
template <int HSP, bool VEC>
__global__ void __launch_bounds__(ATT_THREADS, att_geom<HSP>::FWD_OCC)
    att_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int C, int NH, int hs, int W,
                   float scale) {
    typedef att_geom<HSP> G;
    MS_DYN_SMEM(unsigned char, smem);
    bf16 *sQ = (bf16 *)smem, *sK = sQ + ATT_BQ * G::LDH, *sV = sK + ATT_BK * G::LDH;
    float *sBuf = (float *)(sV + ATT_BK * G::LDH);
    bf16 *sP = (bf16 *)(sBuf + ATT_WARPS * G::FWBUF);

    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ATT_BQ, q1 = att_imin(q0 + ATT_BQ, T);
    const size_t ld = 3 * (size_t)C;
    const bf16 *gq = qkv + (size_t)b * T * ld + (size_t)h * hs, *gk = gq + C, *gv = gq + 2 * C;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, rot = (lane & 1) + ((r >> 3) << 1);
    const int w0 = q0 + 16 * warp, t = w0 + r; /* warp's first row, lane's row */
    const int tlo = att_lo(t, W), thi = att_imin(t, T - 1);
    const int wlo = att_lo(w0, W), whi = att_imin(w0 + 15, T - 1); /* union of rows' keys */
    const int flo = att_lo(w0 + 15, W); /* keys >= flo (and <= w0) every row sees */
    float *buf = sBuf + warp * G::FWBUF;
    bf16 *pw = sP + warp * 16 * ATT_LDP;

    att_load_tile<HSP, VEC>(sQ, gq + (size_t)q0 * ld, ld, q1 - q0, hs);
    __syncthreads();
    att_frag_a qf[HSP / 16];
    ATT_UNROLL
    for (int k = 0; k < HSP / 16; k++)
        wmma::load_matrix_sync(qf[k], sQ + 16 * warp * G::LDH + 16 * k, G::LDH);

    float o[HSP / 2];
    ATT_UNROLL
    for (int j = 0; j < HSP / 2; j++)
        o[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    const int kt0 = att_lo(q0, W) / ATT_BK, kt1 = (q1 - 1) / ATT_BK;
    for (int kt = kt0; kt <= kt1; kt++) {
        const int k0 = kt * ATT_BK;
        __syncthreads(); /* every warp is done with the previous K, V */
        att_load_tile<HSP, VEC>(sK, gk + (size_t)k0 * ld, ld, T - k0, hs);
        att_load_tile<HSP, VEC>(sV, gv + (size_t)k0 * ld, ld, T - k0, hs);
        __syncthreads();
        const int lo_c = att_imax(wlo - k0, 0), hi_c = att_imin(whi - k0, ATT_BK - 1);
        if (w0 >= T || lo_c > hi_c) continue; /* warp-uniform: no row sees this tile */
        const int nlo = lo_c >> 4, nhi = hi_c >> 4;
        const bool full = k0 >= flo && k0 + ATT_BK - 1 <= w0; /* (so k0+64 <= T) */

        /* S = Q K^T over the visible 16-key slices */
        ATT_UNROLL
        for (int n = 0; n < ATT_BK / 16; n++) {
            if (n < nlo || n > nhi) continue;
            att_frag_c acc;
            wmma::fill_fragment(acc, 0.0f);
            ATT_UNROLL
            for (int k = 0; k < HSP / 16; k++) {
                att_frag_bt kf;
                wmma::load_matrix_sync(kf, sK + 16 * n * G::LDH + 16 * k, G::LDH);
                wmma::mma_sync(acc, qf[k], kf, acc);
            }
            wmma::store_matrix_sync(buf + 16 * n, acc, ATT_LDS, wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax of row r over this tile; P (bf16) for P.V */
        float s[ATT_BK / 2], mx = -INFINITY;
        ATT_UNROLL
        for (int j = 0; j < ATT_BK / 2; j++) {
            int c = att_col(j, rot, ATT_BK), key = k0 + c;
            bool vis = full || (key >= tlo && key <= thi);
            s[j] = vis ? buf[r * ATT_LDS + c] * scale : -INFINITY;
            mx = fmaxf(mx, s[j]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(ATT_FULL_MASK, mx, 1));
        const float mn = fmaxf(m, mx), mu = mn == -INFINITY ? 0.0f : mn;
        const float alpha = __expf(m - mu);
        float sum = 0.0f;
        ATT_UNROLL
        for (int j = 0; j < ATT_BK / 2; j++) {
            float p = __expf(s[j] - mu);
            sum += p;
            pw[r * ATT_LDP + att_col(j, rot, ATT_BK)] = f2bf(p);
        }
        sum += __shfl_xor_sync(ATT_FULL_MASK, sum, 1);
        l = l * alpha + sum;
        m = mn;
        __syncwarp();

        /* P V into buf (stride LDO), then o = alpha o + P V */
        ATT_UNROLL
        for (int n = 0; n < HSP / 16; n++) {
            att_frag_c acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = nlo; kk <= nhi; kk++) {
                att_frag_a pf;
                att_frag_b vf;
                wmma::load_matrix_sync(pf, pw + 16 * kk, ATT_LDP);
                wmma::load_matrix_sync(vf, sV + 16 * kk * G::LDH + 16 * n, G::LDH);
                wmma::mma_sync(acc, pf, vf, acc);
            }
            wmma::store_matrix_sync(buf + 16 * n, acc, G::LDO, wmma::mem_row_major);
        }
        __syncwarp();
        ATT_UNROLL
        for (int j = 0; j < HSP / 2; j++)
            o[j] = o[j] * alpha + buf[r * G::LDO + att_col(j, rot, HSP)];
    }

    if (w0 >= T) return; /* no barrier follows */
    __syncwarp();        /* buf may still be read by lanes of this warp */
    /* a row whose visible scores are all -inf (q.k overflowed) has l = 0:
     * 0 * inf gives NaN, as the CPU's softmax (it wrote 0, a finite loss);
     * the padding rows (t >= T) are not stored */
    const float inv = t < T ? 1.0f / l : 0.0f;
    ATT_UNROLL
    for (int j = 0; j < HSP / 2; j++)
        buf[r * G::LDO + att_col(j, rot, HSP)] = o[j] * inv;
    if ((lane & 1) == 0 && t < T) lse[(size_t)bh * T + t] = m + logf(l);
    __syncwarp();
    att_store_rows<HSP, VEC>(out + ((size_t)b * T + w0) * C + (size_t)h * hs, C, buf,
                             att_imin(16, T - w0), hs, lane);
}

/* ---- backward ---- */

/* D (B,NH,T) f32 = rowsum(dout * out) per head, one warp per (b,t,h). */
__global__ void att_rowdot_kernel(float *D, const bf16 *dout, const bf16 *out, int B, int T, int NH,
                                  int hs, int C) {
    const size_t g = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (g >= (size_t)B * T * NH) return; /* warp-uniform */
    const int h = (int)(g % NH);
    const size_t bt = g / NH, b = bt / T, t = bt % T;
    const bf16 *x = dout + bt * C + (size_t)h * hs, *y = out + bt * C + (size_t)h * hs;
    float s = 0.0f;
    for (int c = lane; c < hs; c += 32)
        s += bf2f(x[c]) * bf2f(y[c]);
    s = cu_warp_sum(s);
    if (lane == 0) D[(b * NH + h) * T + t] = s;
}

/* dK, dV parts of dqkv (B,T,3C) = from dout (B,T,C), qkv, lse and D
 * (B,NH,T).  Grid (B*NH, key tiles); a block owns 64 keys, a warp 16. */
template <int HSP, bool VEC>
__global__ void __launch_bounds__(ATT_THREADS, att_geom<HSP>::DKDV_OCC)
    att_bwd_dkdv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                        const float *D, int T, int C, int NH, int hs, int W, float scale) {
    typedef att_geom<HSP> G;
    MS_DYN_SMEM(unsigned char, smem);
    bf16 *sK = (bf16 *)smem, *sV = sK + ATT_BK * G::LDH, *sQ = sV + ATT_BK * G::LDH,
         *sdO = sQ + ATT_BQ * G::LDH;
    float *sBuf = (float *)(sdO + ATT_BQ * G::LDH);
    bf16 *sP = (bf16 *)(sBuf + ATT_WARPS * G::WBUF);
    float *sLse = (float *)(sP + ATT_WARPS * 16 * ATT_LDP), *sD = sLse + ATT_BQ;

    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * ATT_BK, k1 = att_imin(k0 + ATT_BK, T);
    const size_t ld = 3 * (size_t)C;
    const bf16 *gq = qkv + (size_t)b * T * ld + (size_t)h * hs;
    const bf16 *gdo = dout + (size_t)b * T * C + (size_t)h * hs;
    const float *glse = lse + (size_t)bh * T, *gD = D + (size_t)bh * T;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, rot = (lane & 1) + ((r >> 3) << 1);
    const int kw0 = k0 + 16 * warp, key = kw0 + r; /* warp's first key, lane's key */
    /* queries that see some key of the warp: kw0 .. qhi */
    const int qhi = W > 0 ? att_imin(kw0 + 15 + W - 1, T - 1) : T - 1;
    float *s1 = sBuf + warp * G::WBUF, *s2 = s1 + 16 * ATT_LDS;
    bf16 *pw = sP + warp * 16 * ATT_LDP; /* P^T, then dS^T */

    att_load_tile<HSP, VEC>(sK, gq + C + (size_t)k0 * ld, ld, k1 - k0, hs);
    att_load_tile<HSP, VEC>(sV, gq + 2 * C + (size_t)k0 * ld, ld, k1 - k0, hs);

    att_frag_c dk[HSP / 16], dv[HSP / 16];
    ATT_UNROLL
    for (int n = 0; n < HSP / 16; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }

    const int qt0 = k0 / ATT_BQ;
    const int qt1 = (W > 0 ? att_imin(k1 - 1 + W - 1, T - 1) : T - 1) / ATT_BQ;
    for (int qt = qt0; qt <= qt1; qt++) {
        const int q0 = qt * ATT_BQ;
        __syncthreads(); /* every warp is done with the previous Q, dO */
        att_load_tile<HSP, VEC>(sQ, gq + (size_t)q0 * ld, ld, T - q0, hs);
        att_load_tile<HSP, VEC>(sdO, gdo + (size_t)q0 * C, C, T - q0, hs);
        for (int i = threadIdx.x; i < ATT_BQ; i += ATT_THREADS) {
            sLse[i] = q0 + i < T ? glse[q0 + i] : 0.0f;
            sD[i] = q0 + i < T ? gD[q0 + i] : 0.0f;
        }
        __syncthreads();
        const int lo_c = att_imax(kw0 - q0, 0), hi_c = att_imin(qhi - q0, ATT_BQ - 1);
        if (kw0 >= T || lo_c > hi_c) continue; /* warp-uniform */
        const int nlo = lo_c >> 4, nhi = hi_c >> 4;
        const bool full =
            q0 >= kw0 + 15 && q0 + ATT_BQ <= T && (W <= 0 || q0 + ATT_BQ - 1 - kw0 < W);

        /* S^T = K Q^T (s1) and dP^T = V dO^T (s2) over the visible slices */
        att_warp_abt<HSP>(s1, sK + 16 * warp * G::LDH, sQ, nlo, nhi);
        att_warp_abt<HSP>(s2, sV + 16 * warp * G::LDH, sdO, nlo, nhi);
        __syncwarp();

        /* P^T = exp(scale S^T - lse): fp32 in place of S^T, bf16 for dV */
        unsigned vis_bits = 0;
        ATT_UNROLL
        for (int j = 0; j < ATT_BQ / 2; j++) {
            int c = att_col(j, rot, ATT_BQ), q = q0 + c;
            bool vis = full || (q >= key && q < T && (W <= 0 || q - key < W));
            float p = vis ? __expf(s1[r * ATT_LDS + c] * scale - sLse[c]) : 0.0f;
            vis_bits |= (unsigned)vis << j;
            s1[r * ATT_LDS + c] = p;
            pw[r * ATT_LDP + c] = f2bf(p);
        }
        __syncwarp();

        /* dV += P^T dO */
        att_warp_pb<HSP>(dv, pw, sdO, nlo, nhi);
        __syncwarp(); /* P^T (bf16) is read; its tile takes dS^T */

        /* dS^T = P^T (dP^T - D) as bf16 (a lane reads only its own P^T) */
        ATT_UNROLL
        for (int j = 0; j < ATT_BQ / 2; j++) {
            int c = att_col(j, rot, ATT_BQ);
            float ds =
                (vis_bits >> j & 1u) ? s1[r * ATT_LDS + c] * (s2[r * ATT_LDS + c] - sD[c]) : 0.0f;
            pw[r * ATT_LDP + c] = f2bf(ds);
        }
        __syncwarp();

        /* dK += dS^T Q (scaled once at the end) */
        att_warp_pb<HSP>(dk, pw, sQ, nlo, nhi);
    }

    if (kw0 >= T) return; /* no barrier follows */
    bf16 *gdk = dqkv + ((size_t)b * T + kw0) * ld + C + (size_t)h * hs;
    att_warp_write<HSP, VEC>(gdk, ld, dk, scale, s1, att_imin(16, T - kw0), hs, lane);
    att_warp_write<HSP, VEC>(gdk + C, ld, dv, 1.0f, s1, att_imin(16, T - kw0), hs, lane);
}

/* dQ part of dqkv (B,T,3C) = from dout, qkv, lse and D.  Grid (B*NH, query
 * tiles); a block owns 64 queries, a warp 16. */
template <int HSP, bool VEC>
__global__ void __launch_bounds__(ATT_THREADS, att_geom<HSP>::DQ_OCC)
    att_bwd_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                      const float *D, int T, int C, int NH, int hs, int W, float scale) {
    typedef att_geom<HSP> G;
    MS_DYN_SMEM(unsigned char, smem);
    bf16 *sQ = (bf16 *)smem, *sdO = sQ + ATT_BQ * G::LDH, *sK = sdO + ATT_BQ * G::LDH,
         *sV = sK + ATT_BK * G::LDH;
    float *sBuf = (float *)(sV + ATT_BK * G::LDH);
    bf16 *sP = (bf16 *)(sBuf + ATT_WARPS * G::WBUF);

    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ATT_BQ, q1 = att_imin(q0 + ATT_BQ, T);
    const size_t ld = 3 * (size_t)C;
    const bf16 *gq = qkv + (size_t)b * T * ld + (size_t)h * hs, *gk = gq + C, *gv = gq + 2 * C;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, rot = (lane & 1) + ((r >> 3) << 1);
    const int w0 = q0 + 16 * warp, t = w0 + r;
    const int tlo = att_lo(t, W), thi = att_imin(t, T - 1);
    const int wlo = att_lo(w0, W), whi = att_imin(w0 + 15, T - 1);
    const int flo = att_lo(w0 + 15, W);
    const float lse_t = t < T ? lse[(size_t)bh * T + t] : 0.0f;
    const float D_t = t < T ? D[(size_t)bh * T + t] : 0.0f;
    float *s1 = sBuf + warp * G::WBUF, *s2 = s1 + 16 * ATT_LDS;
    bf16 *dsw = sP + warp * 16 * ATT_LDP;

    att_load_tile<HSP, VEC>(sQ, gq + (size_t)q0 * ld, ld, q1 - q0, hs);
    att_load_tile<HSP, VEC>(sdO, dout + ((size_t)b * T + q0) * C + (size_t)h * hs, C, q1 - q0, hs);

    att_frag_c dq[HSP / 16];
    ATT_UNROLL
    for (int n = 0; n < HSP / 16; n++)
        wmma::fill_fragment(dq[n], 0.0f);

    const int kt0 = att_lo(q0, W) / ATT_BK, kt1 = (q1 - 1) / ATT_BK;
    for (int kt = kt0; kt <= kt1; kt++) {
        const int k0 = kt * ATT_BK;
        __syncthreads();
        att_load_tile<HSP, VEC>(sK, gk + (size_t)k0 * ld, ld, T - k0, hs);
        att_load_tile<HSP, VEC>(sV, gv + (size_t)k0 * ld, ld, T - k0, hs);
        __syncthreads();
        const int lo_c = att_imax(wlo - k0, 0), hi_c = att_imin(whi - k0, ATT_BK - 1);
        if (w0 >= T || lo_c > hi_c) continue; /* warp-uniform */
        const int nlo = lo_c >> 4, nhi = hi_c >> 4;
        const bool full = k0 >= flo && k0 + ATT_BK - 1 <= w0; /* (so k0+64 <= T) */

        /* S = Q K^T (s1), dP = dO V^T (s2) over the visible slices */
        att_warp_abt<HSP>(s1, sQ + 16 * warp * G::LDH, sK, nlo, nhi);
        att_warp_abt<HSP>(s2, sdO + 16 * warp * G::LDH, sV, nlo, nhi);
        __syncwarp();

        /* dS = P (dP - D) as bf16 */
        ATT_UNROLL
        for (int j = 0; j < ATT_BK / 2; j++) {
            int c = att_col(j, rot, ATT_BK), kj = k0 + c;
            float ds = 0.0f;
            if (full || (kj >= tlo && kj <= thi)) {
                float p = __expf(s1[r * ATT_LDS + c] * scale - lse_t);
                ds = p * (s2[r * ATT_LDS + c] - D_t);
            }
            dsw[r * ATT_LDP + c] = f2bf(ds);
        }
        __syncwarp();

        /* dQ += dS K (scaled once at the end) */
        att_warp_pb<HSP>(dq, dsw, sK, nlo, nhi);
    }

    if (w0 >= T) return; /* no barrier follows */
    att_warp_write<HSP, VEC>(dqkv + ((size_t)b * T + w0) * ld + (size_t)h * hs, ld, dq, scale, s1,
                             att_imin(16, T - w0), hs, lane);
}

/* ---- launchers ---- */

/* Opt a kernel in to `bytes` of dynamic shared memory (above 48 KB needs
 * it); cheap enough to do at every launch. */
template <typename K> static void att_smem_attr(K *kernel, size_t bytes) {
    CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* hs = C/NH, checked to be a supported head size. */
static int att_head_size(int C, int NH) {
    MS_CHECKF(NH > 0 && C % NH == 0, "attention: C=%d not divisible by NH=%d", C, NH);
    int hs = C / NH;
    MS_CHECKF(hs >= 1 && hs <= CU_MAX_HEAD_SIZE,
              "attention: head size %d unsupported (CUDA: 1..%d)", hs, CU_MAX_HEAD_SIZE);
    return hs;
}

/* Whether the tiles of a head can move as 16-byte chunks: hs % 8 == 0 (so C =
 * NH hs and the row strides C and 3C are multiples of 8 elements too) and
 * every tensor p[0..n-1] starts 16-byte aligned; then every row of every
 * head slice starts 16-byte aligned.  Otherwise (odd hs, unaligned views)
 * the kernels copy element by element. */
static bool att_vec_ok(int hs, const void *const *p, int n) {
    bool ok = hs % 8 == 0;
    for (int i = 0; i < n; i++)
        ok = ok && cu_al16(p[i]);
    return ok;
}

size_t cu_attention_state_bytes(be_backend *be, int B, int T, int NH) {
    (void)be;
    return (size_t)B * NH * T * sizeof(float);
}

size_t cu_attention_scratch_bytes(const be_limits *lim) {
    return (size_t)lim->B * lim->NH * lim->T * sizeof(float); /* D */
}

/* The launchers take the kernel variant: HSP (head size padded) and VEC
 * (16-byte copies); MS_LAUNCH gets the kernel name in parentheses for the
 * comma in its template arguments. */
template <int HSP, bool VEC>
static void att_fwd_launch(cudaStream_t st, bf16 *out, float *lse, const bf16 *qkv, int B, int T,
                           int C, int NH, int hs, int W) {
    size_t smem = att_geom<HSP>::FWD;
    float scale = 1.0f / sqrtf((float)hs);
    att_smem_attr(att_fwd_kernel<HSP, VEC>, smem);
    MS_LAUNCH((att_fwd_kernel<HSP, VEC>), dim3(B * NH, cu_div_up(T, ATT_BQ)), ATT_THREADS, smem, st,
              out, lse, qkv, T, C, NH, hs, W, scale);
    CU_CHECK_LAUNCH();
}

template <int HSP, bool VEC>
static void att_bwd_launch(cudaStream_t st, bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                           const float *lse, const float *D, int B, int T, int C, int NH, int hs,
                           int W) {
    size_t smem = att_geom<HSP>::DKDV;
    float scale = 1.0f / sqrtf((float)hs);
    att_smem_attr(att_bwd_dkdv_kernel<HSP, VEC>, smem);
    MS_LAUNCH((att_bwd_dkdv_kernel<HSP, VEC>), dim3(B * NH, cu_div_up(T, ATT_BK)), ATT_THREADS,
              smem, st, dqkv, dout, qkv, lse, D, T, C, NH, hs, W, scale);
    CU_CHECK_LAUNCH();
    smem = att_geom<HSP>::DQ;
    att_smem_attr(att_bwd_dq_kernel<HSP, VEC>, smem);
    MS_LAUNCH((att_bwd_dq_kernel<HSP, VEC>), dim3(B * NH, cu_div_up(T, ATT_BQ)), ATT_THREADS, smem,
              st, dqkv, dout, qkv, lse, D, T, C, NH, hs, W, scale);
    CU_CHECK_LAUNCH();
}

/* att_fwd_launch / att_bwd_launch with VEC = vec. */
template <int HSP, typename... A> static void att_fwd_pick(bool vec, A... a) {
    if (vec)
        att_fwd_launch<HSP, true>(a...);
    else
        att_fwd_launch<HSP, false>(a...);
}
template <int HSP, typename... A> static void att_bwd_pick(bool vec, A... a) {
    if (vec)
        att_bwd_launch<HSP, true>(a...);
    else
        att_bwd_launch<HSP, false>(a...);
}

void cu_attention_fwd(be_backend *be, void *out, void *state, const void *qkv, int B, int T, int C,
                      int NH, int W) {
    int hs = att_head_size(C, NH);
    if (B <= 0 || T <= 0) return;
    if (W >= T) W = 0; /* a window of T or more keys is full causal */
    cudaStream_t st = cu_of(be)->stream;
    bf16 *o = (bf16 *)out;
    float *lse = (float *)state;
    const bf16 *x = (const bf16 *)qkv;
    const void *ptrs[] = {out, qkv};
    bool vec = att_vec_ok(hs, ptrs, 2);
    if (hs <= 32)
        att_fwd_pick<32>(vec, st, o, lse, x, B, T, C, NH, hs, W);
    else if (hs <= 64)
        att_fwd_pick<64>(vec, st, o, lse, x, B, T, C, NH, hs, W);
    else
        att_fwd_pick<128>(vec, st, o, lse, x, B, T, C, NH, hs, W);
}

void cu_attention_bwd(be_backend *be, void *dqkv, const void *dout, const void *out,
                      const void *qkv, const void *state, int B, int T, int C, int NH, int W) {
    cu_ctx *cx = cu_of(be);
    int hs = att_head_size(C, NH);
    if (B <= 0 || T <= 0) return;
    if (W >= T) W = 0;
    size_t need = (size_t)B * NH * T * sizeof(float);
    MS_CHECKF(cx->scratch && cx->scratch_bytes >= need,
              "attention_bwd: scratch %zu < %zu bytes for B=%d T=%d NH=%d (call reserve)",
              cx->scratch_bytes, need, B, T, NH);
    float *D = (float *)cx->scratch;
    const bf16 *dy = (const bf16 *)dout, *y = (const bf16 *)out, *x = (const bf16 *)qkv;
    const float *lse = (const float *)state;
    bf16 *dx = (bf16 *)dqkv;

    size_t rows = (size_t)B * T * NH; /* one warp each, 8 per block */
    MS_LAUNCH(att_rowdot_kernel, cu_div_up(rows, 8), 256, 0, cx->stream, D, dy, y, B, T, NH, hs, C);
    CU_CHECK_LAUNCH();
    const void *ptrs[] = {dqkv, dout, qkv}; /* (out is read by att_rowdot_kernel only) */
    bool vec = att_vec_ok(hs, ptrs, 3);
    if (hs <= 32)
        att_bwd_pick<32>(vec, cx->stream, dx, dy, x, lse, D, B, T, C, NH, hs, W);
    else if (hs <= 64)
        att_bwd_pick<64>(vec, cx->stream, dx, dy, x, lse, D, B, T, C, NH, hs, W);
    else
        att_bwd_pick<128>(vec, cx->stream, dx, dy, x, lse, D, B, T, C, NH, hs, W);
}
