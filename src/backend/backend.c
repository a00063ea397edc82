/* backend.c - backend creation by name and destruction.
 *
 * Backends available in this build: "cpu" (always).  A CUDA build adds its
 * own entry here.
 */
#include "backend/backend.h"

#include <stddef.h>
#include <string.h>

/* Create the backend called `name` with `threads` compute threads (CPU;
 * 0 = all cores).  MS_ERR_ARG names the available backends if `name` is
 * unknown. */
ms_status be_create(be_backend **out, const char *name, int threads) {
    *out = NULL;
    if (name && strcmp(name, "cpu") == 0) return be_cpu_create(out, threads);
    return ms_error(MS_ERR_ARG, "unknown backend \"%s\"; available backends: cpu",
                    name ? name : "(null)");
}

/* Release a backend and its scratch (NULL is a no-op).  Memory returned by
 * be->alloc must have been released by the caller before. */
void be_destroy(be_backend *be) {
    if (be) be->destroy(be);
}
