/* cpu_backend.c - the CPU backend object: host memory standing in for device
 * memory, scratch sizing (reserve), creation and the op table.
 *
 * Device memory is host memory: 64-byte aligned, zeroed (ms_alloc_aligned).
 * The scratch the ops use is owned by the context and only (re)allocated by
 * cpu_reserve(), which grows and never shrinks.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "backend/cpu/cpu_internal.h"
#include "base/arena.h"
#include "base/events.h"
#include "base/timeutil.h"

/* `add` bytes more and `sub` fewer held; the peak follows. */
static void cpu_account(cpu_ctx *c, size_t add, size_t sub) {
    c->bytes = c->bytes + add - sub;
    if (c->bytes > c->peak) c->peak = c->bytes;
}

/* Host memory standing in for device memory, counted like the CUDA backend's
 * (cpu_mem_peak).  A block the table cannot record (out of host memory for
 * it) is still returned, uncounted. */
static void *cpu_alloc(be_backend *be, size_t bytes) {
    cpu_ctx *c = cpu_ctx_of(be);
    void *p = ms_alloc_aligned(bytes);
    if (!p) return NULL;
    if (c->n_blocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 64;
        struct cpu_block *b = realloc(c->blocks, sizeof *b * (size_t)cap);
        if (!b) return p;
        c->blocks = b;
        c->cap_blocks = cap;
    }
    c->blocks[c->n_blocks].p = p;
    c->blocks[c->n_blocks++].n = bytes;
    cpu_account(c, bytes, 0);
    return p;
}

static void cpu_free(be_backend *be, void *p) {
    cpu_ctx *c = cpu_ctx_of(be);
    for (int i = c->n_blocks - 1; p && i >= 0; i--)
        if (c->blocks[i].p == p) {
            cpu_account(c, 0, c->blocks[i].n);
            c->blocks[i] = c->blocks[--c->n_blocks];
            break;
        }
    ms_free_aligned(p);
}

static void cpu_memcpy(be_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}

/* Below this many bytes one thread zeroes (an OpenMP region costs more). */
#define CPU_ZERO_PARALLEL ((size_t)4 << 20)

/* Zeroing the gradients is a step's largest memset (498 MB on GPT-2 124M):
 * glibc's memset is one thread, and one core's stores do not reach the
 * memory's write rate, so each thread zeroes its own slice of cache lines. */
