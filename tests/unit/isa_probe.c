/* isa_probe.c - src/base/cpu_isa.c built with one more extension than any
 * AMD CPU has (-mamx-tile: only the feature macro changes, no AMX code is
 * generated), for tests/unit/test_cpu_isa.sh: on a CPU without AMX the
 * check before main must refuse to run it; with MS_ISA_CHECK=0 main prints
 * what is missing. */
#include <stdio.h>

#include "base/cpu_isa.h"

int main(void) {
    char missing[256];
    ms_cpu_isa_missing(missing, sizeof missing);
    printf("built for: %s\nmissing: %s\n", ms_cpu_isa_built(), missing);
    return 0;
}
