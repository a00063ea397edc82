/* train_val.c - the validation loss over a fixed set of sequences, the same
 * for every layout and micro-batch size (training's validation passes and
 * `megascale eval`; docs/user-guide.md, "Validation").
 *
 * The set: the first batches x batch windows of T+1 tokens at stride T of
 * the data in file order (data_loader_windows: shard by shard in glob
 * order, each from its start).  Data-parallel rank r of dp evaluates the
 * contiguous block [r*S/dp, (r+1)*S/dp) of the S sequences, in chunks of
 * `micro` (S/dp is a multiple of micro: train_check_batch); every rank of
 * a tp group and every stage of a pipeline runs the same chunks.  Each
 * sequence's loss sum (gpt_row_losses) goes to its slot of an S-vector,
 * zero elsewhere; the vectors are summed over the world (one non-zero term
 * per slot: exact in any order) and every rank adds the S sums in sequence
 * order.  The mean over the S*T targets is then bitwise the same on every
 * rank and for any dp split, and differs between layouts only where the
 * per-token losses themselves do (tensor-parallel or GEMM-shape rounding).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "comm/comm.h"
#include "comm/grid.h"
#include "data/loader.h"
#include "train/train_internal.h"

struct train_val {
    train_val_config c;
    data_loader *dl;
    comm_group *world;          /* the sum over the job (NULL: one process) */
    int contributes;            /* tp rank 0 of the last stage: its losses are summed */
    int64_t n_seq, first, mine; /* the set; this rank's block [first, first + mine) */
    int32_t *inp, *tgt;         /* one chunk (micro, T) */
    double *row;                /* its sequences' loss sums (micro) */
    double *sums;               /* [n_seq + 1]: every sequence's sum, then the failed ranks */
};

const data_loader *train_val_loader(const train_val *v) {
    return v->dl;
}

ms_status train_val_open(train_val **out, const train_val_config *c) {
    *out = NULL;
    int dp = 1, dp_rank = 0;
    train_val *v = calloc(1, sizeof *v);
    if (!v) return ms_error(MS_ERR_NOMEM, "validation: out of memory");
    v->c = *c;
    v->contributes = 1;
    if (c->grid) {
        comm_grid_coord me = comm_grid_coord_of(c->grid);
        comm_grid_shape sh = comm_grid_shape_of(c->grid);
        dp = sh.dp, dp_rank = me.dp;
        v->contributes = me.tp == 0 && me.pp == sh.pp - 1;
        v->world = comm_world_group(c->world);
    }
    MS_CHECK(c->batches >= 1 && c->batch >= 1 && c->T >= 1 && c->micro >= 1);
    MS_CHECK(c->batch % dp == 0 && (c->batch / dp) % c->micro == 0); /* train_check_batch */
    int64_t n_seq = (int64_t)c->batches * c->batch;
    v->n_seq = n_seq;
    v->mine = n_seq / dp;
    v->first = v->mine * dp_rank;
    data_loader_config dc = {.pattern = c->pattern,
                             .B = 1,
                             .T = c->T,
                             .vocab = c->vocab,
                             .order = DATA_ORDER_FILE,
                             .rank = 0,
                             .nranks = 1};
    ms_status st = data_loader_open(&v->dl, &dc);
    if (st != MS_OK) st = ms_error_wrap(st, "--val-data");
    uint64_t have = st == MS_OK ? data_loader_num_windows(v->dl) : 0;
    if (st == MS_OK && have < (uint64_t)n_seq)
        st = ms_error(MS_ERR_FORMAT,
                      "%s: %llu tokens in %d shard(s) hold %llu sequences of T+1=%d tokens "
                      "(stride T), fewer than the validation set's --val-batches %d x --batch %d "
                      "= %lld (%s)",
                      c->pattern, (unsigned long long)data_loader_total_tokens(v->dl),
                      data_loader_num_shards(v->dl), (unsigned long long)have, c->T + 1, c->batches,
                      c->batch, (long long)n_seq,
                      have >= (uint64_t)c->batch ? "give fewer --val-batches or more data"
                                                 : "not even one batch: give more data");
    if (st == MS_OK) {
        size_t n = (size_t)c->micro * c->T;
        v->inp = malloc(n * sizeof(int32_t));
        v->tgt = malloc(n * sizeof(int32_t));
        v->row = malloc((size_t)c->micro * sizeof(double));
        v->sums = malloc(((size_t)n_seq + 1) * sizeof(double));
        if (!v->inp || !v->tgt || !v->row || !v->sums)
            st = ms_error(MS_ERR_NOMEM, "validation: out of memory (%lld sequences)",
                          (long long)n_seq);
    }
    if (st != MS_OK) {
        train_val_close(v);
        return st;
    }
    *out = v;
    return MS_OK;
}

