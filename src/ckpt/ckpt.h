/* ckpt.h - two-stage asynchronous checkpoints: save, validate, resume,
 * reshard, export.
 *
 * Format (docs/formats.md, "Checkpoints"): DIR/step_00001234/ holds one
 * safetensors shard per rank ("shard-00000-of-00002.safetensors") and a
 * manifest.json written last.  Every piece of state is a *slice*: (tensor
 * name, state "param" | "m" | "v", a box of the logical Hugging Face-shaped
 * tensor (offset and shape per dimension) and a flat element range
 * [begin, end) of that box in row-major order), with the CRC32C of its
 * bytes.  A tensor-parallel shard is one box (three for c_attn: its q, k,
 * v columns; wte clipped to the real vocabulary), a ZeRO run one flat
 * range per box; replicated tensors are saved by tp rank 0 only and wte by
 * pipeline stage 0 only.  A loader assembles any set of slices into
 * logical tensors, so any dp / tp / pp layout loads any other.  A directory becomes a
 * commit when the staging directory DIR/.step_00001234.tmp (shards, then
 * the manifest, all fsynced) is renamed to its final name; DIR/latest is
 * then replaced atomically.  A directory without a valid manifest does not
 * exist for the loader.
 *
 * Saving (ckpt_manager, used by the trainer): stage 1 copies this rank's
 * parameters (the runs it owns), m, v and the trainer state into a host
 * snapshot in /dev/shm (a file that outlives a crashed process; two slots,
 * so a new snapshot never overwrites one being persisted; when both are
 * busy, one being persisted and one waiting for it, the checkpoint waits
 * for that persist to end rather than be skipped) and returns;
 * stage 2, a background thread, writes the shard, agrees with the other
 * ranks (a private "ckpt" communicator group, so it never interleaves with
 * the training thread's collectives), and rank 0 commits and keeps the last
 * K commits.  A failed stage 2 never touches a commit.
 *
 * Loading: --resume auto picks the newest commit that validates (sizes,
 * safetensors headers, every slice's CRC) or a complete /dev/shm snapshot
 * of the same job (same DIR/job id) that is newer; a damaged commit is
 * reported (file, tensor) and the previous one is tried.  Rank 0 chooses;
 * dp rank 0 of each (tp, pp) position reads, then broadcasts each logical
 * tensor its stage holds over the dp group; every rank cuts out its shard's
 * parameters and the m/v runs it owns.  A /dev/shm snapshot is used only when every
 * rank has one of that step with the same layout; each rank then reads its
 * own and the parameters are all-gathered.
 *
 * Faults for tests: ckpt_options.fault = POINT[@STEP][:RANK] (see ckpt_fault.c;
 * the trainer's --ckpt-fault, env MS_CKPT_FAULT).
 *
 * Threads: a manager is driven by one thread (the trainer's); it owns the
 * stage-2 thread.  The offline functions are independent and thread-safe.
 * Memory: objects returned through out-parameters are owned by the caller
 * and freed with the matching _free/_destroy.
 */
#ifndef CKPT_CKPT_H
#define CKPT_CKPT_H

#include <stdint.h>

#include "base/status.h"
#include "ckpt/safetensors.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "optim/optim.h"
#include "parallel/zero.h"

#define CKPT_MAX_DIMS 2

typedef struct {
    const char *dir;    /* --ckpt-dir: where commits go; NULL or "" disables saving */
    int every_steps;    /* a checkpoint every N steps (0: off) */
    double every_min;   /* and every M minutes (0: off) */
    int keep;           /* commits kept, >= 1 */
    const char *resume; /* NULL/"": fresh start; "auto": newest valid; else a step dir or a DIR */
    /* --ckpt-shm-dir: where the host snapshots live; NULL or "": /dev/shm */
    const char *shm_dir;
    /* --ckpt-fault (tests): POINT[@STEP][:RANK] (ckpt_fault.c); NULL or "": none */
    const char *fault;
    /* a fresh start (resume "") in a DIR that holds commits: 0 refuses (they
     * would mix with this run's, and --resume auto would later pick the
     * older run's higher step); 1 (--new-run) moves them to
     * DIR/previous-YYYYmmdd-HHMMSS/ first */
    int new_run;
    /* nonzero (train --restart-job, set by `megascale launch`): a restart
     * of the job whose first start wrote this id to DIR/job and has no
     * commit of its own yet.  When DIR/job still holds it, that start's
     * set-up (--new-run's move, a rollback's, a foreign --resume's new id)
     * is not done again, and the state resumed is the job's own newest (its
     * /dev/shm snapshots, its commits in DIR: as --resume auto), else
     * --resume's PATH (else a fresh start).  Before, each restart was a
     * first start again and disowned the job's own snapshots. */
    uint64_t restart_job;
} ckpt_options;

