/* diag.h - the node self-test (`megascale diag`): a few checks of the
 * hardware a rank runs on, each with a measured value, a limit and a
 * verdict, so that the supervisor can evict a node that fails one.
 *
 * Checks, in order:
 *  - gemm: the backend's GEMM against a naive double-precision product on
 *    the host (fresh random inputs, three layouts; relative max error <=
 *    1e-4 in fp32, 2e-2 in bf16), then its speed (GFLOP/s of a large square
 *    product, monitor's probe) against this node's history.
 *  - memory: host memory bandwidth (a parallel copy, best of a few, GB/s;
 *    the copy is verified), against a floor and the history.
 *  - comm: a loopback send/recv with the neighbour rank (a self-send in a
 *    world of one) and an all-reduce over the world, both checked exactly,
 *    under the communicator's deadline.
 *  - storage: write, fsync, read back (CRC32C) and remove a file in a
 *    directory; MB/s both ways.
 * A check given no way to run (no storage directory) is skipped with a
 * reason; a skipped check does not fail the node.  Injected faults
 * (diag:gemm, diag:memory, diag:comm, diag:storage; base/fault.h) make a
 * check fail as if the hardware were bad: they corrupt the data it checks.
 *
 * Node: every report names the node it ran on (diag_config.node: the
 * caller's --node-map entry for this rank, else the host name).
 *
 * History: a JSON-lines file, one object per passing gemm or memory result
 * ({"check","value","unit","device","size","local_rank","host","time"});
 * a check compares with the median of the newest DIAG_HISTORY_MEDIAN
 * entries of the same check, device, size and local rank (a check fails
 * against it only with DIAG_HISTORY_MIN entries or more: one earlier run
 * may itself have been a busy moment), and appends its
 * own when it passes (read, append, write a temp file, rename, under an
 * flock of FILE.lock so ranks sharing the file do not lose each other's).
 * With a history directory instead, each node has its own file,
 * DIR/NODE.jsonl (DIR is created if missing).
 *
 * Who calls it: cli/cmd_diag.c.  diag_run initialises (and finalises) the
 * communicator itself, so it runs once per process, on the main thread.
 * Memory: a report is a value; diag_report_json returns malloc'd text.
 * Thread-safety: none needed (one call per process).
 */
#ifndef DIAG_DIAG_H
#define DIAG_DIAG_H

#include <stdio.h>

#include "base/fault.h"
#include "base/node.h"
#include "base/status.h"

#define DIAG_MAX_CHECKS 4
#define DIAG_MAX_AUX 2
#define DIAG_HISTORY_MEDIAN 25 /* the newest entries the median is taken over */
#define DIAG_HISTORY_MIN 3     /* the fewest comparable entries that may fail a check */
#define DIAG_HISTORY_KEEP 2000 /* the newest lines a history file keeps */
#define DIAG_HISTORY_MAX_BYTES (16 << 20) /* larger: not a history (2000 lines are ~0.5 MB) */

typedef struct diag_report diag_report;

typedef struct {
    const char *device;          /* backend: "cpu" or "cuda" */
    int threads;                 /* CPU threads (0: all cores) */
    int gemm_n;                  /* correctness product size (n x n x n) */
    int gemm_speed_n;            /* speed product size (0: 2048 in fp32, 8192 in bf16) */
    double slow_factor;          /* fail below slow_factor x the history's median */
    const char *history;         /* JSON-lines history file (NULL: none) */
    const char *history_dir;     /* or a directory of them, DIR/NODE.jsonl (NULL: none) */
    const char *node;            /* this rank's node name (NULL or "": the host name) */
    int mem_mb;                  /* each of the two buffers of the memory check */
    double min_mem_gbps;         /* memory floor (0: none) */
    double comm_timeout;         /* seconds per collective */
    int storage_mb;              /* size of the storage check's file */
    const char *storage_dir;     /* where it is written (NULL: the check is skipped) */
    const ms_fault_plan *faults; /* injected faults (NULL: none) */
    /* Called with the finished report while the communicator is still up
     * (so under mpirun no rank exits, and makes mpirun end the job, before
     * every rank has written its report); NULL: none.  Its status is
     * diag_run's. */
    ms_status (*emit)(const diag_report *r, void *arg);
    void *emit_arg;
} diag_config;

typedef struct {
    const char *name; /* "gemm", "memory", "comm", "storage" */
    int ok;           /* 1: passed (or skipped) */
    int slow;         /* with ok 0: failed on its speed alone (below the history's median or a
                       * floor), which a second measurement may pass; 0: failed otherwise */
    int skipped;      /* 1: not run; detail says why */
    double value;     /* the measured value, in unit */
    const char *unit;
    int has_limit;    /* 0: report only */
    int limit_is_max; /* 1: value must be <= limit; 0: >= limit */
    double limit;
    /* further measured values (storage: "read_mbps"; memory: "triad_gbps",
     * "update_gbps"), each NULL-named when unused */
    const char *aux_name[DIAG_MAX_AUX];
    double aux[DIAG_MAX_AUX];
    char detail[640];
} diag_result;

