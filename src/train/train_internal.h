/* train_internal.h - helpers shared by the trainer's files. */
#ifndef TRAIN_INTERNAL_H
#define TRAIN_INTERNAL_H

#include "comm/grid.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "train/train.h"

/* Model configuration from the preset / explicit flags / --init-from file.
 * opt: the option that named tc->init_from (train's --init-from, eval's
 * --weights): the errors with a weights file start with it. */
ms_status train_model_config(const train_config *tc, const char *opt, gpt_config *out);
/* The model of a config read elsewhere (a commit's manifest, from source),
 * the shape options given checked against it, as for a weights file. */
ms_status train_model_config_of(const train_config *tc, const gpt_config *have, const char *source,
                                gpt_config *out);
/* Cross-option checks for dp data-parallel ranks; sets the per-rank
 * micro-batch size and the accumulation steps. */
ms_status train_check(const train_config *tc, const gpt_config *c, int dp, int *micro, int *accum);
/* --batch against the dp ranks and --micro-batch (0: batch / dp): batch a
 * multiple of dp, batch / dp a multiple of the micro-batch (MS_ERR_ARG
 * naming them); sets the micro-batch and the accumulation steps. */
ms_status train_check_batch(int batch, int micro_batch, int dp, int *micro, int *accum);
/* Checks for --tp tensor-parallel ranks (with sequence parallelism) on
 * micro-batches of `micro` sequences: heads and micro*seq divisible by tp
 * (MS_ERR_ARG naming them; --pp and --vpp are train_model_create's). */
ms_status train_check_tp(const train_config *tc, const gpt_config *c, int micro);

/* The data-parallel size of a world of `world` ranks: --dp, or when it is
 * not given world / (tp x pp); 0 when that does not divide. */
int train_dp_of(const train_config *tc, int world);
/* The layout's checks for a world of `world` ranks (*dp: train_dp_of):
 * MS_ERR_ARG naming --tp, --pp and the world when they do not divide it
 * (--dp not given), naming all four when tp x pp x dp is not the world,
 * and for --vpp > 1 without --pp >= 2. */
ms_status train_check_layout(const train_config *tc, int world, int *dp);
/* Rank 0, pp > 1 and 1F1B (--vpp 1): one warning when the step's accum
 * micro-batches are fewer than the pp stages, with the schedule's bubble
 * and the --micro-batch (or --batch) that gives one micro-batch per stage.
 * With --vpp > 1 that layout is refused by the schedule, and n_layer not divisible by
 * pp x vpp by the model: no warning (it came before the refusal that ended the run). */
void train_warn_pipeline(const train_config *tc, int n_layer, int dp, int pp, int accum);

/* train_gate.c: a multi-rank command's errors printed once, by rank 0,
 * naming the failing ranks.  train_gate_open: collective over the world
 * (the gate's own communicator), then the first pass with st.
 * train_gate_pass: collective over the world; st MS_OK on every rank
 * returns MS_OK; when some rank failed, rank 0 prints one line per
 * distinct message ("megascale CMD: error (ranks 0-2 of 8): ..."), and
 * every rank returns a failure marked reported (ms_error_reported): its
 * own, or the first failed rank's (the message names it).  A failed rank
 * whose gate times out (GATE_WAIT_S: the others are elsewhere) returns st
 * unreported, for main to print.  NULL g: st.  train_gate_early: train.h. */
typedef struct train_gate train_gate;
ms_status train_gate_open(comm_world *w, const char *cmd, ms_status st, train_gate **out);
ms_status train_gate_pass(train_gate *g, ms_status st);
void train_gate_close(train_gate *g); /* before the world is finalized; NULL ignored */
/* A command's end under the gate (after its groups were destroyed): the
 * gate closed, then MPI finalized when that is safe: every rank succeeded,
 * or they all know of the failure (reported).  st != MS_OK: returned with
 * its message and reported mark kept; else the finalize's status.  g and
 * w may be NULL. */
ms_status train_gate_end(train_gate *g, comm_world *w, ms_status st);

/* train_dist.c.  train_dist_open: alone (the run context's world is 1)
 * only the layout's checks, *world, *grid and *gate NULL; under mpirun MPI
 * with --comm-timeout, the error gate of command cmd (its first pass), the
 * ranks' agreement on shared_json (train_agree), the layout's checks (*dp)
 * and the rank grid (tp x pp x dp).  The caller passes its later results
 * through the gate, closes it and destroys the grid, then finalizes the
 * world. */
typedef struct train_pipe train_pipe;
ms_status train_dist_open(const train_config *tc, const char *cmd, comm_world **world,
                          comm_grid **grid, int *dp, train_gate **gate);
/* Rank 0 (others: nothing): the line naming every rank's host and
 * coordinate, and a warning when a tensor-parallel group spans hosts. */
void train_dist_log_hosts(comm_world *w, const comm_grid *g);
/* With a device backend and several ranks: the communicator learns to stage
 * device buffers through pinned host memory (MPI), and, per --comm, the tp,
 * dp and pp groups get NCCL communicators.  auto: NCCL on every group whose
 * ranks have distinct GPUs, MPI staging on the others (several ranks
 * sharing one GPU, which NCCL cannot do); nccl: NCCL or an error; mpi:
 * staging only.  MS_ERR_ARG for another --comm. */
ms_status train_dist_device(const train_config *tc, comm_world *world, comm_grid *grid,
                            be_backend *be);
