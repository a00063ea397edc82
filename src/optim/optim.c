/* optim.c - AdamW / LAMB updates over the model's parameter table. */
#include "optim/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A contiguous run of one tensor that this rank updates: the whole tensor
 * alone, or its intersection with one of the rank's ZeRO shards. */
typedef struct {
    int tensor;
    size_t off; /* element offset in the parameter / gradient buffers */
    size_t n;
    size_t state; /* element offset in the m / v buffers */
} opt_piece;

/* Elements [off, off + n) of the gradient buffer. */
typedef struct {
    size_t off, n;
} opt_range;

struct opt_state {
    opt_config cfg;
    gpt_model *m;
    be_backend *be;
    par_zero *zero;    /* NULL: this rank holds the whole state */
    opt_piece *pieces; /* shard by shard (forward order), tensor by tensor */
    int n_pieces;
    int n_shards;     /* 1 without ZeRO */
    int *shard_first; /* (n_shards + 1): shard s holds pieces [first[s], first[s+1]) */
    opt_range *gaps;  /* the gradient elements no piece covers (other ranks' shards) */
    int n_gaps;
    size_t n_state;
    float *mom, *var; /* fp32 (n_state) on the backend */
    double *norms;    /* LAMB: 2 per tensor, ||w||^2 and ||u||^2 */
    comm_group *pp;   /* pipeline group of the norm sum (NULL: none) */
    int pp_skip;      /* tensor left out of the norm (-1: none) */
    int t;
};

ms_status opt_kind_parse(const char *s, opt_kind *out) {
    if (!strcmp(s, "adamw"))
        *out = OPT_ADAMW;
    else if (!strcmp(s, "lamb"))
        *out = OPT_LAMB;
    else
        return ms_error(MS_ERR_ARG, "unknown optimizer '%s' (adamw or lamb)", s);
    return MS_OK;
}

const char *opt_kind_name(opt_kind k) {
    return k == OPT_LAMB ? "lamb" : "adamw";
}

ms_status opt_sched_parse(const char *s, opt_sched_kind *out) {
    if (!strcmp(s, "constant"))
        *out = OPT_SCHED_CONSTANT;
    else if (!strcmp(s, "cosine"))
        *out = OPT_SCHED_COSINE;
    else
        return ms_error(MS_ERR_ARG, "unknown lr schedule '%s' (constant or cosine)", s);
    return MS_OK;
}

float opt_lr_at(const opt_schedule *sc, int s) {
    if (sc->warmup > 0 && s < sc->warmup) return sc->lr * (float)(s + 1) / (float)sc->warmup;
    if (sc->kind == OPT_SCHED_CONSTANT) return sc->lr;
    int span = sc->total - 1 - sc->warmup;
    double frac = span > 0 ? (double)(s - sc->warmup) / span : 1.0;
    if (frac > 1) frac = 1;
    if (frac < 0) frac = 0;
    double coeff = 0.5 * (1.0 + cos(M_PI * frac)); /* 1 -> 0 */
    double lo = (double)sc->lr * sc->floor;
    return (float)(lo + coeff * ((double)sc->lr - lo));
}

static int range_cmp(const void *a, const void *b) {
    size_t x = ((const opt_range *)a)->off, y = ((const opt_range *)b)->off;
    return (x > y) - (x < y);
}

/* The complement of the pieces in [0, elements): what the update does not
 * consume, zeroed at the end of each step (with ZeRO, the other ranks'
 * shards, whose gradients this rank only sent). */
static ms_status plan_gaps(opt_state *o) {
    size_t total = gpt_num_elements(o->m), at = 0;
    opt_range *r = malloc(((size_t)o->n_pieces + 1) * sizeof *r);
    o->gaps = malloc(((size_t)o->n_pieces + 1) * sizeof *o->gaps);
    if (!r || !o->gaps) {
        free(r);
        return ms_error(MS_ERR_NOMEM, "optimizer: out of memory");
    }
    for (int i = 0; i < o->n_pieces; i++)
        r[i] = (opt_range){o->pieces[i].off, o->pieces[i].n};
    qsort(r, (size_t)o->n_pieces, sizeof *r, range_cmp);
    for (int i = 0; i <= o->n_pieces; i++) {
        size_t next = i < o->n_pieces ? r[i].off : total;
        if (next > at) o->gaps[o->n_gaps++] = (opt_range){at, next - at};
        if (i < o->n_pieces && r[i].off + r[i].n > at) at = r[i].off + r[i].n;
    }
    free(r);
    return MS_OK;
}