/* The trainer's state besides the tensors.  The model's initialisation RNG
 * is counter-based (a pure function of seed, tensor, element) and the data
 * order a pure function of (seed, cursor), so seed + cursor + step are the
 * whole random state. */
typedef struct {
    int step;      /* optimiser steps done: the loop continues at this index */
    int opt_steps; /* the optimiser's update count t (steps minus skipped ones) */
    uint64_t seed;
    data_cursor cursor; /* the consumer's cursor after the last batch of `step` */
    opt_schedule sched; /* the LR schedule (a pure function of step) */
    int batch, seq;
    /* training tokens consumed through `step`, over every earlier --batch
     * and --seq (0: not recorded, a commit before it was: step x batch x seq) */
    uint64_t tokens;
    /* what a resume compares and names (absent in older commits: "" / NaN) */
    char optimizer[16];
    double beta1, beta2, eps, weight_decay, grad_clip;
    char train_data[1024], val_data[1024]; /* the globs as given */
    /* --data-order: what the cursor's pos counts (windows of the shuffle, or
     * tokens); "" in older commits */
    char data_order[16];
    /* the training data set the cursor points into: its shards and tokens
     * (0: not recorded, an older commit); a resume warns when they changed
     * under the same glob */
    uint64_t data_shards, data_tokens;
    /* --val-batches of the validation set over val_data (0: none, or not
     * recorded: an older commit); eval takes it as its default */
    int val_batches;
} ckpt_train_state;

/* ---- the checkpoint directory across hosts ---------------------------------- */

/* Collective over the world (nothing alone or without dir): every rank
 * writes a probe file DIR/.probe-TOKEN-rRANK (atomically: fsync, rename;
 * TOKEN random, from rank 0), then reads rank 0's and its neighbour's
 * (rank+1), and the probes are removed.  MS_ERR_ARG on every rank, with
 * the same message, when a rank could not write its probe or could not
 * see another's, naming the ranks and their hosts ("rank 2 (on gpu-b)
 * cannot see the probe file of rank 0 (on gpu-a)"): DIR is not one
 * directory that every host shares.  Communication errors as the
 * communicator reports them. */
ms_status ckpt_dir_probe(const char *dir, comm_world *w);

/* ---- the trainer's manager ---------------------------------------------- */

typedef struct ckpt_manager ckpt_manager;

/* zero NULL: one rank.  With zero, collective over the world (creates the
 * "ckpt" group).  Creates DIR and its job id, and the /dev/shm slots. */
ms_status ckpt_manager_create(ckpt_manager **out, const ckpt_options *o, gpt_model *m,
                              opt_state *opt, par_zero *zero);
/* The same for any tensor / pipeline / data-parallel layout: w is the job's
 * world (NULL alone), zero the dp sharding (NULL without dp).  Collective
 * over the world. */
ms_status ckpt_manager_create_world(ckpt_manager **out, const ckpt_options *o, gpt_model *m,
                                    opt_state *opt, par_zero *zero, comm_world *w);
/* Load the checkpoint --resume asks for into the model and optimiser (sets
 * the optimiser's update count).  *found = 0: nothing to resume (fresh
 * start).  now: this run's state, compared with the saved one (warnings).
 * Call before the data prefetch thread starts; seek the loader to
 * out->cursor.  Collective over the dp group. */
ms_status ckpt_manager_resume(ckpt_manager *cm, const ckpt_train_state *now, ckpt_train_state *out,
                              int *found);
