/* ctx.h - the one process-level run context (rank, world, logging level).
 *
 * Created by main() (ms_ctx_init) before anything else runs; every other
 * module only reads it.  This is the single piece of global mutable state the
 * project allows (STYLE.md).  Not thread-safe to modify; safe to read.
 */
#ifndef MS_CTX_H
#define MS_CTX_H

#include <signal.h>

typedef enum { MS_LOG_DEBUG = 0, MS_LOG_INFO, MS_LOG_WARN, MS_LOG_ERROR } ms_log_level;

typedef struct {
    int rank;       /* global rank, 0 for a single process */
    int world;      /* number of ranks */
    int local_rank; /* rank on this node */
    int local_size; /* ranks on this node (1 for a single process) */
    ms_log_level log_level;
    int log_all_ranks;          /* if 0, INFO/DEBUG lines are printed by rank 0 only */
    volatile sig_atomic_t stop; /* set by SIGINT/SIGTERM: finish the step and stop */
    /* this process was asked to stop itself (a signal to it, its log gone),
     * not by another rank's agreement: the supervisor names it */
    volatile sig_atomic_t stop_here;
    /* SIGUSR2s received: requests for a hang dump (the supervisor's, before
     * it stops a hung job; the communication thread writes it) */
    volatile sig_atomic_t dump_requests;
    int log_fd;        /* the log file every printed line is appended to (-1: none; base/log.h) */
    char cpu_gemm[32]; /* MS_CPU_GEMM as set ("" unset: auto), checked by the CPU backend */
    char log_tag[16];  /* the log lines' tag: "" is "rRANK"; an offline tool's name */
    const char *cublaslt; /* MS_CUBLASLT (NULL: unset or empty): the cuBLASLt file the CUDA
                             backend loads (src/backend/cuda/cu_lt.cu) */
} ms_ctx;

/* Reads OMPI_COMM_WORLD_RANK/SIZE (or PMI_RANK/SIZE), OMPI_COMM_WORLD_LOCAL_RANK
 * (or MPI_LOCALRANKID) and OMPI_COMM_WORLD_LOCAL_SIZE (or MPI_LOCALNRANKS) when
 * launched by mpirun, MS_LOG_LEVEL (debug|info|warn|error), MS_CPU_GEMM (the
 * CPU backend's fp32 GEMMs: auto|own|own-avx512|own-avx2|openblas, be_cpu_gemm_pick),
 * MS_CUBLASLT (a path to the cuBLASLt library the CUDA backend loads). */
void ms_ctx_init(void);
const ms_ctx *ms_ctx_get(void);
ms_ctx *ms_ctx_mut(void); /* main() only */
/* Install SIGINT/SIGTERM/SIGHUP handlers that set ms_ctx.stop (a second
 * signal terminates at once), SIGUSR1 (a stop request) and SIGUSR2 (a
 * hang-dump request: ms_ctx.dump_requests), and ignore SIGPIPE: a write to
 * a log nobody reads fails with EPIPE, which ms_log turns into a stop
 * request. */
void ms_ctx_catch_signals(void);

#endif