/* Cut the tensors into pieces: whole tensors, or their overlaps with the
 * owned shards. */
static ms_status plan_pieces(opt_state *o) {
    gpt_model *m = o->m;
    int nt = gpt_num_tensors(m), ns = o->zero ? par_zero_num_shards(o->zero) : 1;
    o->pieces = calloc((size_t)(nt + ns) * 2, sizeof *o->pieces);
    o->shard_first = calloc((size_t)ns + 1, sizeof *o->shard_first);
    if (!o->pieces || !o->shard_first) return ms_error(MS_ERR_NOMEM, "optimizer: out of memory");
    o->n_shards = ns;
    for (int s = 0; s < ns; s++) {
        o->shard_first[s] = o->n_pieces;
        size_t lo = 0, hi = gpt_num_elements(m);
        if (o->zero) par_zero_shard(o->zero, s, &lo, &hi);
        for (int i = 0; i < nt; i++) {
            const gpt_param *p = gpt_tensor(m, i);
            size_t a = p->offset > lo ? p->offset : lo;
            size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
            if (a >= b) continue;
            MS_CHECK(o->n_pieces < (nt + ns) * 2);
            opt_piece *pc = &o->pieces[o->n_pieces++];
            pc->tensor = i;
            pc->off = a;
            pc->n = b - a;
            pc->state = o->zero ? o->n_state + (a - lo) : a;
        }
        o->n_state += hi - lo;
    }
    o->shard_first[ns] = o->n_pieces;
    return plan_gaps(o);
}

ms_status opt_create(opt_state **out, const opt_config *cfg, gpt_model *m, par_zero *zero) {
    *out = NULL;
    opt_state *o = calloc(1, sizeof *o);
    if (!o) return ms_error(MS_ERR_NOMEM, "optimizer: out of host memory");
    o->cfg = *cfg;
    o->m = m;
    o->be = gpt_backend(m);
    o->zero = zero;
    o->pp_skip = -1;
    ms_status st = plan_pieces(o);
    size_t bytes = o->n_state * sizeof(float);
    if (st == MS_OK && !strcmp(o->be->name, "cpu")) { /* the model's buffers and this state */
        double p = (double)gpt_num_elements(m) * sizeof(float);
        double c =
            o->be->act_dtype == BE_F32 ? 0 : p / sizeof(float) * be_dtype_size(o->be->act_dtype);
        double act = (double)gpt_activation_bytes(m);
        char copy[64] = "", parts[320];
        if (c > 0) snprintf(copy, sizeof copy, ", their bf16 copy %.1f GB", c / 1e9);
        snprintf(parts, sizeof parts,
                 "parameters %.1f GB, gradients %.1f GB%s, optimizer state %.1f GB, activations "
                 "%.1f GB",
                 p / 1e9, p / 1e9, copy, 2.0 * (double)bytes / 1e9, act / 1e9);
        st = be_cpu_check_host_memory("model", 2 * p + c + 2.0 * (double)bytes + act, parts);
    }
    if (st == MS_OK) {
        o->mom = o->be->alloc(o->be, bytes);
        o->var = o->be->alloc(o->be, bytes);
        o->norms = calloc((size_t)gpt_num_tensors(m) * 2, sizeof(double));
        if (!o->mom || !o->var || !o->norms)
            st = ms_error(MS_ERR_NOMEM, "optimizer: cannot allocate %.1f MB of state on %s",
                          2.0 * (double)bytes / 1e6, o->be->name);
    }
    if (st != MS_OK) {
        opt_destroy(o);
        return st;
    }
    *out = o;
    return MS_OK;
}

