/* plan_step.c - the planner's step: per-layer costs, the pipeline through
 * the trainer's schedules, data-parallel overlap by bucket, and the parts
 * of the iteration (see plan.h).
 *
 * Names: h dim, a heads, s seq, V vocab, L layers, t tp, p pp, v vpp, b
 * micro-batch, d dp, m micro-batches per step, N = b s tokens of a micro-
 * batch, Nl = N / t its sequence-parallel shard. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"
#include "parallel/schedule.h"
#include "plan/plan.h"

/* How the operators move memory: passes over their tensor (each a read
 * and a write, one launch), by implementation.  Unfused: Megatron's
 * LayerNorm and GeLU as several element-wise kernels, cross entropy in a
 * few passes; fused: one kernel each. */
#define LN_PASSES_FWD(f) ((f) ? 1 : 4)
#define LN_PASSES_BWD(f) ((f) ? 2 : 6)
#define GELU_PASSES_FWD(f) ((f) ? 1 : 3)
#define GELU_PASSES_BWD(f) ((f) ? 2 : 4)
#define XENT_PASSES_FWD(f) ((f) ? 1 : 4)
#define XENT_PASSES_BWD(f) ((f) ? 1 : 2)
#define FA_BWD_FACTOR 2.5 /* flash attention backward / forward FLOPs (recomputes) */
#define TP_CHUNKS 4       /* MegaScale's TP overlap: GEMM and collective in 4 chunks */
#define ADAM_BYTES 34.0   /* fp32 p, g, m, v read; p, m, v, g (= 0) written; act copy written */
#define LAMB_BYTES 42.0   /* + one more pass over update and weight for the norms */

typedef struct {
    double fwd, bwd;       /* compute of one layer, one micro-batch */
    double tp_fwd, tp_bwd; /* exposed TP communication of it */
    double attn_fwd;       /* the attention core's forward (selective recompute) */
    double tp_comm_fwd;    /* the forward's TP collectives, all of them (full recompute) */
} layer_cost;

/* Keys a query attends to, on average (causal; window w: itself and the w-1
 * before it). */
static double keys_per_query(int s, int w) {
    if (w <= 0 || w >= s) return (s + 1) / 2.0;
    return ((double)w * (w + 1) / 2 + (double)(s - w) * w) / s;
}

/* What of an overlapped transfer of `full` seconds stays exposed, when the
 * schedule alone would leave `ideal` of it: the part the schedule hides,
 * less the cluster's overlap_exposed fraction of it (the cores copy the
 * bytes, or the transfer moves only while its rank waits). */
static double overlapped(const plan_cluster *c, double full, double ideal) {
    return ideal + c->overlap_exposed * fmax(0, full - ideal);
}

/* A collective hidden under a GEMM of g seconds, both in TP_CHUNKS chunks:
 * what is left exposed. */
static double chunked_exposed(const plan_cluster *c, double comm, double g) {
    double k = TP_CHUNKS;
    return overlapped(c, comm, comm / k + fmax(comm, g) * (k - 1) / k + g / k - g);
}

/* Flash attention (causal, or a sliding window): its FLOPs at the cluster's
 * fused-attention efficiency; without the efficient operators, at half of
 * it (FlashAttention-1, which Megatron-LM runs with --use-flash-attn:
 * FlashAttention-2 is about twice as fast, Dao 2023).  No score matrix is
 * stored, so selective recomputation costs nothing here. */
static void attention_cost(const plan_model *m, const plan_features *f, const plan_cluster *c,
                           int t, int b, double *fwd, double *bwd) {
    double s = m->seq, hl = (double)m->heads / t, dh = (double)m->dim / m->heads;
    double kv = keys_per_query(m->seq, m->window);
    double flops = 4.0 * b * hl * s * kv * dh;
    double rate = c->peak_flops * c->attn_eff * (f->fused ? 1 : 0.5);
    *fwd = flops / rate + c->launch_us * 1e-6;
    *bwd = FA_BWD_FACTOR * flops / rate + c->launch_us * 1e-6;
}

/* Passes of an element-wise operator over `elems` elements. */
static double passes_s(const plan_cluster *c, double passes, double elems, double tensors) {
    return passes * plan_bytes_s(c, tensors * elems * c->act_bytes);
}

/* The same for an operator that evaluates tanh or exp per element: at the
 * cluster's transcendental rate when it has one and it is the slower. */
static double transc_s(const plan_cluster *c, int passes, double elems, double tensors) {
    double bytes = tensors * elems * c->act_bytes, t = plan_bytes_s(c, bytes);
    if (c->transc_gbps > 0) t = fmax(t, bytes / (c->transc_gbps * 1e9) + c->launch_us * 1e-6);
    return passes * t;
}

