/* cu_lt.cu - cuBLASLt, loaded with dlopen when the first CUDA backend is
 * created, not linked.  Linked, its initialisers ran at the start of every
 * process of a CUDA build, GPU or not: about 0.3 s of a CPU, most of it
 * page faults of their allocations (docs/perf.md, "What every megascale
 * process pays to start"), paid by each rank at each (re)start and by every
 * CLI call.  Loaded here, only a process that creates a CUDA backend pays,
 * and a CUDA build also runs its CPU paths where cuBLASLt is not installed.
 *
 * The emulator (tests/cuda_emu, MS_CUDA_EMU) links its own cuBLASLt and
 * fills the same table from it, so the calls go through the table in both
 * builds; the names looked up are the members' names with the cublasLt
 * prefix (CU_LT_FUNCTIONS), each member typed as its function is.
 *
 * Where: MS_CUBLASLT (a path: a cuBLASLt of the same major version outside
 * the loader's search, a Python wheel's say), else the soname the build was
 * compiled against, searched as the dynamic loader does (LD_LIBRARY_PATH,
 * the program's run path, ld.so.cache). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "cu_internal.h"

extern "C" {
#include "base/ctx.h"
}

cu_lt_api cu_lt;

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static char lt_error[600]; /* why the load failed ("" when it did not) */

#ifdef MS_CUDA_EMU
static void lt_load_once(void) {
#define CU_LT_DIRECT(name) cu_lt.name = &cublasLt##name;
    CU_LT_FUNCTIONS(CU_LT_DIRECT)
#undef CU_LT_DIRECT
}
#else
#define CU_LT_STR_(x) #x
#define CU_LT_STR(x) CU_LT_STR_(x)
/* the soname of the cuBLASLt the build was compiled against */
#define CU_LT_LIB "libcublasLt.so." CU_LT_STR(CUBLAS_VER_MAJOR)

static void lt_load_once(void) {
    const char *env = ms_ctx_get()->cublaslt, *lib = env ? env : CU_LT_LIB;
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        if (lib == env)
            snprintf(lt_error, sizeof lt_error,
                     "cannot load cuBLASLt from MS_CUBLASLT=%s (%s): point it at a %s, or unset "
                     "it to search the usual places",
                     env, dlerror(), CU_LT_LIB);
        else
            snprintf(lt_error, sizeof lt_error,
                     "cannot load cuBLASLt (%s): install the CUDA toolkit's cuBLAS %d, add the "
                     "directory that holds %s to LD_LIBRARY_PATH, or name the file in "
                     "MS_CUBLASLT",
                     dlerror(), CUBLAS_VER_MAJOR, CU_LT_LIB);
        return;
    }
    cu_lt_api t;
#define CU_LT_SYM(name)                                                                            \
    if (!(t.name = (decltype(t.name))dlsym(h, "cublasLt" #name))) {                                \
        snprintf(lt_error, sizeof lt_error,                                                        \
                 "%s has no cublasLt" #name ": not the cuBLASLt %d "                               \
                 "this build was compiled against",                                                \
                 lib, CUBLAS_VER_MAJOR);                                                           \
        dlclose(h);                                                                                \
        return;                                                                                    \
    }
    CU_LT_FUNCTIONS(CU_LT_SYM)
#undef CU_LT_SYM
    size_t v = t.GetVersion(); /* major * 10000 + minor * 100 + patch */
    if (v / 10000 != CUBLAS_VER_MAJOR) {
        snprintf(lt_error, sizeof lt_error,
                 "%s is cuBLASLt %zu.%zu, not the cuBLASLt %d this build was compiled against", lib,
                 v / 10000, v / 100 % 100, CUBLAS_VER_MAJOR);
        dlclose(h);
        return;
    }
    cu_lt = t; /* the library stays loaded for the process's life */
}
#endif

ms_status cu_lt_load(void) {
    pthread_once(&lt_once, lt_load_once);
    if (lt_error[0]) return ms_error(MS_ERR_NOTFOUND, "cuda backend: %s", lt_error);
    return MS_OK;
}
