/* cpu_isa.h - the x86 instruction-set extensions this binary was compiled
 * for (-march=native by default, MS_NATIVE), checked against the CPU it
 * runs on before anything else runs.
 *
 * A binary built with -march=native on a machine with AVX-512 dies of
 * SIGILL somewhere in the first step on one without (a cluster of mixed
 * nodes, a build directory on a shared file system, a container image).
 * Instead, the program's constructor (src/cli/isa_check.c, before main)
 * compares the compiler's feature macros, through these functions
 * (compiled for the x86-64 baseline, so that they run anywhere), with what
 * the CPU reports and, when an extension is missing, prints what and how
 * to build a binary for this CPU, and exits with code 2.  Elsewhere than
 * x86-64 they report nothing missing.  Thread-safe (reads only).
 */
#ifndef MS_CPU_ISA_H
#define MS_CPU_ISA_H

#include <stddef.h>

/* The extensions the binary needs, as "avx2 fma ..." ("baseline" for
 * none beyond x86-64's, "n/a" off x86-64), for start-up lines and
 * benchmarks. */
const char *ms_cpu_isa_built(void);

/* Those this CPU lacks, written into out ("" when none).  Runs on any
 * x86-64 CPU. */
void ms_cpu_isa_missing(char *out, size_t n);

#endif
