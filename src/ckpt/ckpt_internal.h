/* ckpt_internal.h - what the checkpoint files share with each other: the
 * slice math (ckpt_layout.c), the JSON of manifests and snapshots
 * (ckpt_manifest.c), fault injection (ckpt_fault.c), the /dev/shm slots
 * (ckpt_snapshot.c), the shard writer and commit (ckpt_persist.c) and the
 * reader (ckpt_load.c).  Not part of the module's interface. */
#ifndef CKPT_INTERNAL_H
#define CKPT_INTERNAL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/fault.h"

#include "ckpt/ckpt.h"
#include "comm/comm.h"

#define CKPT_FORMAT "megascale-checkpoint"
/* 2: manifest_crc32c (ckpt_manifest_seal); 1, before it, is still read */
#define CKPT_VERSION 2
#define CKPT_MANIFEST "manifest.json"
#define CKPT_STOPPED "stopped" /* DIR/stopped: a clean stop's step (ckpt_manager_mark_stopped) */

enum { CKPT_PARAM = 0, CKPT_MOM = 1, CKPT_VAR = 2, CKPT_NKINDS = 3 };

int ckpt_kind_parse(const char *s); /* -1 if unknown */

/* ---- layout (ckpt_layout.c) ---------------------------------------------- */

/* A run of one tensor that a rank holds in all three states, as one slice
 * of the logical tensor: box (offset, shape) and the flat range [begin,
 * end) of the box.  Box element k lies at element box_loc + (k / width) *
 * stride + k % width of the local shard (stride == width: contiguous). */
typedef struct {
    int tensor;          /* index in the logical tensor list (= manifest tensors) */
    uint64_t begin, end; /* flat range of the box */
    size_t param_off;    /* element offset of `begin` in the parameter buffer */
    float *mom, *var;    /* m, v of parameter-buffer element state_off; NULL offline */
    uint64_t data_off;   /* element offset of the run in a snapshot (param, then m, then v) */
    int local;           /* index in the model's table */
    int64_t box_off[CKPT_MAX_DIMS], box_shape[CKPT_MAX_DIMS];
    size_t box_loc, width, stride, tensor_off, state_off;
} ckpt_run;

/* The contiguous piece of run r from box element k (begin <= k < end): its
 * length; *pos receives its element offset in the parameter buffer. */
size_t ckpt_run_seg(const ckpt_run *r, uint64_t k, size_t *pos);

uint64_t ckpt_numel(const ckpt_tensor_info *t);
/* The whole model's logical tensors (Hugging Face order and shapes, wte:
 * vocab rows, not the padded count), also on a pipeline stage that holds
 * only some of them.  Caller frees *out. */
ms_status ckpt_tensors_of(gpt_model *m, ckpt_tensor_info **out, int *n);
/* The same from a configuration alone (a manifest's model). */
ms_status ckpt_tensors_of_config(const gpt_config *c, ckpt_tensor_info **out, int *n);
/* Index of a tensor by name in a list, -1 if absent. */
int ckpt_tensor_find(const ckpt_tensor_info *t, int n, const char *name);
/* The runs whose m/v this rank's optimiser holds, as slices of the logical
 * tensors (tensor-parallel shards are boxes; the padded vocabulary rows are
 * dropped).  The first *n_save runs are the ones this rank saves; the rest
 * are replicas that another rank saves (replicated tensors on tp ranks > 0,
 * the last pipeline stage's wte copy), kept in snapshots only.  Sets
 * data_off.  Caller frees *out. */
ms_status ckpt_runs_of_opt_save(gpt_model *m, opt_state *o, ckpt_run **out, int *n, int *n_save);
/* The same, without the count (every run of a tp = 1, pp = 1 model is saved). */
ms_status ckpt_runs_of_opt(gpt_model *m, opt_state *o, ckpt_run **out, int *n);
/* The slices of the local run [off, off+n) of the parameter buffer, in
 * local tensor i (logical tensor gi); mom/var NULL.  Caller frees *out. */
ms_status ckpt_runs_of_range(gpt_model *m, int i, int gi, size_t off, size_t n, ckpt_run **out,
                             int *nr);