void train_val_close(train_val *v) {
    if (!v) return;
    data_loader_close(v->dl);
    free(v->inp);
    free(v->tgt);
    free(v->row);
    free(v->sums);
    free(v);
}

int64_t train_val_sequences(const train_val *v) {
    return v->n_seq;
}

void train_val_log(const train_val *v) {
    ms_info("validation: the first %lld sequences of %d+1 tokens of %s (--val-batches %d x "
            "--batch %d = %lld targets), %lld per data-parallel rank in micro-batches of %d",
            (long long)v->n_seq, v->c.T, v->c.pattern, v->c.batches, v->c.batch,
            (long long)v->n_seq * v->c.T, (long long)v->mine, v->c.micro);
}

/* This rank's block, chunk by chunk, into v->sums (its slots; a rank that
 * does not contribute leaves zeros). */
static ms_status run_block(train_val *v, gpt_model *m, train_pipe *pipe) {
    int B = v->c.micro, T = v->c.T;
    for (int64_t k = 0; k < v->mine; k += B) {
        MS_TRY(data_loader_windows(v->dl, (uint64_t)(v->first + k), B, v->inp, v->tgt));
        if (pipe)
            MS_TRY(train_pipe_eval(pipe, v->inp, v->tgt, B, T));
        else
            gpt_forward_loss(m, v->inp, v->tgt, B, T);
        MS_TRY(gpt_take_error(m)); /* a tensor-parallel collective failed */
        if (!v->contributes) continue;
        gpt_row_losses(m, B, T, v->row);
        memcpy(v->sums + v->first + k, v->row, sizeof(double) * (size_t)B);
    }
    return MS_OK;
}

ms_status train_val_run(train_val *v, gpt_model *m, train_pipe *pipe, double *loss) {
    memset(v->sums, 0, sizeof(double) * ((size_t)v->n_seq + 1));
    ms_status st = run_block(v, m, pipe);
    /* a rank whose data failed (a bad token, I/O) still joins the sum, so
     * that the others learn it instead of waiting for it */
    v->sums[v->n_seq] = st != MS_OK;
    char msg[1024] = "";
    if (st != MS_OK) snprintf(msg, sizeof msg, "%s", ms_errmsg());
    if (v->world) {
        ms_status cs =
            comm_allreduce(v->world, v->sums, v->sums, (size_t)v->n_seq + 1, COMM_F64, COMM_SUM);
        if (cs != MS_OK) return cs;
    }
    if (st != MS_OK) return ms_error(st, "%s", msg);
    if (v->sums[v->n_seq] > 0)
        return ms_error(MS_ERR_FORMAT,
                        "validation: %.0f other rank(s) failed to read --val-data "
                        "%s (their errors name the shard)",
                        v->sums[v->n_seq], v->c.pattern);
    double sum = 0;
    for (int64_t i = 0; i < v->n_seq; i++)
        sum += v->sums[i];
    *loss = sum / ((double)v->n_seq * v->c.T);
    ms_debug("validation: mean loss %.17g over %lld targets", *loss, (long long)v->n_seq * v->c.T);
    return MS_OK;
}
