/* main.c - the megascale binary: dispatch to subcommands. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/cpu_isa.h"
#include "base/ctx.h"
#include "base/log.h"
#include "cli/commands.h"

/* The commands: to stdout when asked for (--help), to stderr with the
 * error of no or an unknown command (exit 2). */
static void usage(FILE *f) {
    fprintf(f, "usage: megascale <command> [options]\n\n"
               "commands:\n"
               "  train    train a GPT model (megascale train --help)\n"
               "  sample   generate text from saved weights\n"
               "  eval     validation loss of saved weights or a checkpoint on a data set\n"
               "  data     prepare and inspect token shards\n"
               "  ckpt     list, inspect, verify, export and reshard checkpoints\n"
               "  trace    merge event logs into one timeline, stragglers, hang analysis\n"
               "  launch   run a training job under the supervisor (restarts it on faults)\n"
               "  diag     node self-test: gemm, memory, comm, storage (exit 9 on a failed check)\n"
               "  dashboard  serve the dashboard of a job's run directory in a browser\n"
               "  plan     predict step time, MFU and memory of a model on a cluster and layout\n\n"
               "Each command takes --help; megascale --version says which build this is.\n");
}

#ifndef MS_VERSION /* set by CMake for the megascale target; other programs built from main.c */
#define MS_VERSION "unknown"
#endif
#ifdef MS_HAVE_GIT_H /* the megascale target: written at every build */
#include "ms_git.h"
#endif
#ifndef MS_GIT
#define MS_GIT "unknown"
#endif

static int version(void) {
#ifdef MS_VERSION_CUDA
    const char *backends = "cpu, cuda";
#else
    const char *backends = "cpu";
#endif
    char blas[320], gemm[256];
    printf("megascale %s (git %s), backends: %s; compiled for x86-64 with %s; %s; %s\n", MS_VERSION,
           MS_GIT, backends, ms_cpu_isa_built(), be_cpu_gemm_describe(gemm, sizeof gemm),
           be_cpu_blas_describe(blas, sizeof blas));
    return 0;
}

/* OpenBLAS chose its kernels when it loaded: from the CPU's model number,
 * or from OPENBLAS_CORETYPE when the environment sets it.  When they are
 * older than this CPU's instruction set (a release that predates the CPU
 * falls back to SSE3 ones; a machine image that pins "Haswell" for every
 * program runs half as fast on an AVX-512 CPU), set OPENBLAS_CORETYPE to
 * the kernels that fit and execute this program again, once: the variable
 * is read only at load.  The first run leaves MS_BLAS_CORE_FROM (what was
 * replaced, in words), so the second obeys the variable and says why.
 * MS_BLAS_CORE=keep keeps what OpenBLAS runs (its own choice, or the
 * environment's OPENBLAS_CORETYPE), for a fleet that pins one kernel set
 * for the same bits everywhere.  Before anything else starts: no thread, no
 * MPI.  Only the commands that compute (and --version, which reports it)
 * pay for the second start (the CUDA libraries load again: 0.1-0.2 s);
 * launch's ranks check for themselves. */
static void blas_core(int argc, char **argv) {
    static const char *const compute[] = {"train", "eval",      "sample", "diag",
                                          "plan",  "--version", "version"};
    int computes = 0;
    for (size_t i = 0; argc >= 2 && i < sizeof compute / sizeof *compute; i++)
        computes |= !strcmp(argv[1], compute[i]);
    if (!computes) return;
    const char *set = getenv("OPENBLAS_CORETYPE"), *from = getenv("MS_BLAS_CORE_FROM");
    const char *keep = getenv("MS_BLAS_CORE");
    if (keep && *keep && strcmp(keep, "keep")) { /* a typo must not pass for "keep" */
        fprintf(stderr,
                "megascale: error: environment MS_BLAS_CORE: '%s' is not 'keep' (its only value: "
                "run on the OpenBLAS kernels OpenBLAS chose, or OPENBLAS_CORETYPE's)\n",
                keep);
        exit(2);
    }
    int pinned = set && *set, kept = keep && !strcmp(keep, "keep");
    char pin[64], origin[224];
    snprintf(pin, sizeof pin, "%s", pinned ? set : ""); /* setenv may move it */
    if (pinned && from && *from) {                      /* the second run */
        if (strcasecmp(be_cpu_blas_core(), set))
            snprintf(origin, sizeof origin, "%s; OpenBLAS has no kernels named %s", from, set);
        else
            snprintf(origin, sizeof origin, "set by megascale: %s", from);
        be_cpu_blas_set_origin(origin);
        return;
    }
    const char *core = be_cpu_blas_core_suggest();
    if (!core || kept) {
        if (pinned && core)
            snprintf(origin, sizeof origin,
                     "OPENBLAS_CORETYPE, kept: MS_BLAS_CORE=keep; this CPU could run %s", core);
        else if (pinned && strcasecmp(be_cpu_blas_core(), pin))
            snprintf(origin, sizeof origin,
                     "OPENBLAS_CORETYPE=%s names no kernels of this OpenBLAS", pin);
        else if (pinned)
            snprintf(origin, sizeof origin, "OPENBLAS_CORETYPE");
        else if (core)
            snprintf(origin, sizeof origin, "MS_BLAS_CORE=keep; this CPU could run %s", core);
        else
            origin[0] = 0;
        be_cpu_blas_set_origin(origin);
        return;
    }
    char was[128];
    if (pinned)
        snprintf(was, sizeof was, "the environment had OPENBLAS_CORETYPE=%s", pin);
    else
        snprintf(was, sizeof was, "OpenBLAS detected %.40s", be_cpu_blas_core());
    /* the binary's own path (readlink: a tool that runs the program, such as valgrind,
     * answers with the program's, where the link itself names the tool) */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        if (setenv("MS_BLAS_CORE_FROM", was, 1) == 0 && setenv("OPENBLAS_CORETYPE", core, 1) == 0)
            execv(self, argv);
    }
    /* still here: run on what OpenBLAS loaded, and say so */
    if (pinned)
        setenv("OPENBLAS_CORETYPE", pin, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
    unsetenv("MS_BLAS_CORE_FROM");
    snprintf(origin, sizeof origin, "%s; could not run again with OPENBLAS_CORETYPE=%s", was, core);
    be_cpu_blas_set_origin(origin);
}