/* The runs rank `rank` of `dp` ZeRO-2 ranks would own for model m (created
 * with gpt_create_aligned(..., 16 * dp)); mom/var NULL. */
ms_status ckpt_runs_of_dp(gpt_model *m, int dp, int rank, ckpt_run **out, int *n);
/* Elements of all runs (one state). */
uint64_t ckpt_runs_elems(const ckpt_run *r, int n);
/* The slice's box lies in the tensor and its range in the box
 * (MS_ERR_FORMAT naming where, the tensor and the state otherwise). */
ms_status ckpt_slice_check(const ckpt_tensor_info *t, const ckpt_slice *s, const char *where);
/* Copy a slice's elements (end - begin of them, src) into the logical
 * tensor dst (ckpt_numel(t) elements) through its box and range; checks
 * that the box lies in the tensor and the range in the box. */
ms_status ckpt_slice_scatter(const ckpt_tensor_info *t, const ckpt_slice *s, const float *src,
                             float *dst, const char *where);
void ckpt_slice_key(char *buf, size_t n, const char *tensor, int kind, uint64_t begin,
                    uint64_t end);
/* The same for a run (its box offset in the key unless it is 0). */
void ckpt_run_key(char *buf, size_t n, const char *tensor, int kind, const ckpt_run *r);

/* ---- JSON (ckpt_manifest.c) ---------------------------------------------- */

cJSON *ckpt_json_model(const gpt_config *c);
ms_status ckpt_json_model_parse(const cJSON *j, gpt_config *c, const char *where);
cJSON *ckpt_json_trainer(const ckpt_train_state *s);
ms_status ckpt_json_trainer_parse(const cJSON *j, ckpt_train_state *s, const char *where);
/* The slices of one rank's shard (its part of the manifest):
 * {"file":{"name","rank","bytes"},"slices":[...]}; crcs[3*i+kind]. */
cJSON *ckpt_json_part(const char *file, int rank, uint64_t bytes, const ckpt_tensor_info *tensors,
                      const ckpt_run *runs, int n_runs, const uint32_t *crcs);
/* What describes a commit besides the parts. */
typedef struct {
    int step, world, dp;
    const gpt_config *model;
    const char *optimizer;
    const ckpt_train_state *trainer;
    const ckpt_tensor_info *tensors;
    int n_tensors;
} ckpt_commit_info;
/* The manifest text (malloc'd) from the info and the parts of every rank,
 * in rank order.  NULL on allocation failure. */
char *ckpt_manifest_text(const ckpt_commit_info *ci, cJSON *const *parts, int n_parts);
/* The same with the tensor / pipeline layout (tp, pp, vpp). */
char *ckpt_manifest_text_layout(const ckpt_commit_info *ci, cJSON *const *parts, int n_parts,
                                int tp, int pp, int vpp);
/* Fill in text's manifest_crc32c (its "00000000") with the checksum of
 * text; returns text (NULL stays NULL).  For a manifest built by hand. */
char *ckpt_manifest_seal(char *text);
/* Parse and check DIR/manifest.json (format, version, references), no I/O
 * on the shards. */
ms_status ckpt_manifest_read(const char *dir, ckpt_manifest *mf);

/* ---- faults (ckpt_fault.c) ------------------------------------------------ */

typedef struct {
    ms_fault_plan plan; /* base/fault.h: the checkpoint's points are looked up in it */
    int armed;          /* some checkpoint point is in the plan (for this rank) */
    int serial;         /* one other than stage2:slow: stage 1 waits for the previous persist */
} ckpt_fault;

/* spec: a fault plan (base/fault.h; ckpt_options.fault, the trainer's
 * --inject-fault and --ckpt-fault together); the checkpoint points in it
 * are armed, the other kinds are the trainer's.  NULL or "": none. */