static void cpu_zero(be_backend *be, void *p, size_t bytes) {
    if (bytes < CPU_ZERO_PARALLEL) {
        if (bytes) memset(p, 0, bytes);
        return;
    }
#pragma omp parallel num_threads(cpu_ctx_of(be)->threads)
    {
        size_t lo, hi, lines = (bytes + 63) / 64;
        cpu_split(lines, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
        lo *= 64, hi *= 64;
        if (hi > bytes) hi = bytes;
        if (hi > lo) memset((char *)p + lo, 0, hi - lo);
    }
}

static void cpu_sync(be_backend *be) {}

static void cpu_to_act(be_backend *be, void *dst, const float *src, size_t n) {
    if (n && dst != src) memmove(dst, src, n * sizeof(float));
}

static int cpu_is_device(be_backend *be, const void *p) {
    return 0;
}

static void *cpu_host_alloc(be_backend *be, size_t bytes) {
    return ms_alloc_aligned(bytes);
}

static void cpu_host_free(be_backend *be, void *p) {
    ms_free_aligned(p);
}

/* Ops run synchronously here, so a timestamp is the host clock now. */
static int cpu_ev_record(be_backend *be) {
    cpu_ctx *c = cpu_ctx_of(be);
    if (!c->ev_nfree) return -1;
    int h = c->ev_free[--c->ev_nfree];
    c->ev_t[h] = ms_ev_now();
    return h;
}

static int cpu_ev_poll(be_backend *be, int h, int64_t *t_ns) {
    cpu_ctx *c = cpu_ctx_of(be);
    MS_CHECKF(h >= 0 && h < CPU_EV_POOL && c->ev_nfree < CPU_EV_POOL,
              "device timer handle %d (given back twice?)", h);
    *t_ns = c->ev_t[h];
    c->ev_free[c->ev_nfree++] = h;
    return 1;
}

static void cpu_ev_anchor(be_backend *be) {
    (void)be; /* one clock */
}

static double cpu_mem_peak(be_backend *be) {
    return (double)cpu_ctx_of(be)->peak;
}

void cpu_blas_threads(const cpu_ctx *c) {
    if (omp_get_max_threads() != c->threads) omp_set_num_threads(c->threads);
}

void cpu_set_sgemm_caches(be_backend *be, size_t l1_bytes, size_t block_floats) {
    cpu_sgemm_scratch *s = &cpu_ctx_of(be)->sg;
    size_t panel = (size_t)CPU_SGEMM_NR_MAX * CPU_SGEMM_KC;
    s->l1_bytes = l1_bytes ? l1_bytes : s->l1_sys;
    s->b_block = block_floats ? block_floats : s->b_block_max;
    if (s->b_block > s->b_block_max) s->b_block = s->b_block_max;
    if (s->b_block < panel) s->b_block = panel;
}

void cpu_set_cls_chunk_rows(be_backend *be, int rows) {
    cpu_ctx_of(be)->cls_max_rows = rows;
}

static size_t cpu_round_line(size_t floats) {
    return (floats + CPU_LINE_FLOATS - 1) / CPU_LINE_FLOATS * CPU_LINE_FLOATS;
}

/* Replace *buf by a zeroed buffer of `floats` floats if it holds fewer. */
static ms_status cpu_grow(float **buf, size_t *have, size_t floats, const char *what) {
    if (floats <= *have) return MS_OK;
    float *p = ms_alloc_aligned(floats * sizeof(float));
    if (!p)
        return ms_error(MS_ERR_NOMEM, "cpu backend: cannot allocate %zu MB of %s scratch",
                        floats * sizeof(float) >> 20, what);
    ms_free_aligned(*buf);
    *buf = p;
    *have = floats;
    return MS_OK;
}

/* The bf16 mode's scratch: three fp32 copies of act tensors (B*T*4C each:
 * the widest is the MLP's), a layer norm's weights, the classifier
 * chunk's bf16 dlogits. */
static ms_status cpu16_reserve(cpu_ctx *c, const be_limits *lim) {
    size_t x = (size_t)lim->B * (size_t)lim->T * 4 * (size_t)lim->C;
    if (x > c->x_floats) {
        for (int k = 0; k < 3; k++) {
            size_t have = c->x_floats;
            MS_TRY(cpu_grow(&c->x[k], &have, x, "bf16 conversion"));
        }
        c->x_floats = x;
    }
    if (lim->C > c->wb_C) {
        MS_TRY(cpu_grow(&c->wb, &c->wb_have, 2 * (size_t)lim->C, "bf16 layernorm"));
        c->wb_C = lim->C;
    }
    if (c->cls_floats > c->cls16_n) {
        uint16_t *p = ms_alloc_aligned(c->cls_floats * sizeof(uint16_t));
        if (!p)
            return ms_error(MS_ERR_NOMEM,
                            "cpu backend: cannot allocate %zu MB of bf16 classifier "
                            "scratch",
                            c->cls_floats * sizeof(uint16_t) >> 20);
        ms_free_aligned(c->cls16);
        c->cls16 = p;
        c->cls16_n = c->cls_floats;
    }
    return MS_OK;
}

/* Size scratch for lim: layernorm partials (2C per thread), attention dS
 * blocks (CPU_ATT_BLOCK x T per thread), the classifier logits chunk
 * (B*T rows of Vp in the fewest equal chunks of at most
 * CPU_CLS_CHUNK_FLOATS). */
static ms_status cpu_reserve(be_backend *be, const be_limits *lim) {
    cpu_ctx *c = cpu_ctx_of(be);
    size_t nt = (size_t)c->threads;
    if (lim->B < 0 || lim->T < 0 || lim->C < 0 || lim->NH < 0 || lim->Vp < 0)
        return ms_error(MS_ERR_ARG, "cpu backend: negative limits B=%d T=%d C=%d NH=%d Vp=%d",
                        lim->B, lim->T, lim->C, lim->NH, lim->Vp);
    if (lim->C > c->part_C) {
        size_t stride = cpu_round_line(2 * (size_t)lim->C), have = c->part_stride * nt;
        MS_TRY(cpu_grow(&c->part, &have, stride * nt, "layernorm"));
        c->part_stride = stride;
        c->part_C = lim->C;
    }
    if (lim->T > c->att_T) {
        size_t stride = cpu_round_line((size_t)CPU_ATT_BLOCK * (size_t)lim->T);
        size_t have = c->att_stride * nt;
        MS_TRY(cpu_grow(&c->att, &have, stride * nt, "attention"));
        c->att_stride = stride;
        c->att_T = lim->T;
    }
    if (lim->Vp > 0 && lim->B > 0 && lim->T > 0) {
        size_t rows = CPU_CLS_CHUNK_FLOATS / (size_t)lim->Vp;
        size_t n = (size_t)lim->B * (size_t)lim->T;
        if (rows < 16) rows = 16;
        if (rows > n) rows = n;
        size_t chunks = (n + rows - 1) / rows; /* the classifier's equal chunks of n rows */
        rows = (n + chunks - 1) / chunks;
        MS_TRY(cpu_grow(&c->cls, &c->cls_floats, rows * (size_t)lim->Vp, "classifier"));
    }
    if (be->act_dtype == BE_BF16) MS_TRY(cpu16_reserve(c, lim));
    size_t scratch = sizeof(float) * (c->part_stride * nt + c->att_stride * nt + c->cls_floats +
                                      3 * c->x_floats + c->wb_have) +
                     sizeof(uint16_t) * c->cls16_n;
    cpu_account(c, scratch, c->scratch_bytes);
    c->scratch_bytes = scratch;
    return MS_OK;
}

static void cpu_destroy(be_backend *be) {
    if (!be) return;
    cpu_ctx *c = cpu_ctx_of(be);
    if (c && c->profile) {
        cpu_profile_report(be);
        cpu_profile_free(be);
    }
    if (c) {
        ms_free_aligned(c->part);
        ms_free_aligned(c->dpart);
        ms_free_aligned(c->att);
        ms_free_aligned(c->cls);
        for (int k = 0; k < 3; k++)
            ms_free_aligned(c->x[k]);
        ms_free_aligned(c->wb);
        ms_free_aligned(c->cls16);
        cpu_sgemm_scratch_free(&c->sg);
        cpu_dnnl_free(c->dnnl);
        free(c->blocks);
        free(c);
    }
    free(be);
}

static void cpu_fill_table(be_backend *be) {
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->to_device = cpu_memcpy;
    be->to_host = cpu_memcpy;
    be->copy = cpu_memcpy;
    be->zero = cpu_zero;
    be->sync = cpu_sync;
    be->reserve = cpu_reserve;
    be->destroy = cpu_destroy;
    be->to_act = cpu_to_act;
    be->is_device = cpu_is_device;
    be->host_alloc = cpu_host_alloc;
    be->host_free = cpu_host_free;
    be->ev_record = cpu_ev_record;
    be->ev_poll = cpu_ev_poll;
    be->ev_anchor = cpu_ev_anchor;
    be->mem_peak = cpu_mem_peak;
    be->embedding_fwd = cpu_embedding_fwd;
    be->embedding_bwd = cpu_embedding_bwd;
    be->embedding_slice_fwd = cpu_embedding_slice_fwd;
    be->embedding_slice_bwd = cpu_embedding_slice_bwd;
    be->layernorm_fwd = cpu_layernorm_fwd;
    be->layernorm_bwd = cpu_layernorm_bwd;
    be->gemm = cpu_gemm;
    be->bias_bwd = cpu_bias_bwd;
    be->attention_state_bytes = cpu_attention_state_bytes;
    be->attention_fwd = cpu_attention_fwd;
    be->attention_bwd = cpu_attention_bwd;
    be->gelu_fwd = cpu_gelu_fwd;
    be->gelu_bwd = cpu_gelu_bwd;
    be->residual_add = cpu_residual_add;
    be->bias_add = cpu_bias_add;
    be->add_f32 = cpu_add_f32;
    be->classifier_fwd_bwd = cpu_classifier_fwd_bwd;
    be->classifier_slice_stats = cpu_classifier_slice_stats;
    be->classifier_slice_finish = cpu_classifier_slice_finish;
    be->adamw_step = cpu_adamw_step;
    be->lamb_moments = cpu_lamb_moments;
    be->lamb_apply = cpu_lamb_apply;
    be->sum_squares = cpu_sum_squares;
    be->sum = cpu_sum;
    be->has_nonfinite = cpu_has_nonfinite;
}

static void cpu_model_name(char *buf, size_t n);

/* The bf16 mode's ops in place of the fp32 ones (act arguments in bf16). */
static void cpu16_fill_table(be_backend *be) {
    be->to_act = cpu16_to_act;
    be->embedding_fwd = cpu16_embedding_fwd;
    be->embedding_bwd = cpu16_embedding_bwd;
    be->embedding_slice_fwd = cpu16_embedding_slice_fwd;
    be->embedding_slice_bwd = cpu16_embedding_slice_bwd;
    be->layernorm_fwd = cpu16_layernorm_fwd;
    be->layernorm_bwd = cpu16_layernorm_bwd;
    be->gemm = cpu16_gemm;
    be->bias_bwd = cpu16_bias_bwd;
    be->attention_fwd = cpu16_attention_fwd;
    be->attention_bwd = cpu16_attention_bwd;
    be->gelu_fwd = cpu16_gelu_fwd;
    be->gelu_bwd = cpu16_gelu_bwd;
    be->residual_add = cpu16_residual_add;
    be->bias_add = cpu16_bias_add;
    be->classifier_fwd_bwd = cpu16_classifier_fwd_bwd;
    be->classifier_slice_stats = cpu16_classifier_slice_stats;
    be->classifier_slice_finish = cpu16_classifier_slice_finish;
}

/* 1 if the CPU multiplies bf16 in hardware: AVX512-BF16 (CPUID leaf 7
 * subleaf 1, EAX bit 5) with AVX-512 enabled by the OS, or AMX-BF16 (leaf 7,
 * EDX bit 22). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
static int cpu_has_bf16(void) {
    unsigned a, b, c, d;
    int avx512bf16 = 0, amx = 0;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512bf16 = (a >> 5) & 1;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) amx = (d >> 22) & 1;
    return (avx512bf16 && __builtin_cpu_supports("avx512f")) || amx;
}
#else
static int cpu_has_bf16(void) {
    return 0; /* the bf16 mode is built for x86-64's AVX512-BF16 / AMX */
}
#endif

