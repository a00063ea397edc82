/* cu_gemm.cu - the backend's GEMM on cuBLASLt: bf16 inputs, fp32 compute,
 * bf16 or fp32 output, with the bias and GELU(+aux) epilogues fused.
 *
 * Row-major to cuBLASLt's column-major: a row-major (r,c) matrix with row
 * stride ld is the column-major (c,r) matrix with the same ld.  So the
 * row-major C (M,N) = op(A) op(B) is computed as the column-major
 * C^T (N,M) = op(B)^T op(A)^T, i.e. cuBLASLt's "A" is our B and its "B" is
 * our A, with the transposes carried over unchanged.  Our bias (N), broadcast
 * over the rows of C, is then cuBLASLt's bias over the rows of D^T (N
 * entries): exactly its BIAS epilogue.  GELU_AUX_BIAS writes the pre-GELU
 * values to the aux matrix, which is our `pre` (M,N) with row stride N.
 *
 * With --cuda-fuse-gelu 0 the GeLU GEMM is a bias-epilogue GEMM into pre
 * followed by our GeLU kernel (cuBLASLt's bf16 GELU_AUX epilogue has been
 * seen to be slower than a separate kernel in some versions: llm.c #338;
 * bench/gpu_step.sh measures both).
 *
 * Descriptors and the heuristic's algorithm are cached per shape (the
 * heuristic query costs tens of microseconds of host time; a step runs a few
 * hundred GEMMs of a dozen shapes) in the context.  Pointers are set per
 * call (cuBLASLt reads descriptors when the call is enqueued).  The cache
 * key includes the 16-byte alignment of every pointer, since an algorithm
 * chosen for aligned pointers may not accept unaligned ones.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_internal.h"

#define CU_GEMM_CACHE 64

typedef struct {
    int key[14];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int used;
} cu_gemm_entry;

typedef struct {
    cu_gemm_entry e[CU_GEMM_CACHE];
    int next; /* round-robin eviction */
} cu_gemm_cache;

static cu_gemm_cache *cache_of(cu_ctx *c, int create) {
    if (!c->gemm_cache && create) {
        c->gemm_cache = calloc(1, sizeof(cu_gemm_cache));
        if (!c->gemm_cache) cu_fatal(__FILE__, __LINE__, "calloc", "out of host memory");
    }
    return (cu_gemm_cache *)c->gemm_cache;
}

static void entry_free(cu_gemm_entry *e) {
    if (!e->used) return;
    cu_lt.MatmulDescDestroy(e->desc);
    cu_lt.MatrixLayoutDestroy(e->la);
    cu_lt.MatrixLayoutDestroy(e->lb);
    cu_lt.MatrixLayoutDestroy(e->lc);
    e->used = 0;
}

void cu_gemm_cache_free(cu_ctx *c) {
    cu_gemm_cache *k = cache_of(c, 0);
    if (!k) return;
    for (int i = 0; i < CU_GEMM_CACHE; i++)
        entry_free(&k->e[i]);
    free(k);
    c->gemm_cache = NULL;
}

#define LT_CHECK(call)                                                                             \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            cu_fatal(__FILE__, __LINE__, #call, cu_lt.GetStatusString(s_));                        \
    } while (0)

static int aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

/* Build descriptors for one shape and ask the heuristic for an algorithm.
 * Shapes here are cuBLASLt's (column-major) view: D (m,n) = opA(Amem) opB(Bmem). */
