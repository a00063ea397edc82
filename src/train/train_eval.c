/* train_eval.c - `megascale eval`: saved weights (a weights file or a
 * checkpoint's parameters) into a model of this job's layout, then one
 * pass of the fixed validation set (train_val.c), the code of training's
 * validation passes. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "base/log.h"
#include "ckpt/ckpt.h"
#include "ckpt/hf.h"
#include "comm/comm.h"
#include "comm/grid.h"
#include "train/train_internal.h"

#define EVAL_BATCHES 10 /* train's defaults, for a weights file */
#define EVAL_BATCH 8
#define EVAL_SEQ 256

/* Rank 0 picks the commit of the checkpoint PATH that option opt (--ckpt,
 * or --weights given a checkpoint) names; every rank gets it, or rank 0's
 * error (with its message, naming the option). */
static ms_status find_commit(const char *opt, const char *path, comm_world *w, char *dir,
                             size_t n) {
    struct {
        int32_t st;
        char text[4300]; /* the commit, or the error */
    } msg = {0};
    if (!w || comm_world_rank(w) == 0) {
        char what[32];
        snprintf(what, sizeof what, "%s ", opt);
        msg.st = ckpt_check_path(what, path);
        if (msg.st == MS_OK &&
            (msg.st = ckpt_find_commit(path, msg.text, sizeof msg.text)) != MS_OK)
            ms_error_wrap((ms_status)msg.st, "%s", opt);
        if (msg.st != MS_OK) snprintf(msg.text, sizeof msg.text, "%s", ms_errmsg());
    }
    if (w) MS_TRY(comm_broadcast(comm_world_group(w), &msg, sizeof msg, COMM_U8, 0));
    if (msg.st != MS_OK) return ms_error((ms_status)msg.st, "%s", msg.text);
    snprintf(dir, n, "%s", msg.text);
    return MS_OK;
}

/* The model of the weights (--weights, --heads) or of the commit, and the
 * set's --val-batches / --batch / --seq left at 0 and --val-data left out
 * from the commit (or train's defaults; a weights file has no glob). */
static ms_status eval_source(train_config *tc, const char *ck_opt, comm_world *w, gpt_config *mc,
                             train_eval_result *r) {
    int batches = EVAL_BATCHES, batch = EVAL_BATCH, seq = EVAL_SEQ;
    if (tc->val_data && *tc->val_data)
        snprintf(r->val_data, sizeof r->val_data, "%s", tc->val_data);
    if (tc->init_from && *tc->init_from) {
        MS_TRY(train_model_config(tc, "--weights", mc));
        snprintf(r->source, sizeof r->source, "%s", tc->init_from);
    } else {
        MS_TRY(find_commit(ck_opt, tc->resume, w, r->source, sizeof r->source));
        ckpt_manifest mf;
        ms_status st =
            ckpt_validate(r->source, 0, &mf); /* the CRCs: when the parameters are read */
        if (st != MS_OK) return ms_error_wrap(st, "%s", ck_opt);
        *mc = mf.model;
        r->step = mf.step;
        batch = mf.trainer.batch > 0 ? mf.trainer.batch : batch;
        seq = mf.trainer.seq > 0 ? mf.trainer.seq : seq;
        /* the run's validation set: its glob and count (older commits: the count is not there) */
        batches = mf.trainer.val_batches > 0 ? mf.trainer.val_batches : batches;
        if (!r->val_data[0] && strlen(mf.trainer.val_data) + 1 >= sizeof mf.trainer.val_data) {
            ckpt_manifest_free(&mf);
            return ms_error(MS_ERR_ARG,
                            "eval: the --val-data of %s's run was longer than the %zu bytes a "
                            "checkpoint records (it is cut there): give --val-data",
                            r->source, sizeof mf.trainer.val_data - 1);
        }
        if (!r->val_data[0] && mf.trainer.val_data[0]) {
            snprintf(r->val_data, sizeof r->val_data, "%s", mf.trainer.val_data);
            if (!w || comm_world_rank(w) == 0)
                ms_info("eval: --val-data '%s', the run's (from %s)", r->val_data, r->source);
        }
        ckpt_manifest_free(&mf);
        mc->recompute = 0;
        MS_TRY(gpt_config_validate(mc));
        if (tc->heads > 0 && tc->heads != mc->n_head) /* as --weights (it was ignored here) */
            return ms_error(MS_ERR_ARG, "--heads %d disagrees with %s, which holds %d", tc->heads,
                            r->source, mc->n_head);
    }
    if (!r->val_data[0])
        return ms_error(MS_ERR_ARG,
                        "eval: --val-data GLOB is required (the token shards to "
                        "score)%s",
                        tc->init_from && *tc->init_from
                            ? ""
                            : ": the checkpoint does not name its run's (it had none, or it "
                              "predates the record)");
    if (!tc->val_data || !*tc->val_data) tc->val_data = r->val_data; /* the checkpoint's */
    if (tc->val_batches == 0) tc->val_batches = batches;
    if (tc->batch == 0) tc->batch = batch;
    /* the default, 256, at most the model's positions (it was refused as "--seq 256", an
     * option the user never gave, for a model of fewer) */
    if (tc->seq == 0) tc->seq = seq < mc->seq_max ? seq : mc->seq_max;
    if (tc->seq > mc->seq_max)
        return ms_error(MS_ERR_ARG, "--seq %d: the model of %s has seq-max %d", tc->seq, r->source,
                        mc->seq_max);
    return MS_OK;
}

