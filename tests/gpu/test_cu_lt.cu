/* test_cu_lt.cu - cuBLASLt loaded at run time (src/backend/cuda/cu_lt.cu),
 * on any machine with the CUDA toolkit (no GPU needed):
 *  - the program does not link cuBLASLt (a linked one's initialisers cost
 *    every process ~0.3 s at start-up): it is not mapped before the load;
 *  - cu_lt_load fills every function of the table and maps the library,
 *    whose major version is the headers'; a second call gives the first's
 *    result;
 *  - the host-side descriptors cu_gemm.cu builds, through the table;
 *  - MS_CUBLASLT (child processes): naming the loaded file, it loads;
 *    naming a missing one, MS_ERR_NOTFOUND naming it and what to do.
 * Built only with the real backend (target mscuda): the emulator links its
 * own cuBLASLt and fills the table from it, which every emulator test uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cu_internal.h"

extern "C" {
#include "base/ctx.h"
#include "check.h"
}

/* The path of the mapped file whose name contains `name` into out ("" none). */
static void mapped_path(const char *name, char *out, size_t n) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    out[0] = 0;
    while (f && !out[0] && fgets(line, sizeof line, f)) {
        char *p = strchr(line, '/');
        if (p && strstr(p, name)) {
            p[strcspn(p, "\n")] = 0;
            snprintf(out, n, "%s", p);
        }
    }
    if (f) fclose(f);
}

static int mapped(const char *name) {
    char path[4096];
    mapped_path(name, path, sizeof path);
    return path[0] != 0;
}

/* The child's side: cu_lt_load as a program does (MS_CUBLASLT read at
 * start-up), printing "CODE MESSAGE". */
static int child(void) {
    ms_ctx_init();
    ms_status st = cu_lt_load();
    printf("%d %s\n", (int)st, st == MS_OK ? "" : ms_errmsg());
    return 0;
}

/* This program run again with MS_CUBLASLT=lib, its output into out. */
static void run_child(const char *self, const char *lib, char *out, size_t n) {
    int fd[2];
    out[0] = 0;
    if (pipe(fd) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        setenv("MS_CUBLASLT", lib, 1);
        execl("/proc/self/exe", self, "--child", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t r;
    while (len + 1 < n && (r = read(fd[0], out + len, n - 1 - len)) > 0)
        len += (size_t)r;
    out[len] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    T_OK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) return child();

    T_OK(!mapped("libcublasLt"));
    ms_status st = cu_lt_load();
    T_EQ_INT(st, MS_OK);
    if (st != MS_OK) fprintf(stderr, "cu_lt_load: %s\n", ms_errmsg());
    T_OK(mapped("libcublasLt"));
    int filled = 0, members = 0;
#define COUNT(name) members++, filled += cu_lt.name != NULL;
    CU_LT_FUNCTIONS(COUNT)
#undef COUNT
    T_EQ_INT(filled, members);
    if (st == MS_OK) {
        size_t v = cu_lt.GetVersion(); /* major * 10000 + minor * 100 + patch */
        T_EQ_INT(v / 10000, CUBLAS_VER_MAJOR);
        const char *ok_s = cu_lt.GetStatusString(CUBLAS_STATUS_SUCCESS);
        const char *bad_s = cu_lt.GetStatusString(CUBLAS_STATUS_INVALID_VALUE);
        T_OK(ok_s && bad_s && strcmp(ok_s, bad_s) != 0);
        /* the host-side descriptors, as cu_gemm.cu builds them (no device needed) */
        cublasLtMatmulDesc_t desc = NULL;
        cublasLtMatrixLayout_t lay = NULL;
        cublasLtMatmulPreference_t pref = NULL;
        cublasOperation_t t = CUBLAS_OP_T;
        size_t ws = 1 << 20;
        T_EQ_INT(cu_lt.MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 CUBLAS_STATUS_SUCCESS);
        T_EQ_INT(cu_lt.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t),
                 CUBLAS_STATUS_SUCCESS);
        T_EQ_INT(cu_lt.MatrixLayoutCreate(&lay, CUDA_R_16BF, 64, 32, 64), CUBLAS_STATUS_SUCCESS);
        T_EQ_INT(cu_lt.MatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
        T_EQ_INT(cu_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws),
                 CUBLAS_STATUS_SUCCESS);
        T_EQ_INT(cu_lt.MatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
        T_EQ_INT(cu_lt.MatrixLayoutDestroy(lay), CUBLAS_STATUS_SUCCESS);
        T_EQ_INT(cu_lt.MatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
    }
    T_EQ_INT(cu_lt_load(), st);

    /* MS_CUBLASLT naming the file just loaded, then one that is not there */
    char lib[4096], out[2048], code[16];
    mapped_path("libcublasLt", lib, sizeof lib);
    run_child(argv[0], lib, out, sizeof out);
    T_OK(!strncmp(out, "0 ", 2));
    run_child(argv[0], "/nonexistent/libcublasLt.so.99", out, sizeof out);
    snprintf(code, sizeof code, "%d ", (int)MS_ERR_NOTFOUND);
    T_OK(!strncmp(out, code, strlen(code)));
    T_STR_CONTAINS(out, "MS_CUBLASLT=/nonexistent/libcublasLt.so.99");
    T_STR_CONTAINS(out, "unset it");
    return ms_test_summary("test_cu_lt");
}