ms_status ckpt_fault_parse(const char *spec, ckpt_fault *f);
/* 1 when the fault `point` is armed for this step on this (global) rank. */
int ckpt_fault_hits(const ckpt_fault *f, const char *point, int step, int first);
/* The MS of a `point`=MS entry that hits (stage2:slow), 0 when none does. */
double ckpt_fault_delay_ms(const ckpt_fault *f, const char *point, int step, int first);
/* If it hits: print a line and SIGKILL this process. */
void ckpt_fault_kill(const ckpt_fault *f, const char *point, int step, int first);
/* The status of an injected I/O error on `path` ("write" + ENOSPC, ...). */
ms_status ckpt_fault_io_error(const char *path, const char *op, int err);

/* ---- /dev/shm slots (ckpt_snapshot.c) -------------------------------------- */

typedef struct ckpt_slot ckpt_slot; /* one mapped snapshot file */

typedef struct {
    int step, rank, world, dp;
    uint64_t job;
    int complete;
    gpt_config model;
    char optimizer[16];
    ckpt_train_state trainer;
    ckpt_run *runs; /* tensor, begin, end, data_off from the snapshot */
    int n_runs;
    const float *data; /* the mapped data section */
    uint64_t data_elems;
    uint32_t data_crc; /* its CRC32C as stage 1 recorded it (ckpt_snap_verify checks it) */
} ckpt_snap_view;

/* The job id in root/job (hex); create: make one when it is missing. */
ms_status ckpt_job_id(const char *root, int create, uint64_t *job);
/* Replace root/job with a fresh random id (atomically), so that no earlier
 * snapshot of root belongs to the job any more: a fresh start (no --resume)
 * never adopts the /dev/shm snapshots of a run it does not continue. */
ms_status ckpt_job_new(const char *root, uint64_t *job);
/* Directory for snapshots: shm_dir (ckpt_options.shm_dir), or /dev/shm when
 * it is NULL or "". */
const char *ckpt_shm_dir(const char *shm_dir);
/* Path of slot `slot` of `rank` in shm_dir for the job whose checkpoint root
 * is root. */
ms_status ckpt_shm_path(char *buf, size_t n, const char *shm_dir, const char *root, int rank,
                        int slot);
/* Create (or reuse) and map a slot sized for the runs; pages are populated.
 * Records root's real path (the checkpoint directory: ckpt_shm_orphans)
 * and holds a shared flock on the file until ckpt_slot_close (a live
 * holder: never removed by the tools). */
ms_status ckpt_slot_open(ckpt_slot **out, const char *path, const char *root, uint64_t data_elems,
                         size_t meta_cap);
void ckpt_slot_close(ckpt_slot *s, int remove);
const char *ckpt_slot_path(const ckpt_slot *s);
/* Stage 1: mark incomplete, write meta (JSON), copy the runs' param/m/v
 * from backend memory (runs in data_off order) and record the data's
 * CRC32C, mark complete. */
typedef struct {
    be_backend *be;
    const float *params;
    const ckpt_run *runs;
    int n_runs;
    const ckpt_fault *fault;
    int fault_first;
} ckpt_snap_src;
ms_status ckpt_slot_write(ckpt_slot *s, uint64_t job, int step, const char *meta,
                          const ckpt_snap_src *src);
/* The data against the CRC stage 1 recorded (one thread: for stage 2):
 * MS_ERR_FORMAT naming the slot file and the step on a mismatch. */
ms_status ckpt_slot_verify(const ckpt_slot *s);
/* Flip one bit of the slot's data (the fault stage2:flip-shm). */
void ckpt_slot_damage(ckpt_slot *s);
/* Step of the complete snapshot of job in the slot, -1 if none. */
int ckpt_slot_step(const ckpt_slot *s, uint64_t job);
/* 1 if the slot holds no complete snapshot of any job. */
int ckpt_slot_is_empty(const ckpt_slot *s);
const float *ckpt_slot_data(const ckpt_slot *s);
/* Read a snapshot file (mapped; *view valid until ckpt_snap_close). */
ms_status ckpt_snap_open(const char *path, ckpt_snap_view *view, void **handle);
void ckpt_snap_close(ckpt_snap_view *view, void *handle);
/* The view's data against its CRC (over the OpenMP threads): MS_ERR_FORMAT
 * naming path and the step on a mismatch. */
