/* env_options.h - communicator options for the test programs and benches
 * that call comm_world_init themselves.  The library reads no environment
 * (megascale takes --comm-timeout / --comm-nccl-sync, env MS_COMM_TIMEOUT /
 * MS_COMM_NCCL_SYNC, through its option table); these programs read the
 * same two variables from their own environment, as tests/comm.cmake,
 * tests/tp.cmake and tests/comm/fault.sh set them:
 *   MS_COMM_TIMEOUT    seconds per op (> 0; unset: the default 300 s)
 *   MS_COMM_NCCL_SYNC  0 or 1 (unset: 0)
 * A bad value prints why and exits 2.  Header-only. */
#ifndef MS_TEST_COMM_ENV_OPTIONS_H
#define MS_TEST_COMM_ENV_OPTIONS_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

static inline comm_options ms_test_comm_options(void) {
    comm_options o = comm_options_default();
    const char *t = getenv("MS_COMM_TIMEOUT"), *s = getenv("MS_COMM_NCCL_SYNC");
    if (t && *t) {
        char *end = NULL;
        errno = 0;
        double v = strtod(t, &end);
        if (errno || end == t || *end || !(v > 0) || !isfinite(v)) {
            fprintf(stderr, "MS_COMM_TIMEOUT='%s' is not a positive number of seconds\n", t);
            exit(2);
        }
        o.timeout_s = v;
    }
    if (s && *s) {
        if (strcmp(s, "0") && strcmp(s, "1")) {
            fprintf(stderr, "MS_COMM_NCCL_SYNC='%s' is not 0 or 1\n", s);
            exit(2);
        }
        o.nccl_sync = s[0] == '1';
    }
    return o;
}

#endif
