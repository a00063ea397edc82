/* cpu_blas_core.c - which OpenBLAS kernel set ("core") the CPU backend's
 * GEMMs run on, and the one to ask for when OpenBLAS's own detection fell
 * back to an older one (backend.h, be_cpu_blas_*).
 *
 * A DYNAMIC_ARCH OpenBLAS picks its kernels once, when the library loads,
 * from the CPU's family and model numbers.  A release older than the CPU
 * does not know its model and falls back: Debian 12's OpenBLAS 0.3.21 runs
 * the SSE3 "Prescott" kernels on an Emerald Rapids Xeon (family 6, model
 * 207), 59 GFLOP/s at 2048^3 on two cores where its SkylakeX kernels, forced
 * with OPENBLAS_CORETYPE, reach 313 (docs/perf.md).  The kernels to ask for
 * follow from the instruction set the CPU reports, which does not age. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "backend/backend.h"
#include "base/ctx.h"

/* OpenBLAS's own (cblas.h of its flavours; declared here so that any
 * cblas.h the build finds will do). */
char *openblas_get_corename(void);

/* The instruction-set tier of an OpenBLAS x86-64 core name: 3 for its
 * AVX-512 kernels, 2 for AVX2 + FMA, 1 for AVX, 0 for the older ones it
 * falls back to; -1 for a name not listed here (a newer OpenBLAS's), which
 * is never replaced. */
static int core_tier(const char *core) {
    static const struct {
        const char *name;
        int tier;
    } cores[] = {
        {"SkylakeX", 3},    {"Cooperlake", 3},  {"SapphireRapids", 3}, {"Haswell", 2},
        {"Zen", 2},         {"Sandybridge", 1}, {"Bulldozer", 1},      {"Piledriver", 1},
        {"Steamroller", 1}, {"Excavator", 1},   {"Katmai", 0},         {"Coppermine", 0},
        {"Northwood", 0},   {"Prescott", 0},    {"Banias", 0},         {"Atom", 0},
        {"Core2", 0},       {"Penryn", 0},      {"Dunnington", 0},     {"Nehalem", 0},
        {"Athlon", 0},      {"Opteron", 0},     {"Opteron(SSE3)", 0},  {"Barcelona", 0},
        {"Nano", 0},        {"Bobcat", 0},
    };
    for (size_t i = 0; i < sizeof cores / sizeof *cores; i++)
        if (!strcasecmp(core, cores[i].name)) return cores[i].tier;
    return -1;
}

const char *be_cpu_blas_core_for(const char *chosen, int has_avx512, int avx512_split,
                                 int has_avx2_fma) {
    int want = has_avx512 ? 3 : has_avx2_fma ? 2 : 0;
    int have = chosen ? core_tier(chosen) : -1;
    if (want == 0 || have < 0 || have >= want) return NULL;
    /* AVX2 kernels on a CPU that splits each 512-bit operation in two run as
     * fast as the AVX-512 ones: nothing to gain from running again */
    if (want == 3 && avx512_split && have == 2) return NULL;
    return want == 3 ? "SkylakeX" : "Haswell";
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

/* 1 on a CPU whose AVX-512 units are 256 bits wide (each 512-bit operation
 * runs as two halves): AMD's Zen 4 (family 0x19).  Its peak is then the
 * AVX2 kernels' peak, and OpenBLAS's "Haswell" kernels measured faster there
 * than its AVX-512 "Cooperlake" ones (216 against 200 GFLOP/s at 2048^3 on
 * two cores, docs/perf.md); Zen 5 (family 0x1a) has full-width units (its
 * AVX-512 kernels reach 337-370 against the AVX2 kernels' 182-203). */
static int avx512_split(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u) /* "Auth"enticAMD */
        return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    unsigned family = (a >> 8) & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    return family < 0x1a;
}
#endif

const char *be_cpu_blas_core(void) {
    const char *c = openblas_get_corename();
    return c && *c ? c : "unknown";
}

/* Where the core came from, as main() found it (be_cpu_blas_set_origin). */
static char g_origin[256];

void be_cpu_blas_set_origin(const char *origin) {
    snprintf(g_origin, sizeof g_origin, "%s", origin ? origin : "");
}

const char *be_cpu_blas_describe(char *buf, size_t n) {
    if (g_origin[0])
        snprintf(buf, n, "OpenBLAS core %s (%s)", be_cpu_blas_core(), g_origin);
    else
        snprintf(buf, n, "OpenBLAS core %s", be_cpu_blas_core());
    return buf;
}