/* LayerNorm backward passes: the cluster's measured ones for the fused
 * kernel, else the rule's. */
static double ln_bwd_passes(const plan_cluster *c, const plan_features *f) {
    return f->fused && c->ln_bwd_passes > 0 ? c->ln_bwd_passes : LN_PASSES_BWD(f->fused);
}

static layer_cost layer(const plan_model *m, const plan_features *f, const plan_cluster *c, int t,
                        int b, int world) {
    layer_cost r;
    memset(&r, 0, sizeof r);
    double h = m->dim, N = (double)b * m->seq, Nl = N / t;
    double G[4][3] = {{N, 3 * h / t, h}, {N, h, h / t}, {N, 4 * h / t, h}, {N, h, 4 * h / t}};
    double gf[4], gd[4], gw[4];
    for (int i = 0; i < 4; i++) {
        gf[i] = plan_gemm_s(c, G[i][0], G[i][1], G[i][2]);
        gd[i] = plan_gemm_s(c, G[i][0], G[i][2], G[i][1]); /* dX = dY W^T */
        gw[i] = plan_gemm_s(c, G[i][2], G[i][1], G[i][0]); /* dW = X^T dY */
        r.fwd += gf[i], r.bwd += gd[i] + gw[i];
    }
    double af, ab;
    attention_cost(m, f, c, t, b, &af, &ab);
    r.fwd += af, r.bwd += ab, r.attn_fwd = af;
    int n_ln = m->parallel_block ? 1 : 2, n_res = m->parallel_block ? 1 : 2;
    r.fwd += n_ln * passes_s(c, LN_PASSES_FWD(f->fused), Nl * h, 2);
    r.bwd += n_ln * passes_s(c, ln_bwd_passes(c, f), Nl * h, 2);
    r.fwd += transc_s(c, GELU_PASSES_FWD(f->fused), N * 4 * h / t, 2);
    r.bwd += transc_s(c, GELU_PASSES_BWD(f->fused), N * 4 * h / t, 2);
    r.fwd += n_res * passes_s(c, 1, Nl * h, 4); /* bias + dropout + residual */
    r.bwd += n_res * passes_s(c, 1, Nl * h, 3);
    if (t > 1) { /* sequence parallel: all-gather in, reduce-scatter out, per branch */
        const plan_link *l = plan_link_of(c, t, 1, world);
        double ag = plan_coll_s(l, PLAN_ALLGATHER, t, N * h * c->act_bytes);
        double rs = plan_coll_s(l, PLAN_REDUCE_SCATTER, t, N * h * c->act_bytes);
        int n = m->parallel_block ? 1 : 2; /* a parallel block's AG and RS serve both branches */
        r.tp_comm_fwd = n * (ag + rs);
        if (f->tp_overlap) { /* under the FFN GEMMs (with the QKV/proj ones for a parallel block) */
            double g_in = gf[2] + (m->parallel_block ? gf[0] : 0);
            double g_out = gf[3] + (m->parallel_block ? gf[1] : 0);
            double b_in = gd[3] + gw[3], b_out = gd[2] + gw[2];
            r.tp_fwd = chunked_exposed(c, ag, g_in) + chunked_exposed(c, rs, g_out);
            r.tp_bwd = chunked_exposed(c, rs, b_out) + chunked_exposed(c, ag, b_in);
            if (!m->parallel_block) { /* the attention half's AG / RS, under its own GEMMs */
                r.tp_fwd += chunked_exposed(c, ag, gf[0]) + chunked_exposed(c, rs, gf[1]);
                r.tp_bwd +=
                    chunked_exposed(c, rs, gd[0] + gw[0]) + chunked_exposed(c, ag, gd[1] + gw[1]);
            }
        } else { /* blocking (the trainer with --overlap without tp) */
            r.tp_fwd = n * (ag + rs);
            r.tp_bwd = n * (ag + rs);
        }
        /* the replicated LayerNorm and bias gradients summed over tp once a layer */
        r.tp_bwd += plan_coll_s(l, PLAN_ALLREDUCE, t, (m->parallel_block ? 4 : 6) * h * 4.0);
    }
    if (f->recompute == PLAN_RECOMPUTE_FULL) r.bwd += r.fwd, r.tp_bwd += r.tp_fwd;
    /* the trainer's: the backward runs the GeLU forward again (gpt_recompute_gelu), and the
     * LayerNorm forwards (layer_bwd, with their statistics) before it reads their outputs */
    int rc = plan_recompute_flags(f->recompute);
    if (rc & GPT_RECOMPUTE_GELU) r.bwd += transc_s(c, GELU_PASSES_FWD(f->fused), N * 4 * h / t, 2);
    if (rc & GPT_RECOMPUTE_LN) r.bwd += n_ln * passes_s(c, LN_PASSES_FWD(f->fused), Nl * h, 2);
    return r;
}

