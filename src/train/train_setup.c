/* train_setup.c - turning a train_config into a model configuration and a
 * layout, and checking the options against each other before anything is
 * allocated. */
#include "train/train_internal.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "ckpt/ckpt.h"
#include "ckpt/hf.h"
#include "parallel/schedule.h"

/* The model of a file (a weights file's config, or a commit's), from
 * source: the shape options given checked against it. */
static ms_status shape_checked(const train_config *tc, const gpt_config *have, const char *source,
                               gpt_config *out) {
    gpt_config c = *have;
    /* explicit flags must agree with the file */
    struct {
        const char *flag;
        int want, have;
    } chk[] = {
        {"--layers", tc->layers, c.n_layer},   {"--dim", tc->dim, c.n_embd},
        {"--heads", tc->heads, c.n_head},      {"--vocab", tc->vocab, c.vocab},
        {"--seq-max", tc->seq_max, c.seq_max},
    };
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++)
        if (chk[i].want > 0 && chk[i].want != chk[i].have)
            return ms_error(MS_ERR_ARG, "%s %d disagrees with %s, which holds %d", chk[i].flag,
                            chk[i].want, source, chk[i].have);
    if (tc->model && *tc->model) { /* a preset given too must be the file's shape */
        gpt_config p;
        MS_TRY(gpt_config_preset(&p, tc->model));
        if (p.n_layer != c.n_layer || p.n_embd != c.n_embd || p.n_head != c.n_head)
            return ms_error(MS_ERR_ARG,
                            "--model %s (%d layers, dim %d, %d heads) disagrees with %s, "
                            "which holds %d layers, dim %d, %d heads",
                            tc->model, p.n_layer, p.n_embd, p.n_head, source, c.n_layer, c.n_embd,
                            c.n_head);
    }
    gpt_block b;
    if (tc->block && *tc->block) {
        MS_TRY(gpt_block_parse(tc->block, &b));
        if (b != c.block)
            return ms_error(MS_ERR_ARG, "--block %s disagrees with %s, which holds a %s block",
                            tc->block, source, gpt_block_name(c.block));
    }
    if (tc->attn_window > 0) c.attn_window = tc->attn_window;
    *out = c;
    return MS_OK;
}

/* The model of the weights file tc->init_from: its config, the shape
 * options given checked against it. */
static ms_status weights_config(const train_config *tc, gpt_config *out) {
    gpt_config c;
    MS_TRY(ckpt_hf_read_config(tc->init_from, tc->heads, &c));
    return shape_checked(tc, &c, tc->init_from, out);
}

/* The model of the preset (--model, default d6) with the shape options. */
static ms_status preset_config(const train_config *tc, gpt_config *out) {
    gpt_config c;
    MS_TRY(gpt_config_preset(&c, tc->model && *tc->model ? tc->model : "d6"));
    if (tc->layers > 0) c.n_layer = tc->layers;
    if (tc->dim > 0) c.n_embd = tc->dim;
    if (tc->heads > 0) c.n_head = tc->heads;
    if (tc->vocab > 0) c.vocab = tc->vocab;
    if (tc->seq_max > 0) c.seq_max = tc->seq_max;
    if (tc->block && *tc->block) MS_TRY(gpt_block_parse(tc->block, &c.block));
    c.attn_window = tc->attn_window;
    *out = c;
    return MS_OK;
}

ms_status train_model_config_of(const train_config *tc, const gpt_config *have, const char *source,
                                gpt_config *out) {
    gpt_config c;
    MS_TRY(shape_checked(tc, have, source, &c));
    MS_TRY(gpt_recompute_parse(tc->recompute, &c.recompute));
    MS_TRY(gpt_config_validate(&c));
    *out = c;
    return MS_OK;
}

ms_status train_model_config(const train_config *tc, const char *opt, gpt_config *out) {
    gpt_config c;
    int weights = tc->init_from && *tc->init_from;
    if (weights && ckpt_is_checkpoint(tc->init_from)) /* a weights file: its parameters only */
        return ms_error(MS_ERR_ARG,
                        "%s %s is a checkpoint, not a weights file: --resume %s "
                        "continues that run (its step, optimizer state and data position); "
                        "to start a new run from its weights, `megascale ckpt export %s "
                        "--out FILE`, then --init-from FILE",
                        opt, tc->init_from, tc->init_from, tc->init_from);
    ms_status st = weights ? weights_config(tc, &c) : preset_config(tc, &c);
    if (st == MS_OK) st = gpt_recompute_parse(tc->recompute, &c.recompute);
    if (st == MS_OK) st = gpt_config_validate(&c);
    if (st != MS_OK) return weights ? ms_error_wrap(st, "%s", opt) : st;
    *out = c;
    return MS_OK;
}

/* The options against each other and the model; each option's own range
 * is checked by the option table (src/cli/cmd_train.c). */
ms_status train_check(const train_config *tc, const gpt_config *c, int dp, int *micro, int *accum) {
    be_dtype dt; /* a bf16 mode this CPU cannot run is named before anything else */
    MS_TRY(be_dtype_parse(tc->cpu_dtype, tc->device, &dt));
    if (!tc->train_data || !*tc->train_data)
        return ms_error(MS_ERR_ARG, "--train-data is required (a glob of token shards)");
    if (tc->seq > c->seq_max)
        return ms_error(MS_ERR_ARG, "--seq %d must be in 1..%d (the model's seq-max)", tc->seq,
                        c->seq_max);
    return train_check_batch(tc->batch, tc->micro_batch, dp, micro, accum);
}

