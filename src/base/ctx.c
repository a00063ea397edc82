/* ctx.c - the process-level run context. */
#include "base/ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ms_ctx g_ctx = {.world = 1, .local_size = 1, .log_level = MS_LOG_INFO, .log_fd = -1};

/* The first of the variables names[0..] (NULL-terminated) that is set. */
static const char *env_first(const char *const *names) {
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) return v;
    }
    return NULL;
}

static int env_int(const char *const *names, int def) {
    const char *v = env_first(names);
    return v ? atoi(v) : def;
}

/* Slurm's tasks on this node: SLURM_TASKS_PER_NODE is "8(x2),4" (8 tasks
 * on each of the first two nodes, 4 on the third); SLURM_NODEID says which. */
static int slurm_local_size(void) {
    const char *t = getenv("SLURM_TASKS_PER_NODE"), *id = getenv("SLURM_NODEID");
    if (!t || !id) return 0;
    int node = atoi(id), at = 0;
    for (const char *p = t; *p;) {
        char *end;
        long n = strtol(p, &end, 10), times = 1;
        if (end == p || n < 1) return 0;
        if (*end == '(' && end[1] == 'x') times = strtol(end + 2, &end, 10), end += *end == ')';
        if (times < 1) return 0;
        if (node < at + times) return (int)n;
        at += (int)times;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return 0;
    }
    return 0;
}

void ms_ctx_init(void) {
    /* Open MPI's mpirun, then MPICH / PMI, PMIx, then Slurm's srun (whose
     * ranks get no OMPI_* variables: --mpi=pmix) */
    static const char *const rank[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                       "SLURM_PROCID", NULL};
    static const char *const world[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    static const char *const lrank[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                        "SLURM_LOCALID", NULL};
    static const char *const lsize[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", NULL};
    g_ctx.rank = env_int(rank, 0);
    g_ctx.world = env_int(world, 1);
    g_ctx.local_rank = env_int(lrank, 0);
    int slurm = slurm_local_size();
    g_ctx.local_size = env_int(lsize, slurm > 0 ? slurm : 1);
    const char *gm = getenv("MS_CPU_GEMM");
    snprintf(g_ctx.cpu_gemm, sizeof g_ctx.cpu_gemm, "%s", gm ? gm : "");
    const char *lt = getenv("MS_CUBLASLT");
    g_ctx.cublaslt = lt && *lt ? lt : NULL;
    const char *lv = getenv("MS_LOG_LEVEL");
    if (lv) {
        if (!strcmp(lv, "debug"))
            g_ctx.log_level = MS_LOG_DEBUG;
        else if (!strcmp(lv, "warn"))
            g_ctx.log_level = MS_LOG_WARN;
        else if (!strcmp(lv, "error"))
            g_ctx.log_level = MS_LOG_ERROR;
    }
}

const ms_ctx *ms_ctx_get(void) {
    return &g_ctx;
}
ms_ctx *ms_ctx_mut(void) {
    return &g_ctx;
}

static void on_signal(int sig) {
    if (g_ctx.stop) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_ctx.stop = 1;
    g_ctx.stop_here = 1;
}

/* SIGUSR1: a stop request, never more (any number of them are one): the
 * supervisor sends it to each rank directly and through mpirun, which
 * forwards it to every rank on every host. */
static void on_stop_request(int sig) {
    (void)sig;
    g_ctx.stop = 1;
    g_ctx.stop_here = 1;
}

/* SIGUSR2: write a hang dump (the supervisor's request before it stops a
 * hung job, sent to each rank and through mpirun; comm_dump.c). */
static void on_dump_request(int sig) {
    (void)sig;
    g_ctx.dump_requests++;
}

void ms_ctx_catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* a closed ssh session: stop, with a final checkpoint */
    sa.sa_handler = on_stop_request;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_dump_request;
    sigaction(SIGUSR2, &sa, NULL);
    /* a log reader that went away (`| tee` killed by the same Ctrl-C, a
     * closed ssh session) must not kill the run: the write fails with
     * EPIPE instead, which ms_log turns into a stop request */
    signal(SIGPIPE, SIG_IGN);
}