static void entry_build(cu_ctx *c, cu_gemm_entry *e, const int *key, int transa, int transb, int m,
                        int n, int k, int lda, int ldb, int ldc, int c_f32, int epi, int has_bias,
                        int align_all) {
    cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t dt = c_f32 ? CUDA_R_32F : CUDA_R_16BF, bt = CUDA_R_16BF;
    LT_CHECK(cu_lt.MatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cu_lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cu_lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
    if (epi == BE_EPI_GELU)
        ep = has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (has_bias)
        ep = CUBLASLT_EPILOGUE_BIAS;
    LT_CHECK(cu_lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    if (has_bias)
        LT_CHECK(cu_lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                              sizeof bt));
    if (epi == BE_EPI_GELU) {
        int64_t ld = m; /* pre (M,N) row-major dense = column-major (N,M), ld N = m */
        LT_CHECK(cu_lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                              sizeof ld));
    }
    /* memory shapes (column-major rows x cols) of cuBLASLt's A, B and C/D */
    LT_CHECK(cu_lt.MatrixLayoutCreate(&e->la, CUDA_R_16BF, transa ? k : m, transa ? m : k, ldb));
    LT_CHECK(cu_lt.MatrixLayoutCreate(&e->lb, CUDA_R_16BF, transb ? n : k, transb ? k : n, lda));
    LT_CHECK(cu_lt.MatrixLayoutCreate(&e->lc, dt, m, n, ldc));

    cublasLtMatmulPreference_t pref;
    LT_CHECK(cu_lt.MatmulPreferenceCreate(&pref));
    size_t ws = c->lt_ws_bytes;
    LT_CHECK(cu_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws));
    uint32_t al = align_all ? 16 : 2;
    LT_CHECK(cu_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &al, sizeof al));
    LT_CHECK(cu_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &al, sizeof al));
    LT_CHECK(cu_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &al, sizeof al));
    LT_CHECK(cu_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t s = cu_lt.MatmulAlgoGetHeuristic(c->lt, e->desc, e->la, e->lb, e->lc, e->lc,
                                                    pref, 1, &res, &found);
    cu_lt.MatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "no cuBLASLt algorithm for m=%d n=%d k=%d transa=%d transb=%d lda=%d ldb=%d "
                 "ldc=%d out=%s epilogue=%d bias=%d aligned=%d (%s)",
                 m, n, k, transa, transb, lda, ldb, ldc, c_f32 ? "f32" : "bf16", epi, has_bias,
                 align_all, cu_lt.GetStatusString(s));
        cu_fatal(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", msg);
    }
    e->algo = res.algo;
    memcpy(e->key, key, sizeof e->key);
    e->used = 1;
}

void cu_gemm(be_backend *be, int ta, int tb, int M, int N, int K, float alpha, const void *A,
             int lda, const void *Bm, int ldb, float beta, void *C, int ldc, int c_f32,
             const void *bias, be_epilogue epi, void *pre) {
    cu_ctx *c = cu_of(be);
    if (M <= 0 || N <= 0) return;
    MS_CHECKF(K > 0, "gemm: K=%d", K);
    MS_CHECKF(epi != BE_EPI_GELU || (pre != NULL && beta == 0.0f && !c_f32),
              "gemm: the GELU epilogue needs pre, beta 0 and a bf16 output");
    MS_CHECKF(!(bias && c_f32), "gemm: bias with an f32 output is not supported");
    /* pre = GEMM + bias, then C = gelu(pre): when fusing is off, and where
     * cuBLASLt cannot fuse: the aux (pre) leading dimension, N, must be a
     * multiple of 8 (cublasLt.h, EPILOGUE_AUX_LD) and its pointer aligned
     * (n_embd 33: N 132, no algorithm, an abort at the first MLP) */
    if (epi == BE_EPI_GELU && (!c->fuse_gelu || N % 8 != 0 || !aligned16(pre))) {
        cu_gemm(be, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, 0.0f, pre, N, 0, bias, BE_EPI_NONE,
                NULL);
        MS_CHECKF(ldc == N, "gemm: unfused GeLU needs a dense output (ldc %d, N %d)", ldc, N);
        cu_gelu_fwd(be, C, pre, (size_t)M * N);
        return;
    }
    int align_all = aligned16(A) && aligned16(Bm) && aligned16(C) && (!pre || aligned16(pre)) &&
                    (!bias || aligned16(bias)) && lda % 8 == 0 && ldb % 8 == 0 &&
                    ldc % (c_f32 ? 4 : 8) == 0;
    /* cuBLASLt view: D (m=N, n=M) = op(our B) op(our A) */
    int m = N, n = M, k = K, transa = tb, transb = ta;
    int key[14] = {transa, transb, m, n, k, lda, ldb, ldc, c_f32, (int)epi, bias != NULL,
                   align_all, 0, 0};
    cu_gemm_cache *kc = cache_of(c, 1);
    cu_gemm_entry *e = NULL;
    for (int i = 0; i < CU_GEMM_CACHE; i++)
        if (kc->e[i].used && memcmp(kc->e[i].key, key, sizeof key) == 0) {
            e = &kc->e[i];
            break;
        }
    if (!e) {
        e = &kc->e[kc->next];
        kc->next = (kc->next + 1) % CU_GEMM_CACHE;
        if (e->used) {
            CU_CHECK(cudaStreamSynchronize(c->stream)); /* its descriptors may be in flight */
            entry_free(e);
        }
        entry_build(c, e, key, transa, transb, m, n, k, lda, ldb, ldc, c_f32, (int)epi,
                    bias != NULL, align_all);
    }
    if (bias)
        LT_CHECK(cu_lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias));
    if (epi == BE_EPI_GELU)
        LT_CHECK(cu_lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &pre, sizeof pre));
    LT_CHECK(cu_lt.Matmul(c->lt, e->desc, &alpha, Bm, e->la, A, e->lb, &beta, C, e->lc, C, e->lc,
                          &e->algo, c->lt_ws, c->lt_ws_bytes, c->stream));
}
