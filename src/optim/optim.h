/* optim.h - optimisers (AdamW, LAMB), learning-rate schedules, global-norm
 * gradient clipping and non-finite detection.
 *
 * The optimiser owns its fp32 state (m, v: one buffer each on the model's
 * backend) and updates the model's parameters in place from its gradients,
 * tensor by tensor, or only this rank's ZeRO shards of them.  Weight decay applies to
 * the tensors the model's table marks `decay` (matrices and embeddings) and
 * never to biases or LayerNorm parameters.  One thread at a time.
 */
#ifndef OPT_OPTIM_H
#define OPT_OPTIM_H

#include "base/status.h"
#include "model/gpt.h"
#include "parallel/zero.h"

typedef enum { OPT_ADAMW = 0, OPT_LAMB = 1 } opt_kind;

typedef struct {
    opt_kind kind;
    float beta1, beta2, eps;
    float weight_decay;
    float grad_clip; /* max global grad norm; 0 disables clipping */
} opt_config;

typedef enum { OPT_SCHED_CONSTANT = 0, OPT_SCHED_COSINE = 1 } opt_sched_kind;

typedef struct {
    opt_sched_kind kind;
    float lr;    /* peak learning rate */
    int warmup;  /* linear warmup steps: lr*(s+1)/warmup for s < warmup */
    int total;   /* steps of the run; cosine reaches the floor at total-1 */
    float floor; /* cosine floor as a fraction of lr (0..1) */
} opt_schedule;

ms_status opt_kind_parse(const char *s, opt_kind *out);
const char *opt_kind_name(opt_kind k);
ms_status opt_sched_parse(const char *s, opt_sched_kind *out);
/* Learning rate at 0-based step s. */
float opt_lr_at(const opt_schedule *sc, int s);

typedef struct {
    double grad_norm; /* global L2 norm of the gradients before clipping */
    float clip_scale; /* factor applied to the gradients (1 when not clipped) */
    /* this rank's own part of the norm (the gradients it updates, before
     * the sums over ranks) was not finite: where a non-finite norm came from */
    int own_nonfinite;
} opt_stats;

typedef struct opt_state opt_state;

/* zero NULL: one rank updates everything.  With ZeRO-2 (zero != NULL) this
 * rank keeps m and v only for its shards and updates only those parameters;
 * the gradient norm and LAMB's per-tensor norms are summed over the DP
 * group, so every rank takes the same decisions (clip, skip).  With tensor
 * parallelism (gpt_tp_group) they are also summed over the TP group: the
 * shards of split tensors, replicated tensors counted once. */
/* On the CPU backend, the model's buffers and this state together larger
 * than the host's memory are MS_ERR_NOMEM before the state is allocated
 * (be_cpu_check_host_memory). */
ms_status opt_create(opt_state **out, const opt_config *cfg, gpt_model *m, par_zero *zero);
void opt_destroy(opt_state *o);
/* Pipeline parallelism: the global gradient norm (clipping, the non-finite
 * check) also sums over the pipeline group pp, leaving out tensor `skip`
 * (the last stage's tied copy of wte, so it counts once; -1: none).  LAMB's
 * per-tensor norms need no pp sum: each tensor lives on one stage (the two
 * wte copies hold equal gradients). */
void opt_set_pipeline(opt_state *o, comm_group *pp, int skip);
/* One update with learning rate lr from the model's accumulated gradients.
 * Returns MS_ERR_NONFINITE (and leaves parameters and state untouched, and
 * starts no all-gather) when the gradients hold NaN/Inf; stats are filled
 * in either case.  Order: the global norm (clipping and the non-finite
 * check need every shard's gradients, summed over the groups), LAMB's
 * moments and per-tensor norms (one sum for all tensors), then the updates
 * shard by shard in forward order (par_zero_shard: wte, wpe, block 0 ...,
 * ln_f); with ZeRO-2 each shard's all-gather starts as soon as its update
 * is done (par_zero_gather_shard), so the gathers overlap the rest of the
 * optimiser and the first layers' weights arrive first.
 * On MS_OK every element of the model's gradient buffer is 0: each update
 * leaves 0 where it read its gradient (adamw_step, lamb_apply), and what
 * no update reads (other ranks' ZeRO shards, padding) is zeroed here, so
 * the next step accumulates without a zeroing pass of its own.  On an
 * error the gradients are as they were (MS_ERR_NONFINITE) or unspecified. */
ms_status opt_step(opt_state *o, float lr, opt_stats *stats);
/* Number of updates applied so far (the t of the bias corrections). */
int opt_steps_done(const opt_state *o);

/* Checkpoint access.  A run of one tensor whose m and v this rank holds:
 * the whole tensor alone, its overlap with one owned shard under ZeRO-2. */
typedef struct {
    int tensor;       /* index in the model's parameter table */
    size_t off;       /* element offset in the parameter buffer */
    size_t n;         /* elements */
    float *mom, *var; /* this run's m and v (backend memory, n elements each) */
} opt_state_piece;

/* The pieces in a fixed order (shard by shard in forward order, tensor by
 * tensor): returns how many there are and fills the first min(count, max)
 * of out. */
int opt_state_pieces(opt_state *o, opt_state_piece *out, int max);
/* Set the update count (a resumed run continues the bias corrections). */
void opt_set_steps(opt_state *o, int t);
const opt_config *opt_get_config(const opt_state *o);

#endif