void opt_destroy(opt_state *o) {
    if (!o) return;
    if (o->mom) o->be->free(o->be, o->mom);
    if (o->var) o->be->free(o->be, o->var);
    free(o->pieces);
    free(o->shard_first);
    free(o->gaps);
    free(o->norms);
    free(o);
}

void opt_set_pipeline(opt_state *o, comm_group *pp, int skip) {
    o->pp = pp;
    o->pp_skip = skip;
}

int opt_steps_done(const opt_state *o) {
    return o->t;
}

int opt_state_pieces(opt_state *o, opt_state_piece *out, int max) {
    for (int i = 0; i < o->n_pieces && i < max; i++) {
        const opt_piece *pc = &o->pieces[i];
        out[i] =
            (opt_state_piece){pc->tensor, pc->off, pc->n, o->mom + pc->state, o->var + pc->state};
    }
    return o->n_pieces;
}

void opt_set_steps(opt_state *o, int t) {
    o->t = t;
}

const opt_config *opt_get_config(const opt_state *o) {
    return &o->cfg;
}

/* Sum over ranks of the DP group (no-op alone). */
static ms_status dp_sum(opt_state *o, double *x, size_t n) {
    if (!o->zero) return MS_OK;
    return comm_allreduce(par_zero_group(o->zero), x, x, n, COMM_F64, COMM_SUM);
}

/* Sum over the ranks of the model's TP group (no-op without one). */
static ms_status tp_sum(opt_state *o, double *x, size_t n) {
    comm_group *g = gpt_tp_group(o->m);
    return g ? comm_allreduce(g, x, x, n, COMM_F64, COMM_SUM) : MS_OK;
}

/* 1 if this rank contributes tensor t to sums over TP: the shards of split
 * tensors everywhere, replicated tensors (equal on all TP ranks) only on
 * TP rank 0, so that each is counted once. */
static int tp_counts(const opt_state *o, int t) {
    return gpt_tp_rank(o->m) == 0 || gpt_tensor(o->m, t)->split != GPT_SPLIT_NONE;
}

/* Global squared norm of the gradients this rank updates, summed over ranks;
 * *own: this rank's part was not finite (before the sums). */
static ms_status grad_sq(opt_state *o, double *sq, int *own) {
    *sq = 0;
    for (int i = 0; i < o->n_pieces; i++)
        if (tp_counts(o, o->pieces[i].tensor) && o->pieces[i].tensor != o->pp_skip)
            *sq += o->be->sum_squares(o->be, gpt_grads(o->m) + o->pieces[i].off, o->pieces[i].n);
    *own = !isfinite(*sq);
    MS_TRY(dp_sum(o, sq, 1));
    MS_TRY(tp_sum(o, sq, 1));
    return o->pp ? comm_allreduce(o->pp, sq, sq, 1, COMM_F64, COMM_SUM) : MS_OK;
}

/* This rank's shard s is updated: with ZeRO-2 its bucket's all-gather
 * starts now (forward order), overlapping the remaining shards' updates. */
static ms_status shard_done(opt_state *o, int s) {
    return o->zero ? par_zero_gather_shard(o->zero, s) : MS_OK;
}

/* Where the update writes piece pc's act copy (the bf16 weights the ops
 * read) in the same pass: without ZeRO, whose all-gather refreshes the copy
 * instead, and where the copy is not the fp32 buffer itself. */
static void *act_of(opt_state *o, const opt_piece *pc) {
    char *act = gpt_params_act(o->m);
    if (o->zero || act == (char *)gpt_params(o->m)) return NULL;
    return act + pc->off * be_dtype_size(o->be->act_dtype);
}

/* LAMB: moments and directions piece by piece, per-tensor norms assembled
 * over the pieces (and ranks), then the trust-ratio steps. */
