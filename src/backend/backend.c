/* backend.c - backend creation by name and destruction.
 *
 * Backends: "cpu" (always) and "cuda" when the program was linked with the
 * CUDA backend (CMake's mscuda object library, built when nvcc is found).
 * be_cuda_create is referenced weakly so that programs without the CUDA
 * backend (the unit tests, a build without the toolkit) still link, and say
 * so when asked for it.
 */
#include "backend/backend.h"
#include "base/log.h"

#include <stddef.h>
#include <string.h>

#pragma weak be_cuda_create

be_options be_options_default(void) {
    be_options o = {.threads = 0, .cuda_profile = 0, .cuda_fuse_gelu = 1, .cpu_profile = 0,
                     .cpu_dtype = BE_F32};
    return o;
}

int be_warn_ignored(const char *device, const be_options *o) {
    int cpu = !device || !strcmp(device, "cpu"), n = 0;
    if (cpu && o->cuda_profile)
        n++, ms_warn("--cuda-profile %d (the option, a --config file or MS_CUDA_PROFILE) is for "
                     "--device cuda: the cpu backend ignores it (--cpu-profile 1 times its ops)",
                     o->cuda_profile);
    if (cpu && !o->cuda_fuse_gelu)
        n++, ms_warn("--cuda-fuse-gelu 0 (the option, a --config file or MS_CUDA_FUSE_GELU) is for "
                     "--device cuda: the cpu backend ignores it");
    if (!cpu && o->cpu_profile)
        n++, ms_warn("--cpu-profile %d (the option, a --config file or MS_CPU_PROFILE) is for "
                     "--device cpu: the %s backend ignores it (--cuda-profile 1 times its ops)",
                     o->cpu_profile, device);
    return n;
}

ms_status be_dtype_parse(const char *s, const char *device, be_dtype *out) {
    *out = BE_F32;
    if (!s || !strcmp(s, "fp32")) return MS_OK;
    if (strcmp(s, "bf16"))
        return ms_error(MS_ERR_ARG, "--cpu-dtype: \"%s\" is not fp32 or bf16", s);
    if (device && strcmp(device, "cpu"))
        return ms_error(MS_ERR_ARG,
                        "--cpu-dtype bf16 (the option, a --config file or MS_CPU_DTYPE) is for "
                        "--device cpu (the %s backend computes in its own dtype)",
                        device);
    const char *why = be_cpu_bf16_missing();
    if (why) return ms_error(MS_ERR_ARG, "--cpu-dtype bf16: %s", why);
    *out = BE_BF16;
    return MS_OK;
}

/* Create the backend called `name` with the options o (NULL: defaults).
 * MS_ERR_ARG names the available backends if `name` is unknown. */
ms_status be_create(be_backend **out, const char *name, const be_options *o) {
    be_options d = be_options_default();
    if (!o) o = &d;
    *out = NULL;
    if (name && strcmp(name, "cpu") == 0) {
        MS_TRY(be_cpu_create_dtype(out, o->threads, o->cpu_dtype));
        ms_status st = o->cpu_profile ? be_cpu_profile(*out) : MS_OK;
        if (st != MS_OK) {
            be_destroy(*out);
            *out = NULL;
        }
        return st;
    }
    if (name && strcmp(name, "cuda") == 0) {
        if (!be_cuda_create)
            return ms_error(MS_ERR_ARG,
                            "backend \"cuda\" is not built into this program (the CUDA toolkit "
                            "was not found at build time); available backends: cpu");
        return be_cuda_create(out, -1, o);
    }
    return ms_error(MS_ERR_ARG, "unknown backend \"%s\"; available backends: cpu%s",
                    name ? name : "(null)", be_cuda_create ? ", cuda" : "");
}

/* Release a backend and its scratch (NULL is a no-op).  Memory returned by
 * be->alloc must have been released by the caller before. */
void be_destroy(be_backend *be) {
    if (be) be->destroy(be);
}