struct diag_report {
    char host[128];
    char node[MS_NODE_NAME_MAX];
    int rank, world;
    char device[16];
    diag_result checks[DIAG_MAX_CHECKS];
    int n;
    int ok; /* every check passed */
};

/* Check the values of c: MS_ERR_ARG naming the option (--gemm-n ...;
 * --history with --history-dir). */
ms_status diag_config_check(const diag_config *c);
/* Run every check into *r.  Failing checks are verdicts in *r, not errors;
 * the status is MS_ERR_ARG only for a backend this program lacks (--device
 * cuda in a CPU build), MS_ERR_IO for a history directory that cannot be
 * created (naming it), else c->emit's. */
ms_status diag_run(const diag_config *c, diag_report *r);
/* The report as a text table (check, value, limit, verdict), the details,
 * and a last line "diag: PASS" or "diag: FAIL (gemm, storage)". */
void diag_report_print(const diag_report *r, FILE *f);
/* The report as one JSON object (malloc'd, one line; NULL on OOM):
 * {"host","node","rank","world","device","checks":[{"name","ok","slow","skipped",
 * "value","unit","limit","detail"}...],"ok"}; limit is null when there is none,
 * slow true for a check that failed on its speed alone. */
char *diag_report_json(const diag_report *r);

/* ---- the planner's cost table of this machine (diag_costs.c) ------------
 * `megascale plan measure` turns it into a cluster file (src/plan).  In one
 * process (comm_only 0) it times the backend; under mpirun (comm_only 1)
 * the communicator over all ranks, and the GEMM speed of every rank at once
 * (these run together, so the figures hold for a job of that many ranks on
 * this machine, its other load included). */
typedef struct {
    const char *device;                     /* backend: "cpu" or "cuda" */
    int threads;                            /* CPU threads (0: all cores) */
    int comm_only;                          /* 1: the links only (needs >= 2 ranks) */
    const char *storage_dir;                /* where the storage speed is measured (NULL: not) */
    int attn_b, attn_t, attn_c, attn_heads; /* the attention shape timed */
} diag_cost_config;

#define DIAG_COST_GEMMS 8
typedef struct {
    int n_gemm;
    double gemm_n[DIAG_COST_GEMMS], gemm_gflops[DIAG_COST_GEMMS]; /* square products */
    double launch_us;        /* the operator's fixed cost: the slower of a 1 x 1 x 1 product
                              * and a one-element AdamW (an element-wise operator's) */
    double elem_gbps;        /* LayerNorm forward, bytes read + written per second */
    double ln_bwd_ratio;     /* LayerNorm backward time / forward time, same shape */
    double transc_gbps;      /* GeLU forward + backward: 3 passes, bytes read + written / s */
    double opt_ns_per_param; /* AdamW */
    double attn_s;           /* attention forward + backward of the configured shape */
    double memcpy_gbps, storage_gbps, mem_gb;
    int cores, threads;
    char device[128];
    /* comm_only */
    int ranks, rank;
    double lat_us, link_gbps; /* all-reduce ring step latency, bandwidth per rank */
    double group_init_ms;     /* one group of comm_grid_create */
    /* the cores the ranks have in effect: ranks x (a layer-shaped GEMM's time on one rank
     * alone / on every rank at once), the machine's other load included */
    double shared_cores;
    double busy_lat_us; /* lat_us of an all-reduce between compute phases on every rank */
    /* the fraction of a transfer's time that compute running beside it hides: 1 where
     * the bytes move without the cores (DMA, a NIC), near 0 where the cores copy them
     * (shared memory) or the transfer moves only while its rank waits on it */
    double overlap_eff;
} diag_costs;

/* Errors: the backend's, MS_ERR_NOMEM, MS_ERR_IO (storage), the
 * communicator's; MS_ERR_ARG for comm_only in a world of one. */
ms_status diag_measure_costs(const diag_cost_config *cfg, diag_costs *r);

/* A link's bandwidth (GB/s) from an all-reduce moving `bytes` per rank in
 * big_s and a one-element one in small_s (the latency both pay): bytes /
 * (big_s - small_s).  Where the difference is under a quarter of big_s,
 * it is the two timings' noise more than the transfer (a small all-reduce
 * timed on a busy moment can take as long as the big one), and a quarter
 * of big_s stands in for it: at most 4x bytes / big_s, never the
 * unbounded rate of a difference near 0. */
double diag_link_gbps(double bytes, double small_s, double big_s);

#endif
