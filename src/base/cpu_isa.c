/* cpu_isa.c - the compiled-for instruction set against the CPU (cpu_isa.h).
 * Called before main on any x86-64 CPU (src/cli/isa_check.c): the
 * functions are compiled for the x86-64 baseline whatever -march the file
 * gets, and call nothing but libgcc's CPU probe and string functions. */
#include "base/cpu_isa.h"

#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define BASELINE __attribute__((target("arch=x86-64")))

/* Each extension enabled in this build, in the compiler's names, and
 * whether this CPU has it (__builtin_cpu_supports takes a literal: one
 * line per name).  One list serves what the binary needs and what is
 * missing. */
#define ISA(s) ((missing_only && __builtin_cpu_supports(s)) ? (void)0 : each(ctx, s))
BASELINE static void isa_each(int missing_only, void (*each)(void *, const char *), void *ctx) {
#ifdef __SSE4_2__
    ISA("sse4.2");
#endif
#ifdef __AVX__
    ISA("avx");
#endif
#ifdef __AVX2__
    ISA("avx2");
#endif
#ifdef __FMA__
    ISA("fma");
#endif
#ifdef __F16C__
    ISA("f16c");
#endif
#ifdef __BMI2__
    ISA("bmi2");
#endif
#ifdef __AVX512F__
    ISA("avx512f");
#endif
#ifdef __AVX512BW__
    ISA("avx512bw");
#endif
#ifdef __AVX512VL__
    ISA("avx512vl");
#endif
#ifdef __AVX512DQ__
    ISA("avx512dq");
#endif
#ifdef __AVX512VNNI__
    ISA("avx512vnni");
#endif
#ifdef __AVX512BF16__
    ISA("avx512bf16");
#endif
#ifdef __AMX_TILE__
    ISA("amx-tile");
#endif
    (void)missing_only, (void)each, (void)ctx;
}
#undef ISA

BASELINE static void append(char *out, size_t n, size_t *k, const char *s) {
    size_t l = strlen(s);
    if (*k + l + 2 > n) return;
    if (*k) out[(*k)++] = ' ';
    memcpy(out + *k, s, l);
    *k += l;
    out[*k] = 0;
}

typedef struct {
    char *out;
    size_t n, k;
} isa_list;

BASELINE static void list_add(void *ctx, const char *name) {
    isa_list *l = ctx;
    append(l->out, l->n, &l->k, name);
}

BASELINE void ms_cpu_isa_missing(char *out, size_t n) {
    isa_list l = {out, n, 0};
    if (n) out[0] = 0;
    __builtin_cpu_init();
    isa_each(1, list_add, &l);
}

BASELINE const char *ms_cpu_isa_built(void) {
    static char names[256];
    if (!names[0]) {
        isa_list l = {names, sizeof names, 0};
        isa_each(0, list_add, &l);
        if (!l.k) append(names, sizeof names, &l.k, "baseline");
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