/* After each step: agree on a stop across ranks (SIGTERM seen by any rank
 * stops all at the same step: sets ms_ctx.stop) and checkpoint when
 * --ckpt-every / --ckpt-every-min say so (first waiting for stage 2 when
 * both slots are busy on some rank).  Collective over the world. */
ms_status ckpt_manager_step(ckpt_manager *cm, const ckpt_train_state *st);
/* 1 if the last ckpt_manager_step agreed to stop: the same on every rank,
 * unlike ms_ctx.stop, which a signal may set on one rank after the
 * agreement and on another before it (0 before the first step). */
int ckpt_manager_stop_agreed(const ckpt_manager *cm);
/* Stage 1 now, stage 2 queued. */
ms_status ckpt_manager_save(ckpt_manager *cm, const ckpt_train_state *st);
/* hold 1: the trainer is in a streak of skipped (non-finite) steps, so
 * ckpt_manager_step still agrees on stops but takes no checkpoint, and
 * ckpt_manager_finish takes no final one (the newest checkpoint never holds
 * a skipped step); hold 0: the normal schedule again.  Every rank must pass
 * the same value at the same step. */
void ckpt_manager_hold(ckpt_manager *cm, int hold);
/* Without blocking, for the supervisor's heartbeat: the step of this
 * rank's last commit (-1 none), the checkpoints that failed to commit since
 * (0: the last one committed) and the last failure's message. */
void ckpt_manager_commit_status(ckpt_manager *cm, int *last_commit, int *fail_streak, char *msg,
                                size_t n);
/* Without blocking, on rank 0 (the rank that commits): the commits that
 * stood with a warning so far (the directory's fsync after the rename, or
 * DIR/latest, failed: the commit loads, but the disk is suspect), the step
 * of the last one (-1: none) and its message. */
void ckpt_manager_commit_warnings(ckpt_manager *cm, int *warned, int *step, char *msg, size_t n);
/* One committed checkpoint, as rank 0 saw it. */
typedef struct {
    int step;          /* the checkpoint's step */
    uint64_t bytes;    /* its size: the shard files of every rank together */
    double stall_ms;   /* its stage 1 on this rank (NaN: unknown, e.g. a snapshot resumed from) */
    double persist_ms; /* its stage 2 on this rank, from the persist's start to the commit */
    double wall_s;     /* epoch seconds of the commit */
} ckpt_commit_record;
/* Without blocking: move up to max of the commits not yet taken into out,
 * oldest (lowest step) first; returns how many.  Rank 0 only (the other
 * ranks never hold any: only rank 0 knows every shard's size); the
 * stage-2 thread keeps the newest 64 between calls. */
int ckpt_manager_take_commits(ckpt_manager *cm, ckpt_commit_record *out, int max);
/* fn(ctx) is called on the training thread before it waits for stage 2 (a
 * checkpoint that found both slots busy, the final checkpoint), e.g. to
 * tell the supervisor that no step comes for a while (heartbeat phase
 * "ckpt").  NULL: none. */
void ckpt_manager_set_wait_hook(ckpt_manager *cm, void (*fn)(void *ctx), void *ctx);
/* The checkpoints that found both slots busy (on some rank) and waited. */
int ckpt_manager_waits(const ckpt_manager *cm);
/* This process's node name (base/node.h), for the checkpoint's fault
 * entries with a ":node=NAME" target (NULL or "": they never fire). */
void ckpt_manager_set_node(ckpt_manager *cm, const char *node);
/* Rank 0 after --new-run moved an earlier run's commits: that directory
 * (DIR/previous-STAMP), where the trainer moves the run's other records
 * (its metrics, train.cfg) before replacing them; "" otherwise. */
const char *ckpt_manager_previous(const ckpt_manager *cm);
/* Rank 0, after the final checkpoint of a run stopped by a signal short of
 * --steps: DIR/stopped says "step N" (N committed), so that a supervisor
 * that finds the job gone tells a clean stop from a crash; an accepted
 * start removes it (best effort: a warning on failure). */