/* The parameters into m: each rank its tp shard / stage of the weights
 * file, or dp rank 0 of each (tp, pp) position reads the commit and
 * broadcasts it over its dp group. */
static ms_status eval_load(const train_config *tc, const char *ck_opt, comm_grid *grid,
                           gpt_model *m, const char *source) {
    ms_status st =
        tc->init_from && *tc->init_from
            ? ckpt_hf_load(m, source)
            : ckpt_load_params(source, m, grid ? comm_grid_group(grid, COMM_DIM_DP) : NULL);
    /* named by its option, as every error of the weights (a shard's CRC said only the file) */
    if (st != MS_OK)
        ms_error_wrap(st, "%s", tc->init_from && *tc->init_from ? "--weights" : ck_opt);
    return st;
}

ms_status train_eval(const train_config *cfg, train_eval_result *r) {
    train_config tc = *cfg; /* --batch / --seq may come from the checkpoint */
    memset(r, 0, sizeof *r);
    r->step = -1;
    comm_world *world = NULL;
    comm_grid *grid = NULL;
    train_gate *gate = NULL;
    be_backend *be = NULL;
    gpt_model *m = NULL;
    train_pipe *pipe = NULL;
    train_val *val = NULL;
    gpt_config mc;
    int dp = 1, micro = 0, accum = 0;
    int weights = tc.init_from && *tc.init_from, ckpt = tc.resume && *tc.resume;
    const char *ck_opt = "--ckpt"; /* the option that named the checkpoint, for its errors */
    if (weights && !ckpt && ckpt_is_checkpoint(tc.init_from)) { /* --weights CKPT is --ckpt CKPT */
        tc.resume = tc.init_from;
        tc.init_from = NULL;
        weights = 0, ckpt = 1, ck_opt = "--weights";
    }
    ms_status st = MS_OK;
    if (weights == ckpt)
        st = ms_error(MS_ERR_ARG, "eval: give --weights FILE or --ckpt PATH (%s)",
                      weights ? "not both" : "neither is given");
    else if (weights && (!tc.val_data || !*tc.val_data))
        st = ms_error(MS_ERR_ARG, "eval: --val-data GLOB is required (the token shards to score)");
    st = st == MS_OK ? train_dist_open(&tc, "eval", &world, &grid, &dp, &gate)
                     : train_gate_early("eval", st);
    if (st == MS_OK) st = eval_source(&tc, ck_opt, world, &mc, r);
    if (st == MS_OK) st = train_check_batch(tc.batch, tc.micro_batch, dp, &micro, &accum);
    if (st == MS_OK) st = train_check_tp(&tc, &mc, micro);
    /* the data before the model: a set larger than the shards is bad input (exit 3), said
     * before the model's memory is asked for (it was exit 8 for a --batch past memory) */
    train_val_config vc = {.pattern = tc.val_data,
                           .batches = tc.val_batches,
                           .batch = tc.batch,
                           .T = tc.seq,
                           .micro = micro,
                           .vocab = mc.vocab,
                           .world = world,
                           .grid = grid};
    if (st == MS_OK) st = train_val_open(&val, &vc);
    /* every rank's data, before the model's collectives (a host without the shards) */
    st = train_gate_pass(gate, st);
    be_options bo = be_options_default();
    bo.threads = tc.threads;
    bo.cuda_profile = tc.cuda_profile;
    bo.cuda_fuse_gelu = tc.cuda_fuse_gelu;
    if (st == MS_OK && (!world || comm_world_rank(world) == 0)) be_warn_ignored(tc.device, &bo);
    if (st == MS_OK) st = be_dtype_parse(tc.cpu_dtype, tc.device, &bo.cpu_dtype);
    if (st == MS_OK) st = be_create(&be, tc.device, &bo);
    if (st == MS_OK) st = train_dist_device(&tc, world, grid, be);
    if (st == MS_OK) st = train_model_create(&tc, &mc, be, world, grid, micro, 1, 16, &m, &pipe);
    if (st == MS_OK) st = eval_load(&tc, ck_opt, grid, m, r->source);
    if (st == MS_OK) {
        r->batches = tc.val_batches, r->batch = tc.batch, r->seq = tc.seq, r->micro = micro;
        r->sequences = train_val_sequences(val);
        r->tokens = r->sequences * tc.seq;
        r->world = world ? comm_world_size(world) : 1;
        r->dp = dp, r->tp = tc.tp > 0 ? tc.tp : 1, r->pp = tc.pp > 0 ? tc.pp : 1;
        ms_info("eval: %s (%d layers, dim %d, %d heads, vocab %d) on %s", r->source, mc.n_layer,
                mc.n_embd, mc.n_head, mc.vocab, be->name);
        train_val_log(val);
        st = train_val_run(val, m, pipe, &r->loss);
    }
    st = train_gate_pass(gate, st);
    train_val_close(val);
    train_pipe_destroy(pipe);
    gpt_destroy(m);
    if (be) be_destroy(be);
    comm_grid_destroy(grid);
    return train_gate_end(gate, world, st);
}