/* The model for micro-batches of `micro` x --seq: whole (tensor parallel
 * over the grid's tp group when --tp > 1), or with --pp this rank's stage,
 * its activation sets following from the schedule of n_micro micro-batches
 * (*pipe: that schedule, attached; NULL without --pp).  align: the
 * gradient ranges' alignment (16 x dp for ZeRO).  Parameters are zero. */
ms_status train_model_create(const train_config *tc, const gpt_config *mc, be_backend *be,
                             comm_world *world, comm_grid *grid, int micro, int n_micro,
                             size_t align, gpt_model **m, train_pipe **pipe);

/* train_agree.c: collective over the world, before any collective whose
 * shape or count follows from the options: shared_json (train_config;
 * "dp" taken as dp when dp > 0) against every other rank's.  MS_ERR_ARG on
 * every rank, with the same message, when they differ: "the ranks' options
 * differ: --dim is 128 on ranks 0-2 but 64 on rank 3; ..." (up to three
 * options with their values, then the names of the others); communication
 * errors (a rank that never came) as the communicator reports them. */
ms_status train_agree(comm_world *w, const char *shared_json, int dp);

/* train_pipeline.c: one stage's pipeline schedule over a stage model.
 * Usage: train_pipe_plan (collective over the world: creates the
 * "embedding" group), gpt_stage_init with train_pipe_slots activation
 * sets, gpt_create_stage, train_pipe_attach; per step train_pipe_step with
 * the step's n_micro micro-batches (inp, tgt: (n_micro, B, T) host, read
 * by the stages that need them), ZeRO armed around it by the caller.
 * Errors: par_schedule's own (n_micro invalid for the interleaved
 * schedule), communication failures (naming op and peers). */
ms_status train_pipe_plan(train_pipe **out, comm_grid *grid, comm_world *world, int vpp,
                          int n_micro);
int train_pipe_slots(const train_pipe *p);
/* Allocate the send buffers for (B,T) micro-batches of model m. */
ms_status train_pipe_attach(train_pipe *p, gpt_model *m, int B, int T);
void train_pipe_destroy(train_pipe *p);
/* Run the step's schedule; *loss = the sum of the micro-batches' mean
 * losses, equal on every stage (broadcast from the last).  The tied wte
 * gradients are summed over the first and last stage (and reported to the
 * grad hook, gpt_embedding_grads_ready) before returning. */
ms_status train_pipe_step(train_pipe *p, const int32_t *inp, const int32_t *tgt, int B, int T,
                          float dloss, double *loss);
/* Forward only of one (B,T) micro-batch (B <= the attached B) through all
 * stages: the last stage's model then holds its losses (gpt_row_losses). */
ms_status train_pipe_eval(train_pipe *p, const int32_t *inp, const int32_t *tgt, int B, int T);
int train_pipe_last_stage(const train_pipe *p);
/* Seconds the last step waited on pipeline receives (the bubble). */
double train_pipe_bubble(const train_pipe *p);
/* Pipeline overlap (--overlap pp, the default): 1 runs the decoupled list
 * (PAR_COMM_OVERLAP: each send and receive posted early and waited late)
 * and overlaps the tied-embedding sum with the first stage's cool-down; 0
 * runs the coupled blocking list (PAR_COMM_BLOCKING) and sums the
 * embedding with a blocking all-reduce after it.  Same bits either way.
 * Default 1. */
void train_pipe_set_overlap(train_pipe *p, int on);
/* Nanoseconds blocked on the pipeline's groups so far (pp and the tied
 * embedding's): comm_group_wait_ns of both. */
long long train_pipe_wait_ns(const train_pipe *p);
/* --overlap: "all", "none" or a comma list of dp, tp, pp -> TRAIN_OVERLAP_*
 * bits (MS_ERR_ARG naming the option otherwise). */
ms_status train_overlap_parse(const char *s, int *mask);

/* train_val.c: the validation loss over a fixed set of sequences, the same
 * for every layout and micro-batch size.  The set is the first batches x
 * batch windows of T+1 tokens at stride T of `pattern` in file order;
 * data-parallel rank r of dp evaluates the contiguous block of S/dp of
 * them (S = batches x batch) in chunks of micro, and the loss is the mean
 * over the S x T targets, summed in sequence order (the same bits on every
 * rank; across layouts equal up to the per-token losses' rounding). */
typedef struct {
    const char *pattern;   /* --val-data (must outlive the train_val) */
    int batches, batch, T; /* the set: batches x batch sequences of T targets */
    int micro;             /* sequences per forward pass: the model's B (train_check_batch) */
    int vocab;             /* tokens must be below it */
    comm_world *world;     /* the job (NULL: one process) */
    comm_grid *grid;       /* its grid: dp split, tp rank, pipeline stage */
} train_val_config;
typedef struct train_val train_val;
/* Open the data and check that the set fits: MS_ERR_FORMAT naming the
 * pattern, its tokens, the sequences they hold and the set asked
 * (--val-batches x --batch) when it does not; the loader's errors (no
 * shard, a bad header). */
ms_status train_val_open(train_val **out, const train_val_config *c);
/* Its data loader (the validation shards). */
const data_loader *train_val_loader(const train_val *v);
void train_val_close(train_val *v);
int64_t train_val_sequences(const train_val *v);
/* Rank 0's info line: what the set is, and this rank's share. */
void train_val_log(const train_val *v);
/* One pass over the set on model m (pipe: this stage's pipeline, or NULL);
 * *loss = the mean loss per target, the same on every rank.  Collective
 * over the job (c->world).  A token >= vocab or a read error: the error naming the
 * shard on the rank that read it, and on the others one saying so. */
ms_status train_val_run(train_val *v, gpt_model *m, train_pipe *pipe, double *loss);

#endif