double be_cpu_host_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    return pages > 0 && psize > 0 ? (double)pages * (double)psize : 0;
}

ms_status be_cpu_check_host_memory(const char *what, double need, const char *parts) {
    double have = be_cpu_host_memory();
    if (have <= 0 || need <= have) return MS_OK;
    return ms_error(MS_ERR_NOMEM,
                    "%s: needs %.1f GB (%s) on backend cpu; this host has %.1f GB of memory: "
                    "nothing was allocated (a smaller model: --layers, --dim, --vocab, "
                    "--seq-max; a smaller --micro-batch or --recompute; or more ranks)",
                    what, need / 1e9, parts, have / 1e9);
}

static int g_bf16_deny;

void be_cpu_bf16_deny(int on) {
    g_bf16_deny = on;
}

const char *be_cpu_bf16_missing(void) {
    static char why[256];
    const char *dn = cpu_dnnl_available();
    if (dn) return dn;
    if (g_bf16_deny) /* tests: the refusal on a CPU that has it */
        return "this CPU has neither AVX512-BF16 nor AMX-BF16 (denied for a test: "
               "MS_CPU_BF16_DENY is set)";
    if (!cpu_has_bf16()) {
        char model[128];
        cpu_model_name(model, sizeof model);
        snprintf(why, sizeof why,
                 "this CPU (%s) has neither AVX512-BF16 nor AMX-BF16: bf16 products would be "
                 "emulated, slower than fp32; use --cpu-dtype fp32",
                 model);
        return why;
    }
    return NULL;
}

