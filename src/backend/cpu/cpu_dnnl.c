/* cpu_dnnl.c - bf16 GEMMs for the CPU backend's bf16 mode (--cpu-dtype bf16),
 * through oneDNN's matmul (Debian's libdnnl, built with the same libgomp as
 * OpenBLAS, so both follow the backend's OpenMP thread count).
 *
 * Debian's OpenBLAS is built without bf16 (no sbgemm), and oneDNN's
 * kernels use AVX512-BF16's dot products: on a 2-core AMD Zen 5 they run
 * d12's layer shapes at 580-700 GFLOP/s against OpenBLAS sgemm's 290-350
 * (docs/perf.md): brgemm for the forward and dX GEMMs, gemm:jit for the
 * weight gradients (pick_gemm_jit).
 *
 * A matmul primitive is built once per shape (M, N, K, strides, output
 * dtype, bias, alpha, beta) and kept in a small cache; each call only sets
 * the data pointers.  Without oneDNN at build time (MS_HAVE_DNNL unset)
 * cpu_dnnl_available() says so and the bf16 mode is refused at creation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

#ifdef MS_HAVE_DNNL

#include <oneapi/dnnl/dnnl.h>

/* Distinct GEMM shapes of a step: ~8 per layer kind, the classifier's 3,
 * the chunked tensor-parallel ones; replaced round-robin past this. */
#define DNNL_CACHE 64

typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc, c_f32, has_bias;
    float alpha, beta;
} mm_key;

typedef struct {
    mm_key key;
    int used;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bias;
} mm_entry;

struct cpu_dnnl {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    mm_entry e[DNNL_CACHE];
    int next;
};

static void dn_check(dnnl_status_t s, const char *what) {
    MS_CHECKF(s == dnnl_success, "cpu bf16 gemm: oneDNN %s failed (status %d)", what, (int)s);
}

ms_status cpu_dnnl_create(cpu_dnnl **out) {
    *out = NULL;
    cpu_dnnl *d = calloc(1, sizeof *d);
    if (!d) return ms_error(MS_ERR_NOMEM, "cpu backend: out of memory creating the oneDNN context");
    if (dnnl_engine_create(&d->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&d->st, d->eng, dnnl_stream_default_flags) != dnnl_success) {
        if (d->eng) dnnl_engine_destroy(d->eng);
        free(d);
        return ms_error(MS_ERR_INTERNAL, "cpu backend: oneDNN could not create its CPU engine");
    }
    *out = d;
    return MS_OK;
}

static void entry_free(mm_entry *e) {
    if (!e->used) return;
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->a);
    dnnl_memory_destroy(e->b);
    dnnl_memory_destroy(e->c);
    if (e->bias) dnnl_memory_destroy(e->bias);
    memset(e, 0, sizeof *e);
}

void cpu_dnnl_free(cpu_dnnl *d) {
    if (!d) return;
    for (int i = 0; i < DNNL_CACHE; i++)
        entry_free(&d->e[i]);
    dnnl_stream_destroy(d->st);
    dnnl_engine_destroy(d->eng);
    free(d);
}

/* A 2-D descriptor of rows x cols with the given strides (elements). */
static dnnl_memory_desc_t md2(int rows, int cols, dnnl_data_type_t dt, dnnl_dim_t s0,
                              dnnl_dim_t s1) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {rows, cols}, strides = {s0, s1};
    dn_check(dnnl_memory_desc_init_by_strides(&md, 2, dims, dt, strides), "memory descriptor");
    return md;
}

/* The weight gradients (A transposed, fp32 C += ...): oneDNN 2.6 picks its
 * brgemm kernels, which run them at 400-460 GFLOP/s on d12's shapes and the
 * classifier's dwte at 290; its gemm:jit kernels run the same at 510-610
 * (docs/perf.md).  The first "gemm:" implementation the iterator offers, or
 * NULL for oneDNN's own first choice.  Chosen by this fixed rule, never by
 * timing, so a shape gets the same kernel, hence the same bits, every run. */
static dnnl_primitive_desc_t pick_gemm_jit(cpu_dnnl *d, const dnnl_matmul_desc_t *desc,
                                           const_dnnl_primitive_attr_t attr) {
    dnnl_primitive_desc_iterator_t it;
    if (dnnl_primitive_desc_iterator_create(&it, desc, attr, d->eng, NULL) != dnnl_success)
        return NULL;
    dnnl_primitive_desc_t found = NULL;
    do {
        dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
        const char *impl = NULL;
        if (!pd) break;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl && !strncmp(impl, "gemm:", 5)) {
            found = pd;
            break;
        }
        dnnl_primitive_desc_destroy(pd);
    } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    dnnl_primitive_desc_iterator_destroy(it);
    return found;
}