/* Embedding (first global chunk) and final LN + classifier + loss (last). */
static void ends_cost(const plan_model *m, const plan_features *f, const plan_cluster *c, int t,
                      int b, int world, double *emb_f, double *emb_b, double *cls_f,
                      double *cls_b) {
    double h = m->dim, N = (double)b * m->seq, Vl = (double)m->vocab / t;
    *emb_f = passes_s(c, 1, N * h / t, 3); /* gather of wte + wpe rows, add */
    *emb_b = passes_s(c, 1, N * h / t, 3) + passes_s(c, 1, Vl * h, 1); /* scatter-add, zero */
    double ln = passes_s(c, LN_PASSES_FWD(f->fused), N * h / t, 2);
    double logits = N * Vl * 4.0 / c->act_bytes; /* fp32 logits, in act-sized elements */
    *cls_f = ln + plan_gemm_s(c, N, Vl, h) + transc_s(c, XENT_PASSES_FWD(f->fused), logits, 2);
    *cls_b = passes_s(c, ln_bwd_passes(c, f), N * h / t, 2) + plan_gemm_s(c, N, h, Vl) +
             plan_gemm_s(c, h, Vl, N) + transc_s(c, XENT_PASSES_BWD(f->fused), logits, 2);
    if (t > 1) { /* as model/gpt_tp_vocab.c: the embedding's sum reduce-scattered to the
                  * sequence shards; the final LN's output gathered, the vocabulary slices'
                  * softmax statistics (max, sum, target logit) gathered; backward: the
                  * mirror images, the position-embedding gradient and ln_f's summed */
        const plan_link *l = plan_link_of(c, t, 1, world);
        double act = N * h * c->act_bytes;
        *emb_f += plan_coll_s(l, PLAN_REDUCE_SCATTER, t, act);
        *emb_b += plan_coll_s(l, PLAN_ALLGATHER, t, act) +
                  plan_coll_s(l, PLAN_ALLGATHER, t, (double)m->seq * h * 4.0);
        *cls_f += plan_coll_s(l, PLAN_ALLGATHER, t, act) +
                  plan_coll_s(l, PLAN_ALLGATHER, t, N * 3 * 4.0 * t);
        *cls_b += plan_coll_s(l, PLAN_REDUCE_SCATTER, t, act) +
                  plan_coll_s(l, PLAN_ALLREDUCE, t, 2 * h * 4.0);
    }
}

/* The model's own counts (model/gpt.h) for a plan_model: positions up to seq-max. */
static gpt_config gpt_of(const plan_model *m, int layers) {
    gpt_config g;
    memset(&g, 0, sizeof g);
    g.n_layer = layers, g.n_embd = m->dim, g.n_head = m->heads, g.vocab = m->vocab;
    g.seq_max = plan_seq_max(m), g.attn_window = m->window;
    g.block = m->parallel_block ? GPT_BLOCK_PARALLEL : GPT_BLOCK_SERIAL;
    return g;
}

void plan_params(const plan_model *m, double *layer, double *embed) {
    gpt_config one = gpt_of(m, 1), none = gpt_of(m, 0);
    double p0 = (double)gpt_config_num_params(&none); /* wte, wpe, ln_f */
    *layer = (double)gpt_config_num_params(&one) - p0;
    *embed = p0;
}

double plan_flops_per_token_6n(const plan_model *m) {
    gpt_config g = gpt_of(m, m->layers);
    return gpt_flops_per_token(&g, m->seq);
}

static double layer_params(const plan_model *m) {
    double l, e;
    plan_params(m, &l, &e);
    return l;
}
static double embed_params(const plan_model *m) {
    double l, e;
    plan_params(m, &l, &e);
    return e;
}