void ckpt_manager_mark_stopped(ckpt_manager *cm, int step);
/* The caller accepts the start (the resume, and what it checks of the
 * resumed state: the data position): rank 0 removes DIR/stopped.  Before
 * it, a refused start leaves the directory as it was, and destroy removes
 * the host-memory slots it made and never filled.  NULL is ignored. */
void ckpt_manager_accepted(ckpt_manager *cm);
/* Final checkpoint (unless st->step was already saved, or a hold is on),
 * then wait for stage 2; returns the status of that last persist. */
ms_status ckpt_manager_finish(ckpt_manager *cm, const ckpt_train_state *st);
/* Wait for stage 2 and return the status of the last persist. */
ms_status ckpt_manager_wait(ckpt_manager *cm);
/* Stop the stage-2 thread (after the queued persist), free.  The /dev/shm
 * slots are removed only after a successful ckpt_manager_finish. */
void ckpt_manager_destroy(ckpt_manager *cm);
/* Seconds the last stage 1 took (for benchmarks). */
double ckpt_manager_last_stall(const ckpt_manager *cm);

/* ---- reading checkpoints (tools, loader) --------------------------------- */

typedef struct {
    char name[64];
    int ndim;
    int64_t shape[CKPT_MAX_DIMS]; /* logical (Hugging Face) shape */
} ckpt_tensor_info;

typedef struct {
    int tensor; /* index into ckpt_manifest.tensors */
    int kind;   /* 0 param, 1 m, 2 v */
    int file;   /* index into ckpt_manifest.files */
    char key[96];
    int64_t box_off[CKPT_MAX_DIMS], box_shape[CKPT_MAX_DIMS];
    uint64_t begin, end; /* flat range of the box, row-major */
    uint32_t crc;
} ckpt_slice;

typedef struct {
    char name[64];
    int rank;
    uint64_t bytes;
} ckpt_file_info;

typedef struct {
    int version;
    int step;
    double created; /* unix time */
    int world, dp, tp, pp;
    int vpp; /* the interleaved pipeline's model chunks per stage (1: none, or older) */
    gpt_config model;
    char optimizer[16];
    ckpt_train_state trainer;
    int n_tensors, n_files, n_slices;
    ckpt_tensor_info *tensors;
    ckpt_file_info *files;
    ckpt_slice *slices;
} ckpt_manifest;

void ckpt_manifest_free(ckpt_manifest *mf);
const char *ckpt_kind_name(int kind); /* "param", "m", "v" */

/* Validate the step directory `dir` completely (manifest, step number,
 * file sizes, safetensors headers, every slice's CRC32C and coverage);
 * fills *mf when mf is not NULL.  The message names the file and tensor. */
ms_status ckpt_verify(const char *dir, ckpt_manifest *mf);
/* The same; check_crc 0 skips the CRCs (reads only the headers: quick). */
ms_status ckpt_validate(const char *dir, int check_crc, ckpt_manifest *mf);

/* Steps of the directories DIR/step_* in DIR, newest first (caller frees
 * *steps).  No directory is not an error (*n = 0). */
ms_status ckpt_list_steps(const char *root, int **steps, int *n);
/* DIR/step_%08d */
void ckpt_step_path(char *buf, size_t n, const char *root, int step);

/* 1 if path is a step directory: it holds a manifest, or its name is
 * step_N (N a number). */
int ckpt_is_step_dir(const char *path);
/* Whether path can be a checkpoint: MS_ERR_ARG when it is a file, "<what>PATH
 * is a file, not a checkpoint (a commit DIR/step_N or a checkpoint
 * directory)", MS_ERR_NOTFOUND when it does not exist, "<what>PATH does not
 * exist (...)"; what names the option or command ("--resume ",
 * "ckpt list: ", or ""). */
ms_status ckpt_check_path(const char *what, const char *path);
/* 1 if path is the `latest` file of a checkpoint directory and names a
 * commit directory there (step_N): that commit's path into out (n bytes).
 * Every command that takes a checkpoint takes DIR/latest as that commit
 * (ckpt_check_path, ckpt_find_commit, --resume). */