static void entry_build(cpu_dnnl *d, mm_entry *e, const mm_key *k) {
    dnnl_memory_desc_t a =
        k->ta ? md2(k->M, k->K, dnnl_bf16, 1, k->lda) : md2(k->M, k->K, dnnl_bf16, k->lda, 1);
    dnnl_memory_desc_t b =
        k->tb ? md2(k->K, k->N, dnnl_bf16, 1, k->ldb) : md2(k->K, k->N, dnnl_bf16, k->ldb, 1);
    dnnl_memory_desc_t c = md2(k->M, k->N, k->c_f32 ? dnnl_f32 : dnnl_bf16, k->ldc, 1);
    dnnl_memory_desc_t bias = md2(1, k->N, dnnl_bf16, k->N, 1);
    dnnl_matmul_desc_t desc;
    dn_check(dnnl_matmul_desc_init(&desc, &a, &b, k->has_bias ? &bias : NULL, &c), "matmul desc");
    dnnl_primitive_attr_t attr;
    dn_check(dnnl_primitive_attr_create(&attr), "attr");
    if (k->alpha != 1.0f)
        dn_check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha), "output scale");
    if (k->beta != 0.0f) {
        dnnl_post_ops_t po;
        dn_check(dnnl_post_ops_create(&po), "post-ops");
        dn_check(dnnl_post_ops_append_sum(po, k->beta), "sum post-op");
        dn_check(dnnl_primitive_attr_set_post_ops(attr, po), "post-ops");
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd = k->ta ? pick_gemm_jit(d, &desc, attr) : NULL;
    if (!pd) dn_check(dnnl_primitive_desc_create(&pd, &desc, attr, d->eng, NULL), "matmul");
    dnnl_primitive_attr_destroy(attr);
    dn_check(dnnl_primitive_create(&e->prim, pd), "matmul primitive");
    dnnl_primitive_desc_destroy(pd);
    dn_check(dnnl_memory_create(&e->a, &a, d->eng, DNNL_MEMORY_NONE), "memory");
    dn_check(dnnl_memory_create(&e->b, &b, d->eng, DNNL_MEMORY_NONE), "memory");
    dn_check(dnnl_memory_create(&e->c, &c, d->eng, DNNL_MEMORY_NONE), "memory");
    if (k->has_bias)
        dn_check(dnnl_memory_create(&e->bias, &bias, d->eng, DNNL_MEMORY_NONE), "memory");
    e->key = *k;
    e->used = 1;
}

void cpu_dnnl_gemm(cpu_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                   int lda, const uint16_t *B, int ldb, float beta, void *C, int ldc, int c_f32,
                   const uint16_t *bias) {
    mm_key k;
    memset(&k, 0, sizeof k); /* the key is compared bytewise */
    k.ta = ta, k.tb = tb, k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    k.c_f32 = c_f32, k.has_bias = bias != NULL, k.alpha = alpha, k.beta = beta;
    mm_entry *e = NULL;
    for (int i = 0; i < DNNL_CACHE && !e; i++)
        if (d->e[i].used && !memcmp(&d->e[i].key, &k, sizeof k)) e = &d->e[i];
    if (!e) {
        e = &d->e[d->next];
        d->next = (d->next + 1) % DNNL_CACHE;
        entry_free(e);
        entry_build(d, e, &k);
    }
    dn_check(dnnl_memory_set_data_handle(e->a, (void *)A), "set handle");
    dn_check(dnnl_memory_set_data_handle(e->b, (void *)B), "set handle");
    dn_check(dnnl_memory_set_data_handle(e->c, C), "set handle");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a},
                               {DNNL_ARG_WEIGHTS, e->b},
                               {DNNL_ARG_DST, e->c},
                               {DNNL_ARG_BIAS, e->bias}};
    if (bias) dn_check(dnnl_memory_set_data_handle(e->bias, (void *)bias), "set handle");
    dn_check(dnnl_primitive_execute(e->prim, d->st, bias ? 4 : 3, args), "matmul");
    dn_check(dnnl_stream_wait(d->st), "stream wait");
}

const char *cpu_dnnl_available(void) {
    return NULL;
}

#else /* no oneDNN at build time */

ms_status cpu_dnnl_create(cpu_dnnl **out) {
    *out = NULL;
    return ms_error(MS_ERR_NOTFOUND, "%s", cpu_dnnl_available());
}

void cpu_dnnl_free(cpu_dnnl *d) {
    (void)d;
}

void cpu_dnnl_gemm(cpu_dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                   int lda, const uint16_t *B, int ldb, float beta, void *C, int ldc, int c_f32,
                   const uint16_t *bias) {
    MS_CHECKF(0, "cpu bf16 gemm: this program was built without oneDNN");
}

const char *cpu_dnnl_available(void) {
    return "this program was built without oneDNN (install Debian's libdnnl-dev, which "
           "scripts/install-deps.sh does, and rebuild)";
}

#endif