/* Create the CPU backend; threads 0 = omp_get_max_threads().  Sets the
 * calling thread's OpenMP thread count, which OpenBLAS follows. */
/* The CPU's model name from /proc/cpuinfo ("cpu" if it has none). */
static void cpu_model_name(char *buf, size_t n) {
    snprintf(buf, n, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        colon += 1 + (colon[1] == ' ');
        colon[strcspn(colon, "\n")] = 0;
        snprintf(buf, n, "%s", colon);
        break;
    }
    if (f) fclose(f);
}

ms_status be_cpu_create(be_backend **out, int threads) {
    return be_cpu_create_dtype(out, threads, BE_F32);
}

ms_status be_cpu_create_dtype(be_backend **out, int threads, be_dtype dt) {
    *out = NULL;
    if (dt == BE_BF16) {
        const char *why = be_cpu_bf16_missing();
        if (why) return ms_error(MS_ERR_ARG, "--cpu-dtype bf16: %s", why);
    }
    if (threads < 0)
        return ms_error(MS_ERR_ARG, "cpu backend: threads must be >= 0, got %d", threads);
    if (threads == 0) threads = omp_get_max_threads();
    int gemm;
    MS_TRY(be_cpu_gemm_pick(&gemm));
    be_backend *be = calloc(1, sizeof *be);
    cpu_ctx *c = calloc(1, sizeof *c);
    double *dpart = ms_alloc_aligned((size_t)threads * 16 * sizeof(double));
    if (!be || !c || !dpart) {
        free(be);
        free(c);
        ms_free_aligned(dpart);
        return ms_error(MS_ERR_NOMEM, "cpu backend: out of memory creating the context");
    }
    c->threads = threads;
    c->dpart = dpart;
    for (int i = 0; i < CPU_EV_POOL; i++)
        c->ev_free[c->ev_nfree++] = CPU_EV_POOL - 1 - i;
    be->name = "cpu";
    cpu_model_name(be->device_name, sizeof be->device_name);
    be->act_dtype = dt;
    be->threads = threads;
    be->ctx = c;
    cpu_fill_table(be);
    ms_status gst = be_cpu_gemm_set(be, gemm);
    if (gst != MS_OK) {
        cpu_destroy(be);
        return gst;
    }
    if (dt == BE_BF16) {
        ms_status st = cpu_dnnl_create(&c->dnnl);
        if (st != MS_OK) {
            cpu_destroy(be);
            return st;
        }
        cpu16_fill_table(be);
    }
    cpu_blas_threads(c);
    *out = be;
    return MS_OK;
}