int ckpt_latest_target(const char *path, char *out, size_t n);
/* 1 if path is a directory that holds what a checkpoint holds: a commit
 * (its manifest) or a checkpoint directory (step_* commits, latest, job,
 * lock), or DIR/latest naming a commit.  What `megascale sample --weights`
 * and `eval --weights` take as a checkpoint, and what train --init-from
 * refuses with the way to use it. */
int ckpt_is_checkpoint(const char *path);
/* 1 if path is a file that a checkpoint holds: a file of a commit (its
 * directory holds a manifest; existing or not: a new file there is pruned
 * with the commit), or the existing latest, job or lock file of a
 * checkpoint directory; which one, in words, into what (n bytes).
 * An output of another kind (train --save-weights, --metrics, --log-file)
 * that is one would damage a commit. */
int ckpt_is_part(const char *path, char *what, size_t n); /* NULL or "": 0 */
/* path itself when it is a step directory, else the newest commit of the
 * checkpoint directory path that verifies (every file size and CRC), into
 * out; each commit skipped is a warning naming it and why.
 * MS_ERR_NOTFOUND naming path when none does. */
ms_status ckpt_find_commit(const char *path, char *out, size_t n);
/* The parameters (not the optimiser state) of the commit dir into m, for
 * any layout of m (tp shards, a pipeline stage) whatever layout wrote it;
 * the commit's model must be m's (MS_ERR_ARG naming both).  dp NULL: this
 * rank reads and verifies the commit (every CRC); else rank 0 of the dp
 * group does and broadcasts each tensor to the others (collective over
 * dp; its failure fails every rank of the group). */
ms_status ckpt_load_params(const char *dir, gpt_model *m, comm_group *dp);

/* One Hugging Face GPT-2-named safetensors file with the parameters of the
 * checkpoint `dir` (loadable by sample --weights and train --init-from). */
ms_status ckpt_export_hf(const char *dir, const char *out, ckpt_st_dtype dtype);
/* Rewrite the checkpoint `dir` for `dp` data-parallel ranks into
 * OUT/step_N (a commit, with OUT/latest). */
ms_status ckpt_reshard(const char *dir, int dp, const char *out_root);
/* An export's or reshard's --out, checked before the source commit is
 * validated (ckpt_find_commit CRC-checks commits, minutes on a large one):
 * every check of the tools' own where path is a commit (out is not it, nor
 * its directory or one of its files), and where path is a directory of
 * checkpoints what needs no commit: out is no checkpoint directory, not in
 * one, and writable (a file, or with is_dir a directory).  MS_ERR_ARG /
 * the path's error, naming tool and out; the tools check again, against
 * the commit found, before writing. */
ms_status ckpt_out_precheck(const char *path, const char *out, int is_dir, const char *tool);

/* Host-memory snapshots (in shm_dir; NULL/"": /dev/shm) of the job whose
 * checkpoint directory is root: prints one line per slot to stdout (path,
 * step, rank, or why it is invalid: incomplete, a data CRC mismatch, ...);
 * remove: unlink them, except those a live process holds, and (unless
 * force) a valid snapshot of this job newer than every commit of root: the
 * only copy of that state (train --resume auto persists it). */
ms_status ckpt_shm_list(const char *root, const char *shm_dir, int remove, int force);
/* The snapshot directory (NULL or "": /dev/shm) exists and is one, else MS_ERR_ARG naming
 * --ckpt-shm-dir and what is wrong (said when it is named, not as a slot's open). */
ms_status ckpt_shm_dir_check(const char *shm_dir);
/* Remove the job's slots in shm_dir of ranks >= world (left by a run with
 * more ranks), except those a live process holds. */
void ckpt_shm_remove_beyond(const char *root, const char *shm_dir, int world);
/* Orphans: the slots in shm_dir (NULL/"": /dev/shm) of this user whose
 * recorded checkpoint directory no longer exists, so nothing can resume
 * from them or list them by directory, and that no live process holds.
 * print: a line per slot considered to stdout (orphan / removed / held
 * by a live process / of an older format, which records no directory),
 * then a summary; remove: unlink the orphans.  *n, *bytes (either may be
 * NULL): the orphans found and their size. */
ms_status ckpt_shm_orphans(const char *shm_dir, int remove, int print, int *n, uint64_t *bytes);

#endif