ms_status train_check_batch(int batch, int micro_batch, int dp, int *micro, int *accum) {
    if (batch % dp != 0)
        return ms_error(MS_ERR_ARG, "--batch %d is not a multiple of --dp %d", batch, dp);
    int mb = micro_batch > 0 ? micro_batch : batch / dp;
    if ((batch / dp) % mb != 0)
        return ms_error(MS_ERR_ARG, "--batch %d is not a multiple of --dp %d x --micro-batch %d",
                        batch, dp, mb);
    *micro = mb;
    *accum = batch / dp / mb;
    return MS_OK;
}

ms_status train_check_tp(const train_config *tc, const gpt_config *c, int micro) {
    int tp = tc->tp > 0 ? tc->tp : 1;
    if (tp == 1) return MS_OK;
    if (c->n_head % tp != 0)
        return ms_error(MS_ERR_ARG,
                        "--tp %d: the model's %d heads are not divisible by %d (tensor "
                        "parallelism gives each rank heads/tp whole heads)",
                        tp, c->n_head, tp);
    if ((long)micro * tc->seq % tp != 0)
        return ms_error(MS_ERR_ARG,
                        "--tp %d: a micro-batch of %d x --seq %d = %ld rows is not divisible by "
                        "%d (sequence parallelism gives each rank micro-batch*seq/tp rows; make "
                        "--seq or the micro-batch a multiple of --tp)",
                        tp, micro, tc->seq, (long)micro * tc->seq, tp);
    return MS_OK;
}

ms_status train_overlap_parse(const char *s, int *mask) {
    *mask = TRAIN_OVERLAP_ALL;
    if (!s || !strcmp(s, "all")) return MS_OK;
    *mask = 0;
    if (!strcmp(s, "none")) return MS_OK;
    char buf[64];
    if (strlen(s) >= sizeof buf)
        return ms_error(MS_ERR_ARG, "--overlap %.40s...: all, none, or a list of dp, tp, pp", s);
    /* an empty list or entry ran with what nobody could tell (it read as all) */
    if (!*s || *s == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,"))
        return ms_error(MS_ERR_ARG,
                        "--overlap '%s': an empty %s (all, none, or a list of dp, tp, pp)", s,
                        *s ? "entry" : "value");
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "dp"))
            *mask |= TRAIN_OVERLAP_DP;
        else if (!strcmp(t, "tp"))
            *mask |= TRAIN_OVERLAP_TP;
        else if (!strcmp(t, "pp"))
            *mask |= TRAIN_OVERLAP_PP;
        else
            return ms_error(MS_ERR_ARG,
                            "--overlap %s: '%s' is not a dimension (all, none, or a list of dp, "
                            "tp, pp)",
                            s, t);
    }
    return MS_OK;
}

int train_dp_of(const train_config *tc, int world) {
    if (tc->dp > 0) return tc->dp;
    long long tp = tc->tp > 0 ? tc->tp : 1, pp = tc->pp > 0 ? tc->pp : 1; /* 2^16 x 2^16 */
    return world % (tp * pp) == 0 ? (int)(world / (tp * pp)) : 0;
}

ms_status train_check_layout(const train_config *tc, int world, int *dp) {
    int tp = tc->tp > 0 ? tc->tp : 1, pp = tc->pp > 0 ? tc->pp : 1;
    *dp = train_dp_of(tc, world);
    if (tc->vpp > 1 && pp < 2)
        return ms_error(MS_ERR_ARG,
                        "--vpp %d: virtual pipeline stages need --pp >= 2 (the interleaved "
                        "schedule)",
                        tc->vpp);
    if (*dp == 0)
        return ms_error(MS_ERR_ARG,
                        "the job has %d rank%s, which --tp %d x --pp %d = %lld does not divide "
                        "(--dp is not given, so it would be world / (tp x pp))",
                        world, world == 1 ? "" : "s", tp, pp, (long long)tp * pp);
    if ((long long)tp * pp * *dp != world)
        return ms_error(MS_ERR_ARG, "the job has %d rank%s but --tp %d x --pp %d x --dp %d = %lld",
                        world, world == 1 ? "" : "s", tp, pp, *dp, (long long)tp * pp * *dp);
    return MS_OK;
}

void train_warn_pipeline(const train_config *tc, int n_layer, int dp, int pp, int accum) {
    /* --vpp > 1 with fewer micro-batches than stages is no layout at all: the
     * interleaved schedule needs a multiple of pp, and its own error follows
     * (the 1F1B advice here would name a --micro-batch it refuses too) */
    if (pp < 2 || accum >= pp || tc->vpp > 1 || n_layer % pp) return;
    double f = 0; /* the schedule's idle time / compute time */
    if (par_schedule_bubble_fraction(PAR_SCHED_1F1B, pp, 1, accum, &f) != MS_OK)
        f = (double)(pp - 1) / accum; /* the textbook 1F1B number */
    int per = tc->batch / dp, mb = 0; /* sequences per rank and step; a micro-batch for pp */
    for (int d = per / pp; d >= 1 && !mb; d--)
        if (per % d == 0) mb = d;
    char fix[160];
    if (mb)
        snprintf(fix, sizeof fix, "--micro-batch %d gives %d micro-batches per step", mb, per / mb);
    else
        snprintf(fix, sizeof fix,
                 "--batch %d (--pp x --dp) with --micro-batch 1 gives %d micro-batches per step",
                 pp * dp, pp);
    ms_warn("pipeline: %d micro-batch%s per step for %d stages, fewer micro-batches than stages: "
            "the bubble idles each stage for %.0f%% of the step (1F1B: (pp-1)/(m+pp-1) with m "
            "micro-batches); %s (more make the bubble smaller)",
            accum, accum == 1 ? "" : "es", pp, 100 * f / (1 + f), fix);
}
