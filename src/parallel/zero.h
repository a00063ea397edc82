/* zero.h - ZeRO-2 data parallelism: gradients reduce-scattered in buckets
 * while the backward pass runs, each rank updating only its shard of the
 * fp32 optimiser state, updated parameters all-gathered back and waited for
 * layer by layer in the next forward pass.
 *
 * Buckets are the model's gradient-ready ranges (gpt_grad_ranges: one per
 * block, ln_f, the embeddings), each padded by the model to a multiple of
 * 16*dp elements (gpt_create_aligned), so each splits into dp equal aligned
 * shards; rank r owns shard r of every bucket.  The shards of one rank
 * together are its slice of the optimiser (see optim.h).
 *
 * Usage per step: par_zero_arm() before the last micro-batch's
 * forward/backward (earlier micro-batches only accumulate locally), then
 * par_zero_reduce_wait(); the optimiser updates the owned shards; then
 * par_zero_gather_start(); the next forward waits for each bucket through
 * the model's param hook (or par_zero_gather_wait_all()).
 * Errors from the communicator inside the hooks are kept and returned by
 * the next par_zero_*_wait call.  One thread at a time.
 */
#ifndef PAR_ZERO_H
#define PAR_ZERO_H

#include <stddef.h>

#include "base/status.h"
#include "comm/comm.h"
#include "model/gpt.h"

typedef struct par_zero par_zero;

/* m must have been created with gpt_create_aligned(..., 16 * dp size). */
ms_status par_zero_create(par_zero **out, gpt_model *m, comm_group *dp);
void par_zero_destroy(par_zero *z);

comm_group *par_zero_group(const par_zero *z);
/* This rank's shards: [begin, end) element ranges of the parameter buffer. */
int par_zero_num_shards(const par_zero *z);
void par_zero_shard(const par_zero *z, int i, size_t *begin, size_t *end);

/* Data-parallel overlap (--overlap dp, the default): 1 starts each
 * bucket's reduce-scatter when its gradients are ready and waits for each
 * all-gather where the next forward reads it; 0 waits for every op at
 * once (the same bits, the communication exposed).  Default 1. */
void par_zero_set_overlap(par_zero *z, int on);

void par_zero_arm(par_zero *z);
ms_status par_zero_reduce_wait(par_zero *z);
ms_status par_zero_gather_start(par_zero *z);
ms_status par_zero_gather_wait_all(par_zero *z);
/* Seconds this rank spent blocked waiting for reduce-scatters and
 * all-gathers (exposed communication) since the previous call. */
double par_zero_take_wait(par_zero *z);

#endif
