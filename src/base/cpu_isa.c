/* cpu_isa.c - the compiled-for instruction set against the CPU (cpu_isa.h).
 * Called before main on any x86-64 CPU (src/cli/isa_check.c): the
 * functions are compiled for the x86-64 baseline whatever -march the file
 * gets, and call nothing but libgcc's CPU probe and string functions. */
#include "base/cpu_isa.h"

#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define BASELINE __attribute__((target("arch=x86-64")))

typedef struct {
    const char *name;
} isa_feature;

/* The extensions enabled in this build, in the compiler's names. */
static const isa_feature built[] = {
#ifdef __SSE4_2__
    {"sse4.2"},
#endif
#ifdef __AVX__
    {"avx"},
#endif
#ifdef __AVX2__
    {"avx2"},
#endif
#ifdef __FMA__
    {"fma"},
#endif
#ifdef __F16C__
    {"f16c"},
#endif
#ifdef __BMI2__
    {"bmi2"},
#endif
#ifdef __AVX512F__
    {"avx512f"},
#endif
#ifdef __AVX512BW__
    {"avx512bw"},
#endif
#ifdef __AVX512VL__
    {"avx512vl"},
#endif
#ifdef __AVX512DQ__
    {"avx512dq"},
#endif
#ifdef __AVX512VNNI__
    {"avx512vnni"},
#endif
#ifdef __AVX512BF16__
    {"avx512bf16"},
#endif
#ifdef __AMX_TILE__
    {"amx-tile"},
#endif
    {NULL}};

/* __builtin_cpu_supports takes a literal: one test per name. */
BASELINE static int cpu_has(const char *name) {
#define HAS(s)                                                                                     \
    if (!strcmp(name, s)) return __builtin_cpu_supports(s) != 0;
    HAS("sse4.2")
    HAS("avx")
    HAS("avx2")
    HAS("fma")
    HAS("f16c")
    HAS("bmi2")
    HAS("avx512f")
    HAS("avx512bw")
    HAS("avx512vl")
    HAS("avx512dq")
    HAS("avx512vnni")
    HAS("avx512bf16")
    HAS("amx-tile")
#undef HAS
    return 1; /* not a name we test */
}

BASELINE static void append(char *out, size_t n, size_t *k, const char *s) {
    size_t l = strlen(s);
    if (*k + l + 2 > n) return;
    if (*k) out[(*k)++] = ' ';
    memcpy(out + *k, s, l);
    *k += l;
    out[*k] = 0;
}

BASELINE void ms_cpu_isa_missing(char *out, size_t n) {
    size_t k = 0;
    if (n) out[0] = 0;
    __builtin_cpu_init();
    for (const isa_feature *f = built; f->name; f++)
        if (!cpu_has(f->name)) append(out, n, &k, f->name);
}

BASELINE const char *ms_cpu_isa_built(void) {
    static char names[256];
    if (!names[0]) {
        size_t k = 0;
        for (const isa_feature *f = built; f->name; f++)
            append(names, sizeof names, &k, f->name);
        if (!k) append(names, sizeof names, &k, "baseline");
    }
    return names;
}

#else
const char *ms_cpu_isa_built(void) {
    return "n/a";
}
void ms_cpu_isa_missing(char *out, size_t n) {
    if (n) out[0] = 0;
}
#endif
