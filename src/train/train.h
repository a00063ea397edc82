/* train.h - the trainer: builds the backend, model, optimiser and data
 * loaders from a train_config and runs the step loop (micro-batches with
 * gradient accumulation, optimiser, LR schedule, validation, metrics,
 * progress lines, weights export).
 *
 * Called by the `megascale train` and `megascale eval` subcommands.
 * train_run returns a status; the messages name the file / option at
 * fault.  A SIGINT/SIGTERM during the loop stops at the next step boundary
 * and still saves --save-weights.
 */
#ifndef TRAIN_TRAIN_H
#define TRAIN_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* --overlap: the dimensions whose communication is hidden behind compute */
enum { TRAIN_OVERLAP_DP = 1, TRAIN_OVERLAP_TP = 2, TRAIN_OVERLAP_PP = 4, TRAIN_OVERLAP_ALL = 7 };

typedef struct {
    /* model */
    char *model;                            /* preset name */
    int layers, dim, heads, vocab, seq_max; /* 0: from the preset / weights file */
    char *block;                            /* serial | parallel */
    int attn_window;
    char *recompute; /* none | gelu | ln | gelu,ln */
    /* compute */
    char *device;
    char *comm; /* device buffers between ranks: auto | nccl | mpi (staged) */
    int threads;
    /* CUDA backend (be_options): time every op; GeLU in the GEMM epilogue */
    int cuda_profile, cuda_fuse_gelu;
    int cpu_profile; /* CPU backend (be_options): time every op */
    char *cpu_dtype; /* CPU backend: fp32 | bf16 (be_dtype_parse) */
    int tp, pp, dp, vpp; /* parallel layout (world = tp*pp*dp; dp 0: world / (tp*pp)) */
    char *overlap;       /* all | none | a list of dp, tp, pp (train_overlap_parse) */
    /* data */
    char *train_data, *val_data, *data_order;
    int batch, micro_batch, seq;
    int val_every, val_batches;
    /* optimisation */
    int steps;
    char *optimizer, *lr_schedule;
    double lr, lr_floor, weight_decay, beta1, beta2, eps, grad_clip;
    int warmup;
    int max_bad_steps;  /* consecutive skipped (non-finite) steps tolerated */
    int nonfinite_redo; /* recomputations of a non-finite step before it is skipped */
    uint64_t seed;
    /* io */
    char *init_from, *save_weights, *metrics;
    /* --out-dir: one directory for the run's outputs (the CLI fills the
     * paths it implies into the unset options above and below); the
     * trainer creates it, and rank 0 writes config_text there as train.cfg */
    char *out_dir;
    char *log_file;    /* every printed line appended here too (base/log.h); NULL: none */
    char *config_text; /* the effective options as a config file, or NULL */
    char *save_dtype; /* --save-weights' dtype: "f32" (NULL too) or "bf16" */
    /* checkpoints (src/ckpt/ckpt.h) */
    char *ckpt_dir, *resume;
    char *ckpt_shm_dir; /* host-memory snapshots (NULL/"": /dev/shm) */
    char *ckpt_fault;   /* test fault POINT[@STEP][:RANK] (ckpt_fault.c); NULL/"": none */
    int ckpt_every, ckpt_keep;
    double ckpt_every_min;
    int new_run; /* --new-run: a fresh start in a --ckpt-dir with commits moves them aside */
    char *restart_job; /* --restart-job: launch's restart of the job with this id (ckpt.h) */
    double peak_flops;
    char *peak_cache; /* directory of the probed peak's cache (monitor/peakcache.h); NULL: none */
    int log_every;
    /* troubleshooting (docs/operations.md) */
    char *trace_dir;       /* NULL/"": next to --metrics; "none": off */
    int trace_clock_every; /* steps between clock references (0: start only) */
    double trace_max_mb;   /* bound of each rank's event log on disk (0: none) */
    double comm_timeout;   /* seconds per collective (<= 0: the communicator's default) */
    int comm_nccl_sync;    /* 1: a wait on an NCCL op blocks the host (comm_options) */
    char *config_json;     /* the effective options as JSON (for the metrics), or NULL */
    /* the options every rank must share (opts_spec.per_rank 0) as JSON,
     * compared over the ranks at start-up; NULL: nothing is compared */
    char *shared_json;
    /* supervision (megascale launch sets these through the environment) */
    char *heartbeat;       /* HOST:PORT of the driver, or NULL */
    char *heartbeat_token; /* the job's token */
    int heartbeat_attempt; /* the job's attempt the beats belong to (0: not sent) */
    char *node_map;        /* node names, comma-separated (base/node.h); NULL/"": the host name */
    /* injected faults (base/fault.h): --inject-fault, and --ckpt-fault
     * appended to it; one registry serves the trainer and the checkpoints */
    char *inject_fault;
} train_config;