static ms_status lamb_all(opt_state *o, float lr, float gscale, int t) {
    be_backend *be = o->be;
    const opt_config *c = &o->cfg;
    int nt = gpt_num_tensors(o->m);
    memset(o->norms, 0, sizeof(double) * 2 * (size_t)nt);
    for (int i = 0; i < o->n_pieces; i++) {
        const opt_piece *pc = &o->pieces[i];
        float wd = gpt_tensor(o->m, pc->tensor)->decay ? c->weight_decay : 0.0f;
        double w_sq = 0, u_sq = 0;
        be->lamb_moments(be, gpt_grads(o->m) + pc->off, gpt_params(o->m) + pc->off,
                         o->mom + pc->state, o->var + pc->state, pc->n, c->beta1, c->beta2, c->eps,
                         wd, t, gscale, &w_sq, &u_sq);
        o->norms[2 * pc->tensor] += w_sq;
        o->norms[2 * pc->tensor + 1] += u_sq;
    }
    MS_TRY(dp_sum(o, o->norms, 2 * (size_t)nt));
    for (int i = 0; i < nt; i++) /* tensor-parallel norms: sum the shards over TP */
        if (!tp_counts(o, i)) o->norms[2 * i] = o->norms[2 * i + 1] = 0;
    MS_TRY(tp_sum(o, o->norms, 2 * (size_t)nt));
    for (int s = 0; s < o->n_shards; s++) {
        for (int i = o->shard_first[s]; i < o->shard_first[s + 1]; i++) {
            const opt_piece *pc = &o->pieces[i];
            double wn = sqrt(o->norms[2 * pc->tensor]), un = sqrt(o->norms[2 * pc->tensor + 1]);
            double ratio = (wn > 0 && un > 0) ? wn / un : 1.0;
            be->lamb_apply(be, gpt_params(o->m) + pc->off, act_of(o, pc), gpt_grads(o->m) + pc->off,
                           pc->n, (float)(lr * ratio));
        }
        MS_TRY(shard_done(o, s));
    }
    return MS_OK;
}

/* AdamW, shard by shard. */
static ms_status adamw_all(opt_state *o, float lr, float gscale, int t) {
    be_backend *be = o->be;
    const opt_config *c = &o->cfg;
    for (int s = 0; s < o->n_shards; s++) {
        for (int i = o->shard_first[s]; i < o->shard_first[s + 1]; i++) {
            const opt_piece *pc = &o->pieces[i];
            float wd = gpt_tensor(o->m, pc->tensor)->decay ? c->weight_decay : 0.0f;
            be->adamw_step(be, gpt_params(o->m) + pc->off, act_of(o, pc), gpt_grads(o->m) + pc->off,
                           o->mom + pc->state, o->var + pc->state, pc->n, lr, c->beta1, c->beta2,
                           c->eps, wd, t, gscale);
        }
        MS_TRY(shard_done(o, s));
    }
    return MS_OK;
}

ms_status opt_step(opt_state *o, float lr, opt_stats *stats) {
    const opt_config *c = &o->cfg;
    double sq;
    MS_TRY(grad_sq(o, &sq, &stats->own_nonfinite));
    stats->grad_norm = sqrt(sq);
    stats->clip_scale = 1.0f;
    /* Any NaN/Inf element makes the sum of squares non-finite, so this one
     * pass is also the non-finite check (and every rank sees the same sum). */
    if (!isfinite(sq))
        return ms_error(MS_ERR_NONFINITE, "non-finite gradient (global norm %g)", stats->grad_norm);
    if (c->grad_clip > 0) { /* torch.nn.utils.clip_grad_norm_ */
        double coef = c->grad_clip / (stats->grad_norm + 1e-6);
        if (coef < 1.0) stats->clip_scale = (float)coef;
    }
    int t = ++o->t;
    if (c->kind == OPT_LAMB)
        MS_TRY(lamb_all(o, lr, stats->clip_scale, t));
    else
        MS_TRY(adamw_all(o, lr, stats->clip_scale, t));
    for (int i = 0; i < o->n_gaps; i++) /* the updates consumed the rest */
        o->be->zero(o->be, gpt_grads(o->m) + o->gaps[i].off, o->gaps[i].n * sizeof(float));
    /* the act copy: written by the updates (act_of), or by ZeRO's gathers */
    return MS_OK;
}
