/* isa_check.c - before main: the instruction-set extensions the binary was
 * compiled for against this CPU (base/cpu_isa.h).  When one is missing,
 * the binary says which and how to build one for this CPU, and exits with
 * code 2 instead of dying of SIGILL in the first step.  MS_ISA_CHECK=0 in
 * the environment skips it (at one's own risk).  Compiled for the x86-64
 * baseline (target attribute), calling only libc and cpu_isa.c. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define BASELINE __attribute__((target("arch=x86-64")))

BASELINE static void put(const char *s) {
    ssize_t w = write(2, s, strlen(s));
    (void)w;
}

/* Before main and the binary's other constructors. */
__attribute__((constructor(101))) BASELINE static void isa_check(void) {
    const char *skip = getenv("MS_ISA_CHECK");
    if (skip && !strcmp(skip, "0")) return;
    if (skip && *skip && strcmp(skip, "1")) { /* a typo must not pass for either */
        put("megascale: error: environment MS_ISA_CHECK: '");
        put(skip);
        put("' is neither 0 (skip the instruction-set check) nor 1 (check: the default)\n");
        _exit(2);
    }
    char missing[256];
    ms_cpu_isa_missing(missing, sizeof missing);
    if (!missing[0]) return;
    put("megascale: error: this binary was compiled for a CPU with ");
    put(ms_cpu_isa_built());
    put(", but this CPU lacks ");
    put(missing);
    put(" (it would die of an illegal instruction). Build it on this machine (make), or for "
        "every x86-64 CPU: cmake -DMS_NATIVE=OFF (docs/user-guide.md, \"Building\")\n");
    _exit(2);
}
#endif