ms_status ckpt_snap_verify(const char *path, const ckpt_snap_view *view);
/* The snapshot's meta JSON. */
char *ckpt_snap_meta(uint64_t job, int step, int rank, int world, int dp, const gpt_config *model,
                     const char *optimizer, const ckpt_train_state *tr, const ckpt_run *runs,
                     int n_runs);

/* ---- shards and commits (ckpt_persist.c) ------------------------------------ */

/* Write one rank's shard (param, m, v of every run, data[data_off ...])
 * atomically to dir/name; crcs[3*i+kind] receive the slices' CRC32C. */
ms_status ckpt_shard_write(const char *dir, const char *name, int rank, int step,
                           const ckpt_tensor_info *tensors, const ckpt_run *runs, int n_runs,
                           const float *data, uint32_t *crcs, uint64_t *bytes,
                           const ckpt_fault *fault, int fault_first);
void ckpt_shard_name(char *buf, size_t n, int rank, int world);
/* DIR/.step_%08d.tmp */
void ckpt_staging_path(char *buf, size_t n, const char *root, int step);
/* rm -rf of a flat directory (files only); missing is fine.  Never follows
 * a symbolic link: dir itself being one is an error, links in it are
 * removed themselves. */
ms_status ckpt_rmdir_flat(const char *dir);
/* Fresh, empty staging directory for step (rank 0). */
ms_status ckpt_staging_create(const char *root, int step);
/* Rank 0: write the manifest into the staging dir, fsync, rename to
 * step_N (swapping out an older directory of the same step), replace
 * DIR/latest, keep the newest `keep` commits up to this one.  A commit
 * that stands with a warning (the directory's fsync or DIR/latest failed:
 * the disk) returns MS_OK and says it in warn (else "", warn may be NULL). */
ms_status ckpt_commit(const char *root, int step, const char *manifest, int keep,
                      const ckpt_fault *fault, int fault_first, char *warn, size_t warn_n);

/* The stage-2 thread. */
typedef struct ckpt_persist ckpt_persist;
typedef struct {
    const char *root;
    int keep;
    int rank, world, dp;
    comm_group *group; /* "ckpt" group; NULL alone */
    const gpt_config *model;
    const char *optimizer;
    const ckpt_tensor_info *tensors;
    int n_tensors;
    const ckpt_run *runs;
    int n_runs;
    const ckpt_fault *fault;
    int tp, pp, vpp;
} ckpt_persist_config;

/* Called by the stage-2 thread when a slot's persist has ended. */
typedef void (*ckpt_persist_done_fn)(void *ctx, int slot, int step, ms_status st);

ms_status ckpt_persist_start(ckpt_persist **out, const ckpt_persist_config *cfg);
/* Queue slot (its data, trainer state, the stage 1 that wrote it:
 * stall_ms, NaN if unknown) for stage 2.  The caller makes sure no other
 * is queued (ckpt_persist_queued_step): replacing a queued one is a
 * decision every rank must take alike, and one rank's persist thread may
 * have started it already. */
void ckpt_persist_enqueue(ckpt_persist *p, int slot, ckpt_slot *s, const ckpt_train_state *tr,
                          int first, double stall_ms);
/* The slot stage 1 may overwrite: prefer, unless stage 2 is writing it
 * (then fallback).  Nothing may be queued (the caller waited). */
int ckpt_persist_claim(ckpt_persist *p, int prefer, int fallback);
/* The step of the snapshot queued for stage 2 and not yet started, or -1. */
int ckpt_persist_queued_step(ckpt_persist *p);
/* Block until nothing is queued: the snapshot that was has been started by
 * stage 2 (the persist before it has ended), so its slot is the one being
 * written and the other is free.  Returns the seconds waited. */
double ckpt_persist_wait_queued(ckpt_persist *p);
/* Block until nothing is queued or running; the status of the last persist
 * (MS_OK if none ran) and the step of the last commit (-1 none). */
ms_status ckpt_persist_wait(ckpt_persist *p, int *last_commit);
/* Without blocking: the step of the last commit (-1 none), the persists
 * that failed since (0: the last one committed), and the last failure's
 * message ("" when fail_streak is 0). */
