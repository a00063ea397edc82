/* optim.h - optimisers (AdamW, LAMB), learning-rate schedules, global-norm
 * gradient clipping and non-finite detection.
 *
 * The optimiser owns its fp32 state (m, v: one buffer each on the model's
 * backend, laid out like the model's parameter buffer) and updates the
 * model's parameters in place from its gradients.  Weight decay applies to
 * the tensors the model's table marks `decay` (matrices and embeddings) and
 * never to biases or LayerNorm parameters.  One thread at a time.
 */
#ifndef OPT_OPTIM_H
#define OPT_OPTIM_H

#include "base/status.h"
#include "model/gpt.h"

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
} opt_stats;

typedef struct opt_state opt_state;

ms_status opt_create(opt_state **out, const opt_config *cfg, gpt_model *m);
void opt_destroy(opt_state *o);
/* One update with learning rate lr from the model's accumulated gradients.
 * Returns MS_ERR_NONFINITE (and leaves parameters and state untouched) when
 * the gradients hold NaN/Inf; stats are filled in either case. */
ms_status opt_step(opt_state *o, float lr, opt_stats *stats);
/* Number of updates applied so far (the t of the bias corrections). */
int opt_steps_done(const opt_state *o);

#endif
