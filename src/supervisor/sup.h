/* sup.h - the robust-training driver (`megascale launch`): a separate
 * process that never calls MPI.  It starts the job through mpirun, listens
 * for the ranks' heartbeats (monitor/heartbeat.h) on a TCP socket bound to
 * loopback with a random per-job token, detects faults (a rank that exits
 * or reports an error, a rank that stops beating, a job that stops making
 * progress), stops every rank (a stop request or SIGTERM, then SIGTERM to
 * mpirun after a grace period, SIGKILL 5 s later), removes what a killed
 * mpirun leaves on its host (base/shm_sweep.h),
 * and restarts the job from its newest checkpoint (--resume auto), within a
 * restart budget and until the job finishes.  Everything it sees and does
 * goes to an events JSONL in the run directory, and a summary (faults by
 * kind, detection and recovery times, steps redone, effective training
 * time ratio) ends the run.  See docs/operations.md, "The supervisor".
 *
 * Who calls it: src/cli/cmd_launch.c.  Memory: everything is owned inside
 * sup_run.  Thread-safety: one thread (a poll loop).
 */
#ifndef SUP_SUP_H
#define SUP_SUP_H

#include <stddef.h>
#include <stdint.h>

/* Exit codes of `megascale launch` (docs/operations.md). */
enum {
    SUP_EXIT_DONE = 0,        /* the training finished */
    SUP_EXIT_ERROR = 1,       /* the driver itself failed (run directory, socket, spawn) */
    SUP_EXIT_USAGE = 2,       /* bad launch or train options */
    SUP_EXIT_GAVE_UP = 3,     /* the restart budget is spent */
    SUP_EXIT_NO_PROGRESS = 4, /* restarts made no progress: do not requeue */
    SUP_EXIT_STOPPED = 5,     /* stopped by SIGINT / SIGTERM to the driver */
    SUP_EXIT_NO_NODES = 6,    /* too few healthy nodes left (see the blocklist) */
    SUP_EXIT_STORAGE = 7,     /* the checkpoint storage fails on every node */
};

typedef struct {
    int np;                   /* ranks */
    int nodes;                /* nodes of the job (0: not given: one, or with a hostfile its
                                 hosts but the spares) */
    int spares;               /* nodes held back to replace evicted ones */
    const char *hostfile;     /* passed to mpirun (real hosts); NULL: this host */
    int max_restarts;         /* restarts allowed before giving up */
    double hb_timeout;        /* no beat from a rank for this long: it is hung (s) */
    double progress_factor;   /* no new step for factor x the longest recent step: hung */
    double startup_timeout;   /* from launch to every rank's first step (s) */
    double grace;             /* the stop request -> SIGTERM to mpirun (s) */
    double backoff;           /* wait before a restart (s), doubled per restart without progress */
    int no_progress_limit;    /* restarts in a row without a new step: stop (do not requeue) */
    const char *run_dir;      /* events, state; created */
    const char *events;       /* the events JSONL (NULL: RUN_DIR/events.jsonl) */
    const char *mpirun;       /* mpirun's path (NULL: "mpirun" on PATH) */
    const char *bin;          /* the megascale binary the ranks run (NULL: this one) */
    const char *bind;         /* heartbeat address (NULL: 127.0.0.1) */
    const char *extra_mpirun; /* more mpirun arguments, space-separated (may be NULL) */
    const char *faults;       /* a fault plan (base/fault.h) the driver hands out: each
                                 attempt gets the faults still ahead (chaos runs) */
    int diag;                 /* run megascale diag on the nodes after a fault (1) */
    double diag_timeout;      /* seconds the self-test may take */
    double diag_slow_factor;  /* diag --slow-factor (speed against the node's history), and
                                 against the other nodes' median */
    int diag_peers;           /* compare the nodes' speeds: 1, 0, -1 (with a hostfile only) */
    int preflight;            /* diag on every node before the first start (1) */
    double straggler_score;   /* a rank's score (others' median compute / its own) below this... */
    int straggler_rounds;     /* ...for this many steps in a row: a straggler (0: off) */
    double loss_spike_z;      /* a loss this many standard deviations above the window (0: off) */
    int ckpt_fail_limit;      /* checkpoints failing to commit in a row before a restart */
    int dashboard_port;       /* serve the dashboard on this port (0: any free one; < 0: off) */
    const char *dashboard_bind; /* its address (NULL: 127.0.0.1) */
    uint64_t compute_log_max_bytes; /* compute.jsonl rotated to .1 past this (0: never) */
    int train_argc;
    char **train_argv; /* the train options (after "--") */
    /* their effective values (--config files and the environment included), a JSON object's
     * text, or NULL: a job taken over or requeued is compared by these */
    const char *train_effective;
    /* their effective values (command line, --config file, --out-dir),
     * parsed by the caller before anything starts */
    const char *ckpt_dir; /* the job's checkpoints: restarts resume from there */
    const char *resume;   /* --resume ("": none): the first start's only */
    int new_run;          /* --new-run: the first start's only */
    int steps;            /* --steps: the job is done when its ranks reach it */
    int ckpt_every;       /* the train options' --ckpt-every (0: the final checkpoint only) */
    double ckpt_every_min; /* and --ckpt-every-min (0: none): the steps a checkpoint is at */
    const char *metrics;  /* --metrics ("": none given: the driver adds RUN_DIR's) */
    const char *trace_dir; /* --trace-dir as given ("": beside the metrics; none, off) */
    int peak_cache_given;  /* --peak-cache given (else the driver adds RUN_DIR) */
    const char *device;    /* --device: the diag checks that backend */
} sup_config;