ms_status train_run(const train_config *cfg);

/* An output file (option opt, path) that is one of the run's inputs (a
 * file of --train-data or --val-data, or --init-from), by identity, or a
 * file of a checkpoint (ckpt_is_part): the error naming opt, path and the
 * input (MS_ERR_ARG), else MS_OK.  train_run
 * checks its own outputs (--save-weights, --metrics, --log-file) with it
 * before anything is read; `megascale launch` checks them, and its
 * --events, before the job starts. */
ms_status train_check_not_input(const train_config *tc, const char *opt, const char *path);
/* The optimiser's --lr, --eps, --grad-clip and --weight-decay: each finite
 * and not 0 or subnormal in float (the clip and the decay may be 0), else
 * the error naming it (MS_ERR_ARG). */
ms_status train_check_hparams(const train_config *tc);
/* --restart-job as a job id into *job (0 when not given); MS_ERR_ARG for
 * one that is not 16 hex digits, or without --ckpt-dir. */
ms_status train_restart_job(const train_config *tc, uint64_t *job);
/* train_check_outputs: those three, and --resume auto with --new-run (one
 * continues the run in --ckpt-dir, the other starts a new one there). */
ms_status train_check_outputs(const train_config *tc);
/* The directory of the per-rank event logs and hang dumps (--trace-dir:
 * "" or NULL follows --metrics, DIR/trace beside it; "none" or "off", or
 * neither given: none, out[0] == 0), into out (cap bytes). */
void train_trace_dir(const train_config *tc, char *out, size_t cap);

/* A command's options failed before MPI started (st != MS_OK): under
 * mpirun, MPI with the default options and the error gate (train_gate.c),
 * so that rank 0 prints every rank's error once, naming the ranks, and
 * ms_error_reported() tells main it was printed.  Alone: st, as it is. */
ms_status train_gate_early(const char *cmd, ms_status st);

/* `megascale eval`: the validation loss of saved weights over the fixed
 * validation set, by the code of training's validation passes (no step).
 * Reads from cfg: init_from (a weights file) or resume (a commit, or a
 * checkpoint directory: its newest valid commit), exactly one; val_data
 * (NULL: the checkpoint's), val_batches, batch and seq (0: the
 * checkpoint's, or 10, 8 and 256 for a weights file), micro_batch, tp, pp (dp is world / (tp x
 * pp)), heads (a weights file without the count), device, comm, threads, the cuda switches,
 * comm_timeout, comm_nccl_sync and shared_json (compared over the ranks).  Alone or under mpirun;
 * every rank gets the same *out. Errors name the file: missing or damaged weights, no valid
 * checkpoint, too little data for the set, a token outside the model's vocabulary. */
typedef struct {
    double loss;               /* mean per target; perplexity exp(loss) */
    int64_t sequences, tokens; /* the set: sequences x seq targets */
    int batches, batch, seq, micro;
    int world, dp, tp, pp;
    int step;          /* the commit's step; -1 for a weights file */
    char source[4300]; /* the weights file, or the commit evaluated */
    char val_data[1024]; /* the glob scored (--val-data, or the checkpoint's) */
} train_eval_result;
ms_status train_eval(const train_config *cfg, train_eval_result *out);

#endif
