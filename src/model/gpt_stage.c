/* gpt_stage.c - a pipeline stage of the model: the layer assignment, the
 * per-chunk forward / backward over one activation set, and the queries
 * the trainer and the weight files need (see "pipeline stages" in gpt.h).
 *
 * A set holds one chunk's saved activations (chunk_layers blocks), the
 * micro-batch's tokens (for the embedding backward) and the gradient of the
 * chunk's output; running chunk c on set k points the model's per-block
 * views (m->layers[l0..]) and m->tokens at set k, so the single-model block
 * passes of gpt_pass.c / gpt_tp.c run unchanged.  The backward scratch
 * (m->dresid, ...) is shared: one pass runs at a time. */
#include <stdio.h>
#include <string.h>

#include "base/events.h"
#include "model/gpt_internal.h"

ms_status gpt_stage_init(gpt_stage *st, const gpt_config *cfg, int pp, int vpp, int stage,
                         int slots) {
    memset(st, 0, sizeof *st);
    if (pp < 1 || vpp < 1 || stage < 0 || stage >= pp || slots < 1)
        return ms_error(MS_ERR_ARG, "pipeline stage %d of pp %d, vpp %d, %d activation sets", stage,
                        pp, vpp, slots);
    int G = pp * vpp;
    if (cfg->n_layer % G != 0)
        return ms_error(MS_ERR_ARG,
                        "pipeline parallelism: %d layers are not divisible by --pp %d x --vpp %d "
                        "= %d chunks (each chunk holds layers/(pp*vpp) consecutive blocks)",
                        cfg->n_layer, pp, vpp, G);
    *st = (gpt_stage){pp, vpp, stage, cfg->n_layer / G, slots};
    return MS_OK;
}

const gpt_stage *gpt_get_stage(const gpt_model *m) {
    return m->pipe ? &m->stage : NULL;
}

int gpt_tensor_elsewhere(const gpt_model *m, const char *name) {
    if (!m->pipe || gpt_find(m, name) >= 0) return 0;
    int l, n = 0;
    if (sscanf(name, "h.%d.%n", &l, &n) == 1 && n > 0)
        return l >= 0 && l < m->cfg.n_layer && !gpt_holds_layer(m, l);
    return !strcmp(name, "wte.weight") || !strcmp(name, "wpe.weight") ||
           !strcmp(name, "ln_f.weight") || !strcmp(name, "ln_f.bias");
}

/* Global chunk of local chunk c. */
static int global_chunk(const gpt_model *m, int c) {
    MS_CHECKF(m->pipe && c >= 0 && c < m->stage.vpp, "chunk %d of a %s model", c,
              m->pipe ? "stage" : "whole");
    return c * m->stage.pp + m->stage.stage;
}

/* Bytes of this rank's (N/tp, C) rows of N tokens. */
static size_t rows_bytes_n(const gpt_model *m, size_t N) {
    return N / (size_t)m->tp * (size_t)m->cfg.n_embd * be_dtype_size(m->be->act_dtype);
}

/* The same at the model's capacity (one set's buffers). */
static size_t rows_bytes(const gpt_model *m) {
    return rows_bytes_n(m, (size_t)m->B * m->T);
}

/* Point the views of chunk c's blocks and m->tokens at set `slot`. */
static int use_slot(gpt_model *m, int c, int slot) {
    int g = global_chunk(m, c), cl = m->stage.chunk_layers;
    MS_CHECKF(slot >= 0 && slot < m->stage.slots, "activation set %d of %d", slot, m->stage.slots);
    for (int j = 0; j < cl; j++)
        m->layers[g * cl + j] = m->slot_layers[(size_t)slot * cl + j];
    m->tokens = m->slot_tokens + (size_t)slot * m->B * m->T;
    return g;
}

void *gpt_chunk_input(gpt_model *m, int c, int slot) {
    (void)global_chunk(m, c);
    return m->slot_layers[(size_t)slot * m->stage.chunk_layers].resid_in;
}

void *gpt_chunk_dout(gpt_model *m, int c, int slot) {
    (void)global_chunk(m, c);
    return (char *)m->slot_dout + (size_t)slot * rows_bytes(m);
}

static void hook_params(gpt_model *m, const size_t *r) {
    if (m->param_hook && r[1] > r[0]) m->param_hook(m->param_hook_ctx, r[0], r[1]);
}

static void hook_grads(gpt_model *m, const size_t *r) {
    if (m->grad_hook && r[1] > r[0]) m->grad_hook(m->grad_hook_ctx, r[0], r[1]);
}

/* tokens, targets (B,T) host; out (Nl,C) device (not on the last chunk). */
float gpt_chunk_forward(gpt_model *m, int c, int slot, const int32_t *tokens,
                        const int32_t *targets, int B, int T, float dloss, int grad, void *out,
                        int final) {
    MS_CHECKF(B >= 1 && B <= m->B && T >= 1 && T <= m->T,
              "micro-batch (%d,%d) exceeds the model's buffers (%d,%d)", B, T, m->B, m->T);
    int g = use_slot(m, c, slot), cl = m->stage.chunk_layers, N = B * T;
    int last = g == m->stage.pp * m->stage.vpp - 1;
    int64_t t0 = grad && ms_ev_on() ? ms_ev_now() : 0;
    if (g == 0) {
        hook_params(m, m->erange);
        m->be->to_device(m->be, m->tokens, tokens, sizeof(int32_t) * (size_t)N);
        gpt_embed_fwd(m, B, T);
    }
    for (int l = g * cl; l < (g + 1) * cl; l++) {
        void *y = l + 1 < (g + 1) * cl ? m->layers[l + 1].resid_in : (last ? m->x_final : out);
        hook_params(m, &m->lrange[2 * l]);
        gpt_block_fwd(m, l, y, B, T);
    }
    if (!last) {
        if (t0) gpt_trace_pass(m, c, t0, ms_ev_now(), 0);
        return 0;
    }
    hook_params(m, m->frange);
    hook_params(m, m->erange); /* the wte copy */
    float loss = gpt_head_pass(m, targets, N, dloss, grad);
    if (grad) {
        m->be->copy(m->be, gpt_chunk_dout(m, c, slot), m->dresid, rows_bytes_n(m, (size_t)N));
        if (final) hook_grads(m, m->frange);
    }
    if (t0) gpt_trace_pass(m, c, t0, ms_ev_now(), 0);
    return loss;
}

/* din (Nl,C) device (not on global chunk 0). */
void gpt_chunk_backward(gpt_model *m, int c, int slot, int B, int T, void *din, int final) {
    int g = use_slot(m, c, slot), cl = m->stage.chunk_layers;
    size_t bytes = rows_bytes_n(m, (size_t)B * T);
    int64_t t0 = ms_ev_on() ? ms_ev_now() : 0;
    m->be->copy(m->be, m->dresid, gpt_chunk_dout(m, c, slot), bytes);
    for (int l = (g + 1) * cl - 1; l >= g * cl; l--) {
        gpt_block_bwd(m, l, B, T);
        if (final) hook_grads(m, &m->lrange[2 * l]);
    }
    if (g == 0)
        gpt_embed_bwd(m, B, T);
    else
        m->be->copy(m->be, din, m->dresid, bytes);
    if (t0) gpt_trace_pass(m, c, t0, t0, ms_ev_now());
}

void gpt_embedding_grads_ready(gpt_model *m) {
    hook_grads(m, m->erange);
}
