/* loader.h - batches of (inputs, targets) from token shards.
 *
 * Two orders:
 *  - sequential (llm.c's): the optimiser step's batch k is the S*T+1 tokens
 *    starting at token k*S*T of the current shard (S = B*accum*nranks, the
 *    step's sequences), split into S rows of inputs and the same shifted by
 *    one as targets; when the next step's batch would run past the end of a
 *    shard the loader moves to the next shard (wrapping to the first).  The
 *    decision is taken per step, not per call, so every split of the step
 *    into ranks and micro-batches reads the same rows.
 *  - shuffle: the shards are cut into windows of T+1 tokens at stride T; each
 *    epoch visits every window once in an order that is a pure function of
 *    (seed, epoch), B windows per batch.
 *  - file (for evaluation; not a --data-order): the same windows as shuffle,
 *    in file order (shard by shard in glob order, each from its start),
 *    with no permutation and no per-shard size check: a shard shorter
 *    than T+1 tokens holds no window.  data_loader_windows reads any of
 *    them by index, whatever the order the loader was opened with.
 * Data parallelism: with nranks > 1 each optimiser-level batch is the
 * concatenation of the ranks' batches, so the ranks see disjoint data and
 * together exactly the data one process with nranks*B rows would see:
 * sequential rank r's j-th call of a step reads the B*T+1 tokens at
 * (j*nranks + r)*B*T from the step's start, shuffle rank r's k-th call
 * takes windows k*nranks*B + r*B ... of the epoch's permutation (the same
 * rows of the step in both orders).
 * Each token is checked against the vocabulary as it is read; a token id
 * >= vocab is an error naming the shard and the position.
 * The cursor (data_cursor) is plain data, so a checkpoint can store it and a
 * resumed run continue exactly.  One thread at a time.
 */
#ifndef DATA_LOADER_H
#define DATA_LOADER_H

#include <stdint.h>

#include "base/status.h"

typedef enum { DATA_ORDER_SEQUENTIAL = 0, DATA_ORDER_SHUFFLE = 1, DATA_ORDER_FILE = 2 } data_order;

typedef struct {
    const char *pattern; /* glob of shard files */
    int B, T;
    int vocab;
    data_order order;
    uint64_t seed;
    int rank, nranks; /* data-parallel slice: this rank of nranks (0 of 1 alone) */
    int accum;        /* calls per optimiser step on each rank (0 or 1: one) */
} data_loader_config;

typedef struct {
    uint64_t epoch;
    uint64_t shard; /* sequential: current shard index */
    uint64_t pos;   /* sequential: token position of the step's global batch;
                       shuffle: windows consumed by all ranks since the start */
    uint64_t sub;   /* sequential: calls made of the current step (0 at a step
                       boundary, where checkpoints are taken) */
} data_cursor;

typedef struct data_loader data_loader;

/* "sequential" or "shuffle" (the --data-order values; file is internal). */
ms_status data_order_parse(const char *s, data_order *out);
ms_status data_loader_open(data_loader **out, const data_loader_config *cfg);
void data_loader_close(data_loader *dl);
/* Fill inputs and targets, each (B,T) int32 on the host. */
ms_status data_loader_next(data_loader *dl, int32_t *inputs, int32_t *targets);
data_cursor data_loader_cursor(const data_loader *dl);
/* Continue from cursor c (a checkpoint's).  Sequential order: c must lie
 * in the shards opened now, shard < the shard count and pos <= that
 * shard's tokens; otherwise (the data set changed since c was saved)
 * MS_ERR_RANGE naming the pattern, the index, the count or the shard's
 * size, and the loader is left where it was.  Shuffle order: every cursor
 * is valid (the window count is taken modulo the epoch's windows). */
ms_status data_loader_seek(data_loader *dl, data_cursor c);
void data_loader_rewind(data_loader *dl);
uint64_t data_loader_total_tokens(const data_loader *dl);
/* The windows of T+1 tokens at stride T over all shards (the file order's
 * and the shuffle's units): shard s holds (n_tokens - 1) / T of them. */
uint64_t data_loader_num_windows(const data_loader *dl);
/* Windows [first, first + n) in file order into rows 0..n-1 of inputs and
 * targets ((n,T) int32, host; any n >= 1); the cursor does not move.
 * MS_ERR_RANGE naming the pattern past the last window; a token >= vocab
 * is an error naming the shard and the position. */
ms_status data_loader_windows(data_loader *dl, uint64_t first, int n, int32_t *inputs,
                              int32_t *targets);
int data_loader_num_shards(const data_loader *dl);
/* MS_OK if b's shards hold the ids of a's tokenizer (the same header kind: GPT-2 uint16 or
 * uint32, llama-3), else MS_ERR_FORMAT naming both (a_opt, b_opt: the options that gave
 * them, as "--train-data"). */
ms_status data_loader_check_same_kind(const data_loader *a, const char *a_opt, const data_loader *b,
                                      const char *b_opt);

#endif