void ckpt_persist_status(ckpt_persist *p, int *last_commit, int *fail_streak, char *msg, size_t n);
/* Without blocking (rank 0, which commits): the commits that stood with a
 * warning so far, the step of the last one and its message. */
void ckpt_persist_warnings(ckpt_persist *p, int *warned, int *step, char *msg, size_t n);
/* Without blocking: up to max of the commit records not yet taken (rank 0
 * keeps the newest CKPT_COMMIT_QUEUE), oldest first; returns how many. */
#define CKPT_COMMIT_QUEUE 64
int ckpt_persist_take_commits(ckpt_persist *p, ckpt_commit_record *out, int max);
void ckpt_persist_stop(ckpt_persist *p);

/* ---- guards (ckpt_guard.c) ------------------------------------------------------ */

/* Take the exclusive lock of the checkpoint directory root (flock on
 * root/lock, held until ckpt_dir_unlock or the process's death; waits up
 * to 2 s for a holder that is exiting).  Another holder: MS_ERR_ARG naming
 * root (as the option flag names it: "--ckpt-dir", "--out") and the holder (pid, host,
 * since when).  *fd: the lock's descriptor. */
ms_status ckpt_dir_lock(const char *root, const char *flag, int *fd);
/* A tool's --out that it holds the lock of: MS_OK if nothing but the lock is there yet,
 * else MS_ERR_ARG (another command started at the same moment wrote it meanwhile). */
ms_status ckpt_out_still_new(const char *out, const char *tool);
void ckpt_dir_unlock(int fd); /* fd < 0: nothing */
/* A tool's output (tool: "ckpt export", ...) may not be the commit src, its
 * directory, a checkpoint directory (step_* / .step_* entries, latest, job,
 * lock, a manifest), a file in one, or a file of src, and must be writable
 * (ms_path_check_writable: a file, or with is_dir a directory made with
 * ms_mkdirs): MS_ERR_ARG naming out and what it is.  Call before writing
 * (and before validating src). */
ms_status ckpt_out_check(const char *src, const char *out, int is_dir, const char *tool);

/* ---- reading (ckpt_load.c) ----------------------------------------------------- */

typedef struct ckpt_reader ckpt_reader;
/* The step a directory's name says (.../step_00001234, trailing '/'
 * allowed), -1 if none. */
int ckpt_dir_step(const char *dir);
/* Open and validate dir (verify_crc: every slice's CRC too). */
ms_status ckpt_reader_open(ckpt_reader **out, const char *dir, int verify_crc);
void ckpt_reader_close(ckpt_reader *r);
const ckpt_manifest *ckpt_reader_manifest(const ckpt_reader *r);
/* Assemble logical tensor t's state `kind` into dst (ckpt_numel elements). */
ms_status ckpt_reader_tensor(ckpt_reader *r, int t, int kind, float *dst);
/* Check that the manifest's model is m's model (MS_ERR_ARG naming both). */
ms_status ckpt_check_model(const ckpt_manifest *mf, gpt_model *m, const char *dir);
/* Load a validated commit: r on the reading rank (dp rank 0, or alone),
 * NULL on the others, which receive every tensor over dp.  Parameters go to
 * the model (all of them), m and v to the runs (this rank's). */
ms_status ckpt_load_into(ckpt_reader *r, comm_group *dp, gpt_model *m, const ckpt_run *runs,
                         int n_runs);
/* Write the logical tensor `src` (state kind; ckpt_numel(t) elements) into
 * run r of the model (its parameters or its m / v). */
void ckpt_run_put(gpt_model *m, const ckpt_run *r, int kind, const ckpt_tensor_info *t,
                  const float *src);
/* 1 if a snapshot holds exactly these runs. */
int ckpt_snap_matches(const ckpt_snap_view *v, const ckpt_run *runs, int n_runs);
/* Load this rank's snapshot (matching runs) into its parameter runs, m
 * and v (local; with ZeRO the caller then all-gathers the parameters). */
ms_status ckpt_load_snapshot(const ckpt_snap_view *v, gpt_model *m, const ckpt_run *runs,
                             int n_runs);

#endif