static double megatron_flops(const plan_model *m, double s) {
    double l = m->layers, h = m->dim, V = m->vocab;
    return 72 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

double plan_megatron_flops_per_token(const plan_model *m) {
    return megatron_flops(m, m->seq);
}

/* The formula with the attention the GPUs compute: causal, a token attends to the tokens
 * before it (s/2 of them on average, where the formula counts s), or within a window w
 * (w (1 - w/2s)).  Before, the full s without a window: a long sequence's MFU passed 100%. */
double plan_window_flops_per_token(const plan_model *m) {
    double s = m->seq, w = m->window;
    return megatron_flops(m, w > 0 && w < s ? w * (1 - w / (2 * s)) : s / 2);
}

int plan_recompute_flags(plan_recompute rc) {
    switch (rc) {
    case PLAN_RECOMPUTE_GELU:
        return GPT_RECOMPUTE_GELU;
    case PLAN_RECOMPUTE_LN:
        return GPT_RECOMPUTE_LN;
    case PLAN_RECOMPUTE_GELU_LN:
        return GPT_RECOMPUTE_GELU | GPT_RECOMPUTE_LN;
    default:
        return 0;
    }
}

plan_recompute plan_recompute_of_flags(int flags) {
    int gelu = flags & GPT_RECOMPUTE_GELU, ln = flags & GPT_RECOMPUTE_LN;
    return gelu && ln ? PLAN_RECOMPUTE_GELU_LN
           : gelu     ? PLAN_RECOMPUTE_GELU
           : ln       ? PLAN_RECOMPUTE_LN
                      : PLAN_RECOMPUTE_NONE;
}

ms_status plan_check_features(const plan_features *f, const plan_layout *l) {
    if (plan_recompute_flags(f->recompute) & GPT_RECOMPUTE_LN && l->tp > 1)
        return ms_error(MS_ERR_ARG,
                        "--recompute ln is not supported with tensor parallelism (--tp %d): the "
                        "trainer all-gathers the LayerNorm outputs over the tp ranks and refuses "
                        "it; use --recompute gelu",
                        l->tp);
    /* as train_pipe_plan; a layout --search has not filled in yet (its micro-batch or vpp
     * left to the search, or tp x pp past --gpus: checked after) has no tags to count (it
     * divided by zero: SIGFPE) */
    long long dp = l->tp > 0 && l->pp > 0 ? l->gpus / ((long long)l->tp * l->pp) : 0;
    if (f->pipe_tags && l->pp > 1 && dp > 0 && l->micro > 0 && l->vpp > 0) {
        long long n_micro = l->batch / (dp * l->micro);
        if (1 + 2 * (long long)l->pp * l->vpp * n_micro > PLAN_PIPE_TAGS)
            return ms_error(MS_ERR_ARG,
                            "--pp %d x --vpp %d with %lld micro-batches per step (--batch %d / "
                            "(dp %lld x --micro-batch %d)) needs 1 + 2 x %lld x %lld message "
                            "tags, more than the %d MPI guarantees, and the trainer refuses it: "
                            "raise --micro-batch or lower --vpp",
                            l->pp, l->vpp, n_micro, l->batch, dp, l->micro,
                            (long long)l->pp * l->vpp, n_micro, PLAN_PIPE_TAGS);
    }
    return MS_OK;
}

int plan_seq_max(const plan_model *m) {
    return m->seq_max > 0 ? m->seq_max : m->seq;
}

ms_status plan_check(const plan_model *m, const plan_layout *l) {
    if (m->layers < 1 || m->dim < 1 || m->heads < 1 || m->vocab < 1 || m->seq < 1)
        return ms_error(MS_ERR_ARG,
                        "the model needs --layers, --dim, --heads, --vocab and --seq "
                        "(or --model): got %d, %d, %d, %d, %d",
                        m->layers, m->dim, m->heads, m->vocab, m->seq);
    if (m->vocab < 2) /* (said as missing before: "needs --vocab ... got 1") */
        return ms_error(MS_ERR_ARG, "--vocab %d: a vocabulary needs at least 2 tokens", m->vocab);
    if (m->dim % m->heads)
        return ms_error(MS_ERR_ARG, "--dim %d is not divisible by --heads %d", m->dim, m->heads);
    if (m->seq_max < 0 || (m->seq_max > 0 && m->seq > m->seq_max))
        return ms_error(MS_ERR_ARG,
                        "--seq %d must be in 1..%d, the model's seq-max (--seq-max, or the "
                        "preset's), as in the trainer",
                        m->seq, m->seq_max);
    if (m->window < 0) return ms_error(MS_ERR_ARG, "--window %d must be >= 0", m->window);
    if (l->gpus < 1 || l->tp < 1 || l->pp < 1 || l->vpp < 1 || l->batch < 1 || l->micro < 1)
        return ms_error(MS_ERR_ARG,
                        "--gpus, --tp, --pp, --vpp, --batch and --micro-batch must be "
                        ">= 1 (got %d, %d, %d, %d, %d, %d)",
                        l->gpus, l->tp, l->pp, l->vpp, l->batch, l->micro);
    if (m->heads % l->tp)
        return ms_error(MS_ERR_ARG, "--tp %d does not divide --heads %d", l->tp, m->heads);
    /* products in 64 bits: --tp, --pp and --vpp go up to 65536 each */
    if (l->gpus % ((long long)l->tp * l->pp))
        return ms_error(MS_ERR_ARG, "--gpus %d is not a multiple of --tp %d x --pp %d", l->gpus,
                        l->tp, l->pp);
    int dp = l->gpus / (l->tp * l->pp);
    if (l->batch % ((long)dp * l->micro))
        return ms_error(MS_ERR_ARG,
                        "--batch %d is not a multiple of dp %d x --micro-batch %d (dp = --gpus "
                        "%d / (--tp %d x --pp %d))",
                        l->batch, dp, l->micro, l->gpus, l->tp, l->pp);
    if (m->layers % ((long long)l->pp * l->vpp))
        return ms_error(MS_ERR_ARG, "%d layers do not divide into --pp %d x --vpp %d chunks",
                        m->layers, l->pp, l->vpp);
    /* sequence parallelism splits a micro-batch's rows among the tp ranks,
     * as the trainer (train_check_tp) */
    if ((long long)l->micro * m->seq % l->tp)
        return ms_error(MS_ERR_ARG,
                        "--tp %d: a micro-batch of %d x --seq %d = %lld rows is not divisible by "
                        "%d (sequence parallelism gives each rank micro-batch*seq/tp rows, as in "
                        "the trainer)",
                        l->tp, l->micro, m->seq, (long long)l->micro * m->seq, l->tp);
    if (l->vpp > 1 && l->pp < 2) return ms_error(MS_ERR_ARG, "--vpp %d needs --pp >= 2", l->vpp);
    int n_micro = l->batch / (dp * l->micro);
    if (l->pp > 1) {
        ms_status st = par_schedule_check_args(l->vpp > 1 ? PAR_SCHED_INTERLEAVED : PAR_SCHED_1F1B,
                                               l->pp, l->vpp, n_micro);
        if (st != MS_OK)
            return ms_error_wrap(st,
                                 "%d micro-batches per step (--batch %d / (dp %d x --micro-batch "
                                 "%d)) for --pp %d --vpp %d",
                                 n_micro, l->batch, dp, l->micro, l->pp, l->vpp);
        /* the simulation's time and memory grow with the pairs (pipeline(): every stage's
         * instruction list at once); a batch given in tokens makes millions */
        if ((double)n_micro * l->pp * l->vpp > PLAN_MAX_PIPE_PAIRS)
            return ms_error(MS_ERR_ARG,
                            "%d micro-batches per step (--batch %d / (dp %d x --micro-batch "
                            "%d)) are more than the planner simulates with --pp %d --vpp %d: at "
                            "most %d (pp x vpp x micro-batches <= %d); --batch counts "
                            "sequences, not tokens",
                            n_micro, l->batch, dp, l->micro, l->pp, l->vpp,
                            PLAN_MAX_PIPE_PAIRS / (l->pp * l->vpp), PLAN_MAX_PIPE_PAIRS);
    }
    return MS_OK;
}

int plan_over_cap(const plan_model *m, const plan_layout *l) {
    if (l->pp < 2 || l->tp < 1 || l->vpp < 1 || l->micro < 1 || l->batch < 1 ||
        l->gpus % ((long long)l->tp * l->pp))
        return 0;
    long long dp = l->gpus / ((long long)l->tp * l->pp), per = dp * l->micro;
    if (l->batch % per) return 0;
    long long n_micro = l->batch / per;
    if ((double)n_micro * l->pp * l->vpp <= PLAN_MAX_PIPE_PAIRS) return 0;
    if (l->vpp > 1 && n_micro % l->pp) return 0; /* refused for the interleaving as well */
    /* the rest of plan_check with the fewest micro-batches the schedule takes */
    plan_layout few = *l;
    few.batch = (int)(per * (l->vpp > 1 ? l->pp : 1));
    return plan_check(m, &few) == MS_OK;
}

/* Everything about one configuration the step assembly needs. */
typedef struct {
    const plan_model *m;
    const plan_layout *l;
    const plan_features *f;
    const plan_cluster *c;
    int t, p, v, d, b, n_micro, lc; /* lc: layers per chunk */
    /* CPU machines: the compute slowdown when the ranks of a node share fewer cores than
     * they have threads (every rank counts, busy or not: a waiting rank's communication
     * thread and MPI keep polling, so an idle stage does not free its core) */
    double slow;
    layer_cost lay;
    double emb_f, emb_b, cls_f, cls_b, t_p2p;
} step_ctx;

static void ctx_init(step_ctx *x, const plan_model *m, const plan_layout *l, const plan_features *f,
                     const plan_cluster *c) {
    memset(x, 0, sizeof *x);
    x->m = m, x->l = l, x->f = f, x->c = c;
    x->t = l->tp, x->p = l->pp, x->v = l->vpp, x->b = l->micro;
    x->d = l->gpus / (l->tp * l->pp);
    x->n_micro = l->batch / (x->d * l->micro);
    x->lc = m->layers / (l->pp * l->vpp);
    int per_node = l->gpus < c->gpus_per_node ? l->gpus : c->gpus_per_node;
    x->slow = c->cores > 0 ? fmax(1, per_node * c->threads / c->cores) : 1;
    x->lay = layer(m, f, c, x->t, x->b, l->gpus);
    ends_cost(m, f, c, x->t, x->b, l->gpus, &x->emb_f, &x->emb_b, &x->cls_f, &x->cls_b);
    if (x->p > 1) /* each TP rank sends its sequence shard to the same TP rank of the next stage
                   * (the link of the pipeline group: one hop between nodes sets the pace) */
        x->t_p2p = plan_coll_s(plan_link_of(c, x->p, x->t * x->d, l->gpus), PLAN_P2P, 2,
                               (double)x->b * m->seq * m->dim / x->t * c->act_bytes);
}

/* FWD and BWD cost of every (stage, chunk), into fwd / bwd [p * v]; the
 * compute, exposed TP and exposed PP parts of each stage into the [p]
 * arrays. */
static void chunk_costs(const step_ctx *x, double *fwd, double *bwd, double *comp, double *tp,
                        double *pp) {
    int G = x->p * x->v;
    double p2p = x->p > 1 ? overlapped(x->c, x->t_p2p, x->f->pp_overlap ? 0 : x->t_p2p) : 0;
    /* blocking send + receive, or what of the decoupled ones the compute does not hide */
    for (int s = 0; s < x->p; s++) {
        comp[s] = tp[s] = pp[s] = 0;
        for (int ch = 0; ch < x->v; ch++) {
            int g = ch * x->p + s, i = s * x->v + ch;
            double cf = x->lc * x->lay.fwd, cb = x->lc * x->lay.bwd;
            if (g == 0) cf += x->emb_f, cb += x->emb_b;
            if (g == G - 1) cf += x->cls_f, cb += x->cls_b;
            double tf = x->lc * x->lay.tp_fwd, tb = x->lc * x->lay.tp_bwd;
            double pf = g < G - 1 ? p2p : 0, pb = g > 0 ? p2p : 0; /* the send; its receive */
            fwd[i] = x->slow * cf + tf + pf;
            bwd[i] = x->slow * cb + tb + pb;
            comp[s] += x->n_micro * x->slow * (cf + cb);
            tp[s] += x->n_micro * (tf + tb);
            pp[s] += x->n_micro * (pf + pb);
        }
    }
}

/* The pipeline part of the step: makespan of the stage lists under the
 * chunk costs. */
static ms_status pipeline(const step_ctx *x, const double *fwd, const double *bwd,
                          double *makespan) {
    if (x->p == 1) {
        *makespan = x->n_micro * (fwd[0] + bwd[0]);
        return MS_OK;
    }
    par_plan plan;
    par_sim_stats st;
    ms_status rc = par_plan_build(x->v > 1 ? PAR_SCHED_INTERLEAVED : PAR_SCHED_1F1B, x->p, x->v,
                                  x->n_micro, &plan);
    if (rc == MS_OK) {
        par_sim_costs costs = {
            .t_fwd = fwd,
            .t_bwd = bwd, /* the transfer's time the cores do not spend (chunk_costs) */
            .t_p2p = x->f->pp_overlap ? (1 - x->c->overlap_exposed) * x->t_p2p : 0};
        rc = par_schedule_simulate(&plan, &costs, &st, NULL);
        par_plan_free(&plan);
    }
    if (rc == MS_OK) *makespan = st.makespan;
    return rc;
}

/* The optimizer on a rank, in optim.c's order: the gradient norm's sum of squares (a read pass
 * over this rank's shard of the busiest stage) and its all-reduce; the updates shard by shard
 * in forward order (the embeddings' bucket, then block 0 ...); the write pass zeroing the other
 * ranks' shards of the gradients.  Each pass through memory, the update's bytes or the
 * measured time per parameter, two operators for each tensor of the stage (a sum of squares
 * and an update). */
typedef struct {
    double pre, update, zero; /* seconds of each phase */
    double stage;             /* parameters of the busiest stage on this rank (over tp) */
} opt_time;

static opt_time optimizer_time(const step_ctx *x) {
    opt_time o;
    const plan_cluster *c = x->c;
    o.stage = ((double)x->m->layers / x->p * layer_params(x->m) + embed_params(x->m)) / x->t;
    double n = o.stage / x->d; /* this rank's ZeRO shard of them */
    double per = x->f->lamb ? LAMB_BYTES : ADAM_BYTES;
    /* the trainer's fp32 gathers refresh the 16-bit copy, so its update does not write it
     * (optim.c act_of) */
    if (x->f->fp32_gather && x->d > 1 && c->act_bytes < 4) per -= c->act_bytes;
    gpt_config g = gpt_of(x->m, 1);
    double tensors = (double)x->m->layers / x->p * gpt_config_layer_tensors(&g) + GPT_EMBED_TENSORS;
    double launch = tensors * c->launch_us * 1e-6;
    /* the grad norm's all-reduce over every rank: inside a node when they all are */
    double norm =
        plan_coll_s(plan_link_of(c, x->l->gpus, 1, x->l->gpus), PLAN_ALLREDUCE, x->l->gpus, 8);
    double update = n * per / (c->hbm_gbps * 1e9 * c->hbm_eff);
    if (c->opt_ns_per_param > 0) /* measured: AdamW's time, LAMB's by its bytes */
        update = n * c->opt_ns_per_param * 1e-9 * (x->f->lamb ? LAMB_BYTES / ADAM_BYTES : 1);
    /* the sum of squares reads this rank's gradients once; the update leaves them 0 for the
     * next step (in its bytes), and a write pass zeroes the rest (the other ranks' shards) */
    o.pre = x->slow * (plan_bytes_s(c, n * c->grad_bytes) + launch) + norm;
    o.update = x->slow * (update + launch);
    o.zero = o.stage > n ? x->slow * plan_bytes_s(c, (o.stage - n) * c->grad_bytes) : 0;
    return o;
}

/* The ZeRO parts of one step: the gradients' reduce-scatter and the updated weights'
 * all-gather, exposed; the all-gather's own time; the gathered weights' conversion to the
 * 16-bit copy. */
typedef struct {
    double rs, ag, ag_comm, convert;
} dp_cost;

/* Exposed ZeRO communication of one step (o: the optimizer's phases).  A gathered weight is
 * 4 bytes with the trainer's fp32 gathers (parallel/zero.c gathers the fp32 masters, COMM_F32),
 * else act_bytes.  Without overlap: the reduce-scatter of all gradients after the backward, the
 * all-gather of the updated weights in the optimizer, each waited as soon as started.  With it
 * (the trainer's rule, parallel/zero.h): one bucket per layer, reduce-scattered one after the
 * other as the last micro-batch's backward finishes each layer, and all-gathered one after the
 * other before the next forward reaches it; the trainer's optimizer starts each bucket's gather
 * as soon as it has updated its shard (the later updates and the zeroing hide it), Megatron-LM's
 * and MegaScale's gathers start with the forward. */
static dp_cost dp_exposed(const step_ctx *x, const opt_time *o) {
    dp_cost r = {0};
    if (x->d == 1) return r;
    const plan_cluster *c = x->c;
    const plan_link *lk = plan_link_of(c, x->d, x->t, x->l->gpus);
    double lp = layer_params(x->m) / x->t, n_lay = (double)x->m->layers / x->p;
    double ep = embed_params(x->m) / x->t; /* on the first stage (and the tied copy on the last) */
    double wb = x->f->fp32_gather ? 4 : c->act_bytes; /* bytes of a gathered weight */
    double rs1 = plan_coll_s(lk, PLAN_REDUCE_SCATTER, x->d, lp * c->grad_bytes);
    double ag1 = plan_coll_s(lk, PLAN_ALLGATHER, x->d, lp * wb);
    double rse = plan_coll_s(lk, PLAN_REDUCE_SCATTER, x->d, ep * c->grad_bytes);
    double age = plan_coll_s(lk, PLAN_ALLGATHER, x->d, ep * wb);
    r.ag_comm = n_lay * ag1 + age;
    if (x->f->fp32_gather && c->act_bytes < 4) /* the param hook's to_act, a bucket at a time */
        r.convert = x->slow *
                    (plan_bytes_s(c, o->stage * (4 + c->act_bytes)) + n_lay * c->launch_us * 1e-6);
    if (!x->f->dp_overlap) {
        r.rs = n_lay * rs1 + rse, r.ag = r.ag_comm;
        return r;
    }
    /* reduce-scatter: buckets ready every layer-backward; one channel */
    double tb = x->slow * x->lay.bwd + x->lay.tp_bwd, tf = x->slow * x->lay.fwd + x->lay.tp_fwd;
    double ready = 0, end = 0;
    for (int i = 0; i < (int)n_lay; i++) {
        ready += tb;
        end = fmax(end, ready) + rs1;
    }
    end = fmax(end, ready) + rse; /* the embeddings come last */
    r.rs = overlapped(c, n_lay * rs1 + rse, end - ready);
    /* all-gather, times from the next forward's start: the embeddings first, then layer i
     * needed after i layer-forwards (with interleaving, chunk c's first use comes after c * p
     * warm-up forwards of the others); with the trainer's gathers, bucket k may start when the
     * optimizer has updated this rank's shard of it, lead(k) before the forward */
    double upd_per = x->f->fp32_gather ? o->update / o->stage : 0, tail = o->update + o->zero;
    double lead = x->f->fp32_gather ? tail - upd_per * ep : 0;
    double ag_end = -lead + age, ag_exposed = fmax(0, ag_end);
    for (int i = 0; i < (int)n_lay; i++) {
        int ch = i / x->lc, j = i % x->lc;
        double need = (x->v > 1 ? ch * x->p * x->lc * tf : 0) + j * tf;
        if (x->v == 1) need = i * tf;
        lead = x->f->fp32_gather ? tail - upd_per * (ep + (i + 1) * lp) : 0;
        ag_end = fmax(ag_end, -lead) + ag1;
        ag_exposed = fmax(ag_exposed, ag_end - need);
    }
    r.ag = overlapped(c, r.ag_comm, ag_exposed);
    return r;
}

ms_status plan_predict(const plan_model *m, const plan_layout *l, const plan_features *f,
                       const plan_cluster *c, plan_result *r) {
    memset(r, 0, sizeof *r);
    MS_TRY(plan_check(m, l));
    MS_TRY(plan_check_features(f, l));
    MS_TRY(plan_cluster_check(c, c->name));
    if (l->tp > c->gpus_per_node) /* the trainer places a tp group on one host */
        return ms_error(MS_ERR_ARG,
                        "--tp %d is more than the %d GPUs a node of %s has: tensor parallelism "
                        "runs inside a node",
                        l->tp, c->gpus_per_node, c->name);
    step_ctx x;
    ctx_init(&x, m, l, f, c);
    size_t n = (size_t)x.p * (size_t)x.v;
    double *buf = calloc(2 * n + 3 * (size_t)x.p, sizeof *buf);
    if (!buf) return ms_error(MS_ERR_NOMEM, "plan: costs of %zu chunks", n);
    double *fwd = buf, *bwd = buf + n, *comp = bwd + n, *tp = comp + x.p, *pp = tp + x.p;
    chunk_costs(&x, fwd, bwd, comp, tp, pp);
    double makespan = 0;
    ms_status st = pipeline(&x, fwd, bwd, &makespan);
    if (st == MS_OK) {
        int s = 0; /* the parts of the busiest stage */
        for (int i = 1; i < x.p; i++)
            if (comp[i] + tp[i] + pp[i] > comp[s] + tp[s] + pp[s]) s = i;
        r->compute_s = comp[s], r->tp_s = tp[s], r->pp_s = pp[s];
        r->bubble_s = fmax(0, makespan - (comp[s] + tp[s] + pp[s]));
        r->bubble_fraction = r->bubble_s / (comp[s] + tp[s] + pp[s]);
        opt_time o = optimizer_time(&x);
        dp_cost dc = dp_exposed(&x, &o);
        r->dp_s = dc.rs + dc.ag + dc.convert;
        r->dp_gather_s = dc.ag, r->dp_gather_comm_s = dc.ag_comm, r->dp_convert_s = dc.convert;
        r->dp_gather_elem_bytes = f->fp32_gather ? 4 : c->act_bytes;
        r->dp_gather_gb = x.d > 1 ? o.stage * r->dp_gather_elem_bytes / 1e9 : 0;
        if (x.p > 1) /* the tied embedding's gradients summed over the first and last stage */
            r->dp_s += plan_coll_s(plan_link_of(c, x.p, x.t * x.d, l->gpus), PLAN_ALLREDUCE, 2,
                                   (double)m->vocab * m->dim / x.t * c->grad_bytes);
        r->optimizer_s = o.pre + o.update + o.zero;
        r->data_s = c->step_ms * 1e-3 + (f->async_data ? 0 : x.n_micro * c->data_ms * 1e-3);
        r->iter_s = makespan + r->dp_s + r->optimizer_s + r->data_s;
        r->dp = x.d, r->n_micro = x.n_micro;
        r->model_flops_per_token = plan_megatron_flops_per_token(m);
        r->tokens_per_s = (double)l->batch * m->seq / r->iter_s;
        r->mfu = r->model_flops_per_token * r->tokens_per_s / ((double)l->gpus * c->peak_flops);
        r->mfu_window = r->mfu * plan_window_flops_per_token(m) / r->model_flops_per_token;
        st = plan_memory(m, l, f, c, r);
    }
    free(buf);
    return st;
}
