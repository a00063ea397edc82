/* plan_memory.c - memory per GPU: weights, gradients, ZeRO-sharded
 * optimizer state and activations (Korthikanti et al., "Reducing
 * Activation Recomputation in Large Transformer Models", 2022). */
#include <math.h>

#include "plan/plan.h"

double plan_layer_act_bytes(const plan_model *m, int tp, int micro, plan_recompute rc, int flash,
                            double act_bytes) {
    double s = m->seq, b = micro, h = m->dim, a = m->heads;
    double sbh = s * b * h / tp;  /* with sequence parallelism everything is split over tp */
    double scale = act_bytes / 2; /* the formulas count 16-bit activations */
    if (rc == PLAN_RECOMPUTE_FULL) return 2 * sbh * scale; /* the layer's input only */
    /* 34 s b h: 11 attention (QKV input, Q K V, AV input, proj input, dropout mask), 19 MLP,
     * 4 LayerNorm inputs; a parallel block has one LayerNorm */
    double linear = m->parallel_block ? 32 : 34;
    /* the attention scores (s x s per head: softmax output, its dropout mask and output)
     * are not kept by a flash attention kernel nor with selective recomputation */
    double kv = m->window > 0 && m->window < m->seq ? m->window : s;
    double scores = (rc == PLAN_RECOMPUTE_SELECTIVE || flash) ? 0 : 5 * a * kv / h;
    return sbh * (linear + scores) * scale;
}

void plan_memory(const plan_model *m, const plan_layout *l, const plan_features *f,
                 const plan_cluster *c, int in_flight, int in_flight_last, plan_result *r) {
    int t = l->tp, p = l->pp, d = l->gpus / (l->tp * l->pp);
    double gb = 1e9;
    double lp, emb;
    plan_params(m, &lp, &emb);
    /* the busiest stage: the first (embeddings) or, with pp > 1, the last (the tied copy of
     * wte, the logits); both hold L/p layers */
    double n = ((double)m->layers / p * lp + emb) / t;
    double master = c->act_bytes < 4 ? 4 : 0; /* fp32 master weights beside 16-bit ones */
    r->mem_params_gb = n * c->act_bytes / gb;
    r->mem_grads_gb = n * c->grad_bytes / gb;    /* the accumulation buffer, whole */
    r->mem_optim_gb = n * (8 + master) / d / gb; /* Adam/LAMB m, v (+ master): ZeRO shard */
    double lc = (double)m->layers / (p * l->vpp);
    double per_layer = plan_layer_act_bytes(m, t, l->micro, f->recompute, 1, c->act_bytes);
    double N = (double)l->micro * m->seq;
    double logits = N * m->vocab / t * 4.0; /* fp32 logits of one micro-batch, last stage */
    /* with full recomputation the layer whose backward runs holds its recomputed
     * activations meanwhile: one layer's worth on top of the kept inputs */
    double working =
        f->recompute == PLAN_RECOMPUTE_FULL
            ? plan_layer_act_bytes(m, t, l->micro, PLAN_RECOMPUTE_NONE, 1, c->act_bytes)
            : 0;
    /* the first stage's, the last stage's (one stage: both on it, all micro-batches in
     * flight).  The embedding outputs add nothing: the trainer embeds straight into block
     * 0's saved input (gpt_embed_fwd writes layers[0].resid_in), which per_layer already
     * counts (the first LayerNorm's input; with full recomputation the kept input). */
    double first = in_flight * lc * per_layer + working;
    double last = (p == 1 ? in_flight : in_flight_last) * lc * per_layer + working + logits;
    r->mem_act_gb = fmax(first, last) / gb;
    r->mem_reserved_gb = c->reserved_gb;
    r->memory_gb =
        r->mem_params_gb + r->mem_grads_gb + r->mem_optim_gb + r->mem_act_gb + r->mem_reserved_gb;
    r->fits = r->memory_gb <= c->mem_gb;
}
