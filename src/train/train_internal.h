/* train_internal.h - helpers shared by the trainer's files. */
#ifndef TRAIN_INTERNAL_H
#define TRAIN_INTERNAL_H

#include "comm/grid.h"
#include "model/gpt.h"
#include "train/train.h"

/* Model configuration from the preset / explicit flags / --init-from file. */
ms_status train_model_config(const train_config *tc, gpt_config *out);
/* Cross-option checks for dp data-parallel ranks; sets the per-rank
 * micro-batch size and the accumulation steps. */
ms_status train_check(const train_config *tc, const gpt_config *c, int dp, int *micro, int *accum);
/* Checks for --tp tensor-parallel ranks (with sequence parallelism) on
 * micro-batches of `micro` sequences: heads and micro*seq divisible by tp,
 * no pipeline stages. */
ms_status train_check_tp(const train_config *tc, const gpt_config *c, int micro);

/* The data-parallel size of a world of `world` ranks: --dp, or when it is
 * not given world / (tp x pp); 0 when that does not divide. */
int train_dp_of(const train_config *tc, int world);
/* The layout's checks for a world of `world` ranks (*dp: train_dp_of):
 * MS_ERR_ARG naming --tp, --pp and the world when they do not divide it
 * (--dp not given), naming all four when tp x pp x dp is not the world,
 * and for --vpp > 1 without --pp >= 2. */
ms_status train_check_layout(const train_config *tc, int world, int *dp);
/* Rank 0, pp > 1: one warning when the step's accum micro-batches are
 * fewer than the pp stages, with the schedule's bubble and the
 * --micro-batch (or --batch) that gives one micro-batch per stage. */
void train_warn_pipeline(const train_config *tc, int dp, int pp, int accum);

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
typedef struct train_pipe train_pipe;
ms_status train_pipe_plan(train_pipe **out, comm_grid *grid, comm_world *world, int vpp,
                          int n_micro);
int train_pipe_slots(const train_pipe *p);
/* Allocate the send buffers for (B,T) micro-batches of model m. */
ms_status train_pipe_attach(train_pipe *p, gpt_model *m, int B, int T);
void train_pipe_destroy(train_pipe *p);
/* Run the step's schedule; *loss = the sum of the micro-batches' mean
 * losses, equal on every stage (broadcast from the last).  The tied wte gradients
 * are summed over the first and last stage before returning. */
ms_status train_pipe_step(train_pipe *p, const int32_t *inp, const int32_t *tgt, int B, int T,
                          float dloss, double *loss);
/* Forward-only loss of one (B,T) micro-batch through all stages. */
ms_status train_pipe_eval(train_pipe *p, const int32_t *inp, const int32_t *tgt, int B, int T,
                          double *loss);
int train_pipe_last_stage(const train_pipe *p);
/* Seconds the last step waited on pipeline receives (the bubble). */
double train_pipe_bubble(const train_pipe *p);

#endif