int be_cpu_gemm_own(const be_backend *be) {
    const cpu_sgemm_kern *kn =
        be && be->destroy == cpu_destroy ? ((const cpu_ctx *)be->ctx)->gemm_kern : NULL;
    return kn ? kn->kind : BE_CPU_GEMM_OPENBLAS;
}

ms_status be_cpu_gemm_set(be_backend *be, int kind) {
    MS_CHECKF(be && be->destroy == cpu_destroy, "be_cpu_gemm_set: not a CPU backend");
    cpu_ctx *c = cpu_ctx_of(be);
    if (!be_cpu_gemm_runs(kind))
        return ms_error(MS_ERR_ARG, "cpu backend: this CPU (or build) cannot run the fp32 GEMM %s",
                        be_cpu_gemm_name(kind));
    const cpu_sgemm_kern *kn = NULL;
#if CPU_SGEMM_OWN
    kn = kind == BE_CPU_GEMM_AVX512 ? &cpu_sgemm_kern_avx512
         : kind == BE_CPU_GEMM_AVX2 ? &cpu_sgemm_kern_avx2
                                    : NULL;
    if (kn && c->sg.threads < c->threads) MS_TRY(cpu_sgemm_scratch_init(&c->sg, c->threads));
#endif
    c->gemm_kern = kn;
    return MS_OK;
}

ms_status be_cpu_profile(be_backend *be) {
    MS_CHECKF(be && be->destroy == cpu_destroy, "be_cpu_profile: not a CPU backend");
    return cpu_ctx_of(be)->profile ? MS_OK : cpu_profile_install(be);
}