/* Run the job to its end; returns the exit code (SUP_EXIT_*), having
 * printed why. */
int sup_run(const sup_config *c);

/* The heartbeat message parser, public for its tests (sup_beat.c). */
typedef struct {
    int rank, world, pid;
    char host[128];
    char node[64]; /* "" when not sent */
    int stage;     /* pipeline stage (pp coordinate); -1 when not sent */
    unsigned long long seq;
    int step;
    char phase[16]; /* start train val ckpt done stopped error */
    double step_ms, loss, grad_norm, comm_bytes, compute_ms; /* NaN when absent or null */
    double comm_wait_s; /* blocked in communication for, now (>= 0; NaN when absent) */
    int redone; /* steps redone after a non-finite result, finite then, cumulative (0: absent) */
    int start;  /* the step the training loop began at: where a resumed run started (-1: absent) */
    int attempt; /* the job's attempt that started the rank (megascale launch's; 0: absent) */
    int skipped, skip_step; /* updates skipped (not finite, nor their redos), cumulative, and
                               the last such step (0 and 0: absent) */
    /* the last step with a non-finite gradient (0: absent) and the ranks
     * whose own gradients it was in (the first n_nan_ranks <= 8) */
    int nan_step, nan_ranks[8], n_nan_ranks;
    int dumps;  /* hang dumps asked for by SIGUSR2 and answered so far (-1: absent) */
    int ckpt_commit, ckpt_failed; /* last commit (-1: absent), failed commits since (0) */
    char ckpt_error[512];
    /* commits that stood with a warning (the disk), the last one's step, its text (0: absent) */
    int ckpt_warned, ckpt_warn_step;
    char ckpt_warning[512];
    char error[1024];
    int usage;     /* phase error: the rank refused its options (it exits 2) */
    int stop_here; /* phase stopped: this rank was the one asked to stop (a signal to it) */
} sup_beat;
/* Parse one line (without its newline) strictly: JSON object, version 1,
 * the job's token, every required field with its type and range, no
 * unknown field.  Returns 0, or -1 with *why set to a static reason. */
int sup_beat_parse(const char *line, size_t len, const char *token, int world, sup_beat *out,
                   const char **why);

/* Whether a parsed beat b may be taken on a connection that has spoken for
 * conn_rank (-1: not yet) with last sequence number conn_seq, while
 * rank_connected says b's rank already has a connection of its own: NULL
 * to take it, else the reason to drop the connection (a beat for another
 * rank than the connection's, a sequence number not above the last, a
 * second connection for a rank, a rank of another attempt than the driver's
 * current one: attempt, 0 when unknown). */
const char *sup_beat_admit(const sup_beat *b, int conn_rank, unsigned long long conn_seq,
                           int rank_connected, int attempt);

/* The control socket (sup_ctl.c): one line a connection. */
#define SUP_CTL_LINE_MAX 1024
typedef struct {
    char cmd[16];  /* "evict", "status", "dump" */
    char node[64]; /* evict's node */
} sup_ctl_msg;
/* Parse one control line strictly (version 1, the job's token, a known
 * command and its argument, no other field).  0, or -1 with *why set. */
int sup_ctl_parse(const char *line, size_t len, const char *token, sup_ctl_msg *out,
                  const char **why);
/* `megascale launch --ctl RUN_DIR CMD [ARG]`: send one command to the
 * driver of RUN_DIR and print its reply; returns the exit code. */
int sup_ctl_client(const char *run_dir, int argc, char **argv);

/* 1 if the string got equals the job's token, compared in constant time
 * in the token's length (the heartbeat and control parsers). */
int sup_token_eq(const char *got, const char *token);

#endif