const char *be_cpu_blas_core_suggest(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    /* OpenBLAS's SkylakeX kernels need F, CD, BW, DQ and VL (its own check) */
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512vl");
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return be_cpu_blas_core_for(be_cpu_blas_core(), avx512, avx512 && avx512_split(), avx2);
#else
    return NULL;
#endif
}

int be_cpu_gemm_runs(int kind) {
    if (kind == BE_CPU_GEMM_OPENBLAS) return 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (kind == BE_CPU_GEMM_AVX2) return avx2;
    if (kind == BE_CPU_GEMM_AVX512) return avx2 && __builtin_cpu_supports("avx512f");
#endif
    return 0;
}

int be_cpu_gemm_for(int has_avx512, int avx512_split, int has_avx2_fma) {
    if (!has_avx2_fma) return BE_CPU_GEMM_OPENBLAS;
    return has_avx512 && !avx512_split ? BE_CPU_GEMM_AVX512 : BE_CPU_GEMM_AVX2;
}

int be_cpu_gemm_best(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    return be_cpu_gemm_for(be_cpu_gemm_runs(BE_CPU_GEMM_AVX512), avx512_split(),
                           be_cpu_gemm_runs(BE_CPU_GEMM_AVX2));
#else
    return BE_CPU_GEMM_OPENBLAS;
#endif
}

const char *be_cpu_gemm_name(int kind) {
    return kind == BE_CPU_GEMM_AVX512 ? "own AVX-512 kernel"
           : kind == BE_CPU_GEMM_AVX2 ? "own AVX2 kernel"
                                      : "OpenBLAS";
}

/* The MS_CPU_GEMM values that name one kind */
static const struct {
    const char *value;
    int kind;
} forced[] = {{"openblas", BE_CPU_GEMM_OPENBLAS},
              {"own-avx2", BE_CPU_GEMM_AVX2},
              {"own-avx512", BE_CPU_GEMM_AVX512}};

const char *be_cpu_gemm_value(int kind) {
    for (size_t i = 0; i < sizeof forced / sizeof *forced; i++)
        if (forced[i].kind == kind) return forced[i].value;
    return "openblas";
}

ms_status be_cpu_gemm_pick(int *kind) {
    const char *v = ms_ctx_get()->cpu_gemm;
    int best = be_cpu_gemm_best();
    *kind = BE_CPU_GEMM_OPENBLAS;
    if (!*v || !strcmp(v, "auto")) {
        *kind = best;
        return MS_OK;
    }
    if (!strcmp(v, "own")) {
        if (best == BE_CPU_GEMM_OPENBLAS)
            return ms_error(MS_ERR_ARG,
                            "MS_CPU_GEMM=own: the own fp32 GEMM needs an x86-64 CPU with AVX2 and "
                            "FMA (and an x86-64 build); this one lacks them; use auto or openblas");
        *kind = best;
        return MS_OK;
    }
    for (size_t i = 0; i < sizeof forced / sizeof *forced; i++)
        if (!strcmp(v, forced[i].value)) {
            if (!be_cpu_gemm_runs(forced[i].kind))
                return ms_error(
                    MS_ERR_ARG,
                    "MS_CPU_GEMM=%s: this CPU (or build) cannot run the %s, which needs "
                    "%s; use auto or openblas",
                    v, be_cpu_gemm_name(forced[i].kind),
                    forced[i].kind == BE_CPU_GEMM_AVX512 ? "AVX-512" : "AVX2 and FMA");
            *kind = forced[i].kind;
            return MS_OK;
        }
    return ms_error(MS_ERR_ARG,
                    "MS_CPU_GEMM=%s: expected auto, own, own-avx512, own-avx2 or openblas", v);
}

const char *be_cpu_gemm_describe(char *buf, size_t n) {
    int kind;
    if (be_cpu_gemm_pick(&kind) != MS_OK) {
        snprintf(buf, n, "fp32 GEMMs: %s", ms_errmsg());
        return buf;
    }
    const char *v = ms_ctx_get()->cpu_gemm;
    if (*v && strcmp(v, "auto"))
        snprintf(buf, n, "fp32 GEMMs: %s (MS_CPU_GEMM=%s)", be_cpu_gemm_name(kind), v);
    else if (kind != BE_CPU_GEMM_OPENBLAS)
        snprintf(buf, n, "fp32 GEMMs: %s", be_cpu_gemm_name(kind));
    else
        snprintf(buf, n,
                 "fp32 GEMMs: OpenBLAS (the own kernel needs an x86-64 CPU with AVX2 and FMA)");
    return buf;
}
