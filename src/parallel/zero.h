/* zero.h - ZeRO-2 data parallelism: gradients reduce-scattered in buckets
 * while the backward pass runs, each rank updating only its shard of the
 * fp32 optimiser state, updated parameters all-gathered back and waited for
 * layer by layer in the next forward pass.
 *
 * Buckets are the model's ranges (gpt_grad_ranges, in the order the
 * forward reads them: wte, wpe, block 0 ... L-1, ln_f), each padded by the
 * model to a multiple of 16*dp elements (gpt_create_aligned), so each
 * splits into dp equal aligned shards; rank r owns shard r of every
 * bucket, and shard i is bucket i's.  The shards of one rank together are
 * its slice of the optimiser (see optim.h).
 *
 * Communication hidden behind compute (issue 14):
 * - Reduce-scatter: each bucket's starts from the grad hook as soon as its
 *   gradients are final: ln_f and wte first (right after the classifier),
 *   then block L-1 .. 0, then wpe.  wte (most of a small model's
 *   parameters) is reduced early in two parts: the classifier's dense
 *   gradient (ready at the start of the backward; the head is tied to wte)
 *   by its bucket's reduce-scatter, and the last micro-batch's embedding
 *   lookup rows (at most B*T rows of C, ready only at the end) by a small
 *   all-gather of every rank's distinct token ids and rows
 *   (gpt_set_rows_hook), added in rank order to the owned shard in
 *   par_zero_reduce_wait.  Reduce-scatter is linear, so the sum is the
 *   same gradient; the tail left after the backward is the last block's,
 *   wpe's and the rows' exchange.  (A model that cannot keep the rows
 *   apart - tensor parallelism, a pipeline stage - reduces wte whole after
 *   the embedding backward.)
 * - All-gather: started by the optimiser (opt_step) bucket by bucket in
 *   forward order, each as soon as this rank's shard of it is updated, so
 *   the gathers overlap the rest of the optimiser and the next step's data
 *   loading, and the first layer's weights arrive first; the next forward
 *   waits for each bucket through the param hook just before reading it.
 * - par_zero_set_overlap(z, 0) waits for every op right after starting it:
 *   the same ops in the same order with the same arithmetic (bitwise the
 *   same run), the communication fully exposed: the baseline that the
 *   metrics' dp_wait_ms is compared against.
 *
 * Usage per step: par_zero_arm() before the last micro-batch's
 * forward/backward (earlier micro-batches only accumulate locally), then
 * par_zero_reduce_wait(); the optimiser updates the owned shards and starts
 * their all-gathers (par_zero_gather_shard); the next forward waits for
 * each bucket through the model's param hook (or par_zero_gather_wait_all()).
 * Errors from the communicator inside the hooks are kept and returned by
 * the next par_zero_* call that returns a status.  One thread at a time.
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

/* Data-parallel overlap (--overlap dp, the default): 1 leaves each op in
 * flight until its consumer needs it (the reduce-scatters until
 * par_zero_reduce_wait, each all-gather until the next forward reads its
 * bucket); 0 waits for every op right after starting it (the same bits,
 * the communication exposed).  Default 1. */
void par_zero_set_overlap(par_zero *z, int on);

/* Before the last micro-batch: its backward's hooks start the reductions. */
void par_zero_arm(par_zero *z);
/* Wait for the step's reductions and add wte's lookup rows: this rank's
 * shards of the gradient buffer then hold the summed gradients. */
ms_status par_zero_reduce_wait(par_zero *z);
/* Start the all-gather of bucket i (this rank's shard i updated). */
ms_status par_zero_gather_shard(par_zero *z, int i);
/* All of them, in order (a checkpoint load that set every owned shard). */
ms_status par_zero_gather_start(par_zero *z);
ms_status par_zero_gather_wait_all(par_zero *z);
/* Seconds this rank spent blocked waiting for reduce-scatters and
 * all-gathers (exposed communication) since the previous call. */
double par_zero_take_wait(par_zero *z);

#endif