int cli_exit_code(ms_status st) {
    switch (st) {
    case MS_OK:
        return 0;
    case MS_ERR_ARG:
        return 2; /* usage */
    case MS_ERR_FORMAT:
    case MS_ERR_RANGE:
    case MS_ERR_NOTFOUND:
        return 3; /* bad input: a file, a shard, a checkpoint */
    case MS_ERR_IO:
        return 4; /* storage */
    case MS_ERR_TIMEOUT:
        return 5; /* communication: a peer lost or stuck */
    case MS_ERR_NONFINITE:
        return 6; /* persistent non-finite loss or gradients */
    case MS_ERR_INTERNAL:
        return 7; /* a device or library call failed */
    case MS_ERR_NOMEM:
        return 8;
    }
    return 1;
}

int cli_fail(const char *cmd, ms_status st) {
    const ms_ctx *c = ms_ctx_get();
    if (ms_error_reported()) return cli_exit_code(st); /* rank 0 printed it for every rank */
    char host[128] = "";
    if (c->world > 1) gethostname(host, sizeof host - 1);
    if (c->world > 1)
        ms_log_raw("megascale %s: error (rank %d of %d on %s): %s", cmd, c->rank, c->world, host,
                   ms_errmsg());
    else
        ms_log_raw("megascale %s: error: %s", cmd, ms_errmsg());
    return cli_exit_code(st);
}

/* A command's exit code rc, once its stdout is written: a write that failed (a full disk:
 * `eval --json > result.json`) is a storage error, exit 4, with the reason (before, exit 0
 * and an empty or cut file).  A reader that went away (EPIPE: `| head`) is none. */
static int stdout_checked(const char *cmd, int rc) {
    int bad = ferror(stdout), err = 0;
    errno = 0;
    if (fflush(stdout) != 0) bad = 1, err = errno;
    /* a pipe or a socket fails only when its reader is gone (an earlier EPIPE left just the
     * error flag), never for lack of space */
    struct stat sb;
    int piped = fstat(STDOUT_FILENO, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode));
    if (!bad || err == EPIPE || piped) return rc;
    fprintf(stderr, "megascale %s: error: stdout: %s: its output is incomplete\n", cmd,
            err ? strerror(err) : "a write failed");
    return rc ? rc : 4;
}

int main(int argc, char **argv) {
    /* a file-size limit (ulimit -f) is a write error (EFBIG) that names the file and cleans up
     * like a full disk's, not a SIGXFSZ that ends the process without a word and leaves its
     * staged files behind */
    signal(SIGXFSZ, SIG_IGN);
    blas_core(argc, argv);
    /* tests: the refusal of --cpu-dtype bf16 on a CPU without bf16, shown
     * on one that has it (tests/mpi/test_cpu_bf16.py) */
    if (getenv("MS_CPU_BF16_DENY")) be_cpu_bf16_deny(1);
    ms_ctx_init();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) return version();
    /* the tools that read a run's files, never one of its ranks: their lines
     * say the tool, not "r0" (a rank of the job they look at) */
    static const char *const offline[] = {"trace", "dashboard", "plan", "ckpt", "data"};
    for (size_t i = 0; i < sizeof offline / sizeof *offline; i++)
        if (!strcmp(cmd, offline[i]) && ms_ctx_get()->world <= 1)
            snprintf(ms_ctx_mut()->log_tag, sizeof ms_ctx_mut()->log_tag, "%s", cmd);
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } cmds[] = {{"train", cmd_train},   {"sample", cmd_sample}, {"eval", cmd_eval},
                {"data", cmd_data},     {"ckpt", cmd_ckpt},     {"trace", cmd_trace},
                {"launch", cmd_launch}, {"diag", cmd_diag},     {"dashboard", cmd_dashboard},
                {"plan", cmd_plan}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (!strcmp(cmd, cmds[i].name)) return stdout_checked(cmd, cmds[i].run(argc - 2, argv + 2));
    fprintf(stderr, "megascale: error: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
