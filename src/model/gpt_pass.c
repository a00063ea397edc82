/* gpt_pass.c - forward and backward passes of the GPT model over a backend.
 *
 * Per block (serial):   x1 = x + c_proj(attn(ln_1(x)));  y = x1 + mlp(ln_2(x1))
 * Per block (parallel): y = x + c_proj(attn(ln_1(x))) + mlp(ln_1(x))
 * Linears use HF Conv1D layout: out (N,OC) = inp (N,IC) @ W (IC,OC) + b.
 * With tensor parallelism (m->tp > 1) the same skeleton (hooks, order of
 * the gradient-ready ranges) calls the tensor-parallel embedding, blocks
 * and classifier of gpt_tp.c / gpt_tp_vocab.c.
 */
#include <math.h>
#include <string.h>

#include "base/events.h"
#include "model/gpt_internal.h"

/* out (N,OC) = inp (N,IC) @ W (IC,OC) [+ b], optionally through GeLU (pre
 * receives the value before it). */
void gpt_linear_fwd(gpt_model *m, void *out, const void *inp, int tw, int tb, int N, int IC, int OC,
                    be_epilogue epi, void *pre) {
    be_backend *be = m->be;
    be->gemm(be, 0, 0, N, OC, IC, 1.0f, inp, IC, gpt_w(m, tw), OC, 0.0f, out, OC, 0,
             tb >= 0 ? gpt_w(m, tb) : NULL, epi, pre);
}

/* Backward of gpt_linear_fwd: dW += inp^T dout, dbias += colsum(dout) (if
 * dbias), dinp = dout W^T (+ dinp when accumulate). */
void gpt_linear_bwd(gpt_model *m, void *dinp, int accumulate, const void *dout, const void *inp,
                    int tw, float *dbias, int N, int IC, int OC) {
    be_backend *be = m->be;
    be->gemm(be, 1, 0, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, gpt_g(m, tw), OC, 1, NULL,
             BE_EPI_NONE, NULL);
    if (dbias) be->bias_bwd(be, dbias, dout, N, OC);
    be->gemm(be, 0, 1, N, IC, OC, 1.0f, dout, OC, gpt_w(m, tw), OC, accumulate ? 1.0f : 0.0f, dinp,
             IC, 0, NULL, BE_EPI_NONE, NULL);
}

/* With GPT_RECOMPUTE_GELU: la->fc_gelu (the shared buffer) = gelu(la->fc_pre)
 * again, n elements, before the backward reads it. */
void gpt_recompute_gelu(gpt_model *m, gpt_layer_acts *la, size_t n) {
    if (m->rc_gelu) m->be->gelu_fwd(m->be, la->fc_gelu, la->fc_pre, n);
}

/* One block forward: reads la->resid_in, writes the block output to y. */
static void layer_fwd(gpt_model *m, int l, void *y, int B, int T) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    gpt_layer_acts *la = &m->layers[l];
    const int *lt = &m->layer_t[l * GPT_LAYER_TENSORS];
    int N = B * T, C = c->n_embd;
    size_t nc = (size_t)N * C;

    be->layernorm_fwd(be, la->ln1, la->ln1_mean, la->ln1_rstd, la->resid_in,
                      gpt_w(m, lt[GPT_LN1_W]), gpt_w(m, lt[GPT_LN1_B]), N, C);
    gpt_linear_fwd(m, la->qkv, la->ln1, lt[GPT_QKV_W], lt[GPT_QKV_B], N, C, 3 * C, BE_EPI_NONE,
                   NULL);
    be->attention_fwd(be, la->atty, la->att_state, la->qkv, B, T, C, c->n_head, c->attn_window);
    gpt_linear_fwd(m, m->tmp, la->atty, lt[GPT_ATTPROJ_W], lt[GPT_ATTPROJ_B], N, C, C, BE_EPI_NONE,
                   NULL);
    const void *mlp_in;
    if (c->block == GPT_BLOCK_SERIAL) {
        be->residual_add(be, la->resid_mid, la->resid_in, m->tmp, nc);
        be->layernorm_fwd(be, la->ln2, la->ln2_mean, la->ln2_rstd, la->resid_mid,
                          gpt_w(m, lt[GPT_LN2_W]), gpt_w(m, lt[GPT_LN2_B]), N, C);
        mlp_in = la->ln2;
    } else {
        be->residual_add(be, y, la->resid_in, m->tmp, nc);
        mlp_in = la->ln1;
    }
    gpt_linear_fwd(m, la->fc_gelu, mlp_in, lt[GPT_FC_W], lt[GPT_FC_B], N, C, 4 * C, BE_EPI_GELU,
                   la->fc_pre);
    gpt_linear_fwd(m, m->tmp, la->fc_gelu, lt[GPT_FCPROJ_W], lt[GPT_FCPROJ_B], N, 4 * C, C,
                   BE_EPI_NONE, NULL);
    be->residual_add(be, y, c->block == GPT_BLOCK_SERIAL ? la->resid_mid : y, m->tmp, nc);
}

/* One block backward: m->dresid holds dL/dy on entry and dL/dx on exit. */
static void layer_bwd(gpt_model *m, int l, int B, int T) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    gpt_layer_acts *la = &m->layers[l];
    const int *lt = &m->layer_t[l * GPT_LAYER_TENSORS];
    int N = B * T, C = c->n_embd;
    int serial = c->block == GPT_BLOCK_SERIAL;

    /* MLP: y = r + c_proj(gelu(c_fc(ln))) */
    gpt_recompute_gelu(m, la, (size_t)N * 4 * C);
    gpt_linear_bwd(m, m->dfc, 0, m->dresid, la->fc_gelu, lt[GPT_FCPROJ_W],
                   gpt_g(m, lt[GPT_FCPROJ_B]), N, 4 * C, C);
    be->gelu_bwd(be, m->dfc_pre, la->fc_pre, m->dfc, (size_t)N * 4 * C);
    if (serial) {
        if (m->rc_ln)
            be->layernorm_fwd(be, la->ln2, la->ln2_mean, la->ln2_rstd, la->resid_mid,
                              gpt_w(m, lt[GPT_LN2_W]), gpt_w(m, lt[GPT_LN2_B]), N, C);
        gpt_linear_bwd(m, m->dln, 0, m->dfc_pre, la->ln2, lt[GPT_FC_W], gpt_g(m, lt[GPT_FC_B]), N,
                       C, 4 * C);
        be->layernorm_bwd(be, m->dresid, gpt_g(m, lt[GPT_LN2_W]), gpt_g(m, lt[GPT_LN2_B]), m->dln,
                          la->resid_mid, gpt_w(m, lt[GPT_LN2_W]), la->ln2_mean, la->ln2_rstd, N, C);
    }
    /* attention: r = x + c_proj(attn(c_attn(ln_1(x)))) */
    gpt_linear_bwd(m, m->datty, 0, m->dresid, la->atty, lt[GPT_ATTPROJ_W],
                   gpt_g(m, lt[GPT_ATTPROJ_B]), N, C, C);
    be->attention_bwd(be, m->dqkv, m->datty, la->atty, la->qkv, la->att_state, B, T, C, c->n_head,
                      c->attn_window);
    if (m->rc_ln) /* deterministic: the same values (and statistics) as the forward's */
        be->layernorm_fwd(be, la->ln1, la->ln1_mean, la->ln1_rstd, la->resid_in,
                          gpt_w(m, lt[GPT_LN1_W]), gpt_w(m, lt[GPT_LN1_B]), N, C);
    gpt_linear_bwd(m, m->dln, 0, m->dqkv, la->ln1, lt[GPT_QKV_W], gpt_g(m, lt[GPT_QKV_B]), N, C,
                   3 * C);
    if (!serial) /* the MLP branch also reads ln_1 */
        gpt_linear_bwd(m, m->dln, 1, m->dfc_pre, la->ln1, lt[GPT_FC_W], gpt_g(m, lt[GPT_FC_B]), N,
                       C, 4 * C);
    be->layernorm_bwd(be, m->dresid, gpt_g(m, lt[GPT_LN1_W]), gpt_g(m, lt[GPT_LN1_B]), m->dln,
                      la->resid_in, gpt_w(m, lt[GPT_LN1_W]), la->ln1_mean, la->ln1_rstd, N, C);
}

/* Tell the param hook that the span r = [r[0], r[1]) is about to be read. */
static void params_needed(gpt_model *m, const size_t *r) {
    if (m->param_hook && r[1] > r[0]) m->param_hook(m->param_hook_ctx, r[0], r[1]);
}

/* Tell the grad hook that the span r is final. */
static void grads_ready(gpt_model *m, const size_t *r) {
    if (m->grad_hook && r[1] > r[0]) m->grad_hook(m->grad_hook_ctx, r[0], r[1]);
}

/* Embedding and all blocks, then ln_f into m->lnf. */
static void forward_trunk(gpt_model *m, const int32_t *tokens, int B, int T) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    MS_CHECKF(B >= 1 && B <= m->B && T >= 1 && T <= m->T,
              "micro-batch (%d,%d) exceeds the model's buffers (%d,%d)", B, T, m->B, m->T);
    MS_CHECKF(B * T % m->tp == 0, "micro-batch (%d,%d): B*T not divisible by tp %d", B, T, m->tp);
    MS_CHECKF(!m->pipe, "a pipeline stage runs its chunks with gpt_chunk_forward/backward");
    int N = B * T, C = c->n_embd, L = c->n_layer;
    be->to_device(be, m->tokens, tokens, sizeof(int32_t) * (size_t)N);
    params_needed(m, m->erange);
    if (m->tp > 1)
        gpt_tp_embed_fwd(m, B, T);
    else
        be->embedding_fwd(be, m->layers[0].resid_in, m->tokens, gpt_w(m, m->t_wte),
                          gpt_w(m, m->t_wpe), B, T, C);
    for (int l = 0; l < L; l++) {
        void *y = l + 1 < L ? m->layers[l + 1].resid_in : m->x_final;
        params_needed(m, &m->lrange[2 * l]);
        if (m->tp > 1)
            gpt_tp_layer_fwd(m, l, y, B, T);
        else
            layer_fwd(m, l, y, B, T);
    }
    params_needed(m, m->frange);
    if (m->tp > 1)
        gpt_tp_ln_gather(m, m->lnf, m->lnf_mean, m->lnf_rstd, m->x_final, m->t_lnf_w, m->t_lnf_b,
                         N);
    else
        be->layernorm_fwd(be, m->lnf, m->lnf_mean, m->lnf_rstd, m->x_final, gpt_w(m, m->t_lnf_w),
                          gpt_w(m, m->t_lnf_b), N, C);
}

/* Losses (N) of m->lnf against targets; with grad also dL/dlnf into m->dln
 * and the classifier's wte gradient. */
static void classifier(gpt_model *m, const int32_t *targets, int N, float dloss, int grad) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    be->to_device(be, m->targets, targets, sizeof(int32_t) * (size_t)N);
    if (m->tp > 1)
        gpt_tp_classifier(m, N, dloss, grad);
    else
        be->classifier_fwd_bwd(be, m->losses, grad ? m->dln : NULL,
                               grad ? gpt_g(m, m->t_wte) : NULL, m->lnf, gpt_w(m, m->t_wte),
                               m->targets, N, c->n_embd, c->vocab, c->vocab_pad, dloss);
}

/* Mean of the N losses; NaN after a communication failure. */
static float mean_loss(gpt_model *m, int N) {
    if (m->err != MS_OK) return NAN;
    return (float)(m->be->sum(m->be, m->losses, (size_t)N) / (double)N);
}

void gpt_trace_pass(gpt_model *m, int chunk, int64_t t0, int64_t t1, int64_t t2) {
    ms_ev_args a = {.has = MS_EV_MB | MS_EV_CHUNK, .mb = m->trace_mb, .chunk = chunk};
    if (t1 > t0) ms_ev_span(m->ev_fwd, 0, t0, t1, &a);
    if (t2 > t1) ms_ev_span(m->ev_bwd, 0, t1, t2, &a);
}

/* The embedding backward with wte's lookup rows kept apart (the rows
 * hook): the micro-batch's distinct tokens (ascending) become rows
 * 0..n-1 of m->row_grads, each position's token is mapped to its row, and
 * the ordinary embedding backward runs on that compact table, so each row
 * sums the same terms in the same (position) order as it would in wte's
 * gradient.  wpe's gradient is accumulated as usual.  tokens (N) host. */
static void embed_rows_bwd(gpt_model *m, const int32_t *tokens, int B, int T) {
    be_backend *be = m->be;
    int N = B * T, C = m->cfg.n_embd, Vp = m->cfg.vocab_pad, n = 0;
    for (int i = 0; i < N; i++) {
        MS_CHECKF(tokens[i] >= 0 && tokens[i] < Vp, "embedding: token id %d outside [0, %d)",
                  (int)tokens[i], Vp);
        m->row_of[tokens[i]] = 0;
    }
    for (int v = 0; v < Vp && n < N; v++) /* ascending ids; O(Vp), no sort */
        if (m->row_of[v] == 0) {
            m->row_of[v] = n;
            m->row_ids[n++] = v;
        }
    for (int i = 0; i < N; i++)
        m->row_host[i] = m->row_of[tokens[i]];
    for (int j = 0; j < n; j++)
        m->row_of[m->row_ids[j]] = -1;
    m->n_rows = n;
    be->to_device(be, m->row_tokens, m->row_host, sizeof(int32_t) * (size_t)N);
    be->zero(be, m->row_grads, (size_t)m->B * m->T * C * sizeof(float));
    be->embedding_bwd(be, m->row_grads, gpt_g(m, m->t_wpe), m->dresid, m->row_tokens, B, T, C);
}

float gpt_forward_backward(gpt_model *m, const int32_t *tokens, const int32_t *targets, int B,
                           int T, float dloss) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    int N = B * T, C = c->n_embd;
    int rows = m->rows_hook != NULL; /* wte's lookup rows apart (gpt_set_rows_hook) */
    int64_t t0 = ms_ev_on() ? ms_ev_now() : 0;
    forward_trunk(m, tokens, B, T);
    classifier(m, targets, N, dloss, 1);
    int64_t t1 = t0 ? ms_ev_now() : 0;
    if (m->tp > 1) {
        gpt_tp_lnf_bwd(m, N);
    } else {
        be->zero(be, m->dresid, (size_t)N * C * be_dtype_size(be->act_dtype));
        be->layernorm_bwd(be, m->dresid, gpt_g(m, m->t_lnf_w), gpt_g(m, m->t_lnf_b), m->dln,
                          m->x_final, gpt_w(m, m->t_lnf_w), m->lnf_mean, m->lnf_rstd, N, C);
    }
    grads_ready(m, m->frange);
    if (rows) grads_ready(m, m->wrange); /* the classifier's part: the lookup rows come apart */
    for (int l = c->n_layer - 1; l >= 0; l--) {
        if (m->tp > 1)
            gpt_tp_layer_bwd(m, l, B, T);
        else
            layer_bwd(m, l, B, T);
        grads_ready(m, &m->lrange[2 * l]);
    }
    if (rows) {
        embed_rows_bwd(m, tokens, B, T);
        grads_ready(m, m->prange);
        m->rows_hook(m->rows_hook_ctx, m->row_ids, m->n_rows, m->row_grads);
    } else {
        if (m->tp > 1)
            gpt_tp_embed_bwd(m, B, T);
        else
            be->embedding_bwd(be, gpt_g(m, m->t_wte), gpt_g(m, m->t_wpe), m->dresid, m->tokens, B,
                              T, C);
        grads_ready(m, m->erange); /* wte and wpe */
    }
    if (t0) gpt_trace_pass(m, 0, t0, t1, ms_ev_now());
    return mean_loss(m, N);
}

float gpt_forward_loss(gpt_model *m, const int32_t *tokens, const int32_t *targets, int B, int T) {
    forward_trunk(m, tokens, B, T);
    classifier(m, targets, B * T, 1.0f, 0);
    return mean_loss(m, B * T);
}

void gpt_row_losses(gpt_model *m, int B, int T, double *sums) {
    MS_CHECK(B >= 1 && B <= m->B && T >= 1 && T <= m->T);
    m->be->to_host(m->be, m->host_losses, m->losses, sizeof(float) * (size_t)B * T);
    for (int i = 0; i < B; i++) {
        const float *l = m->host_losses + (size_t)i * T;
        double s = 0;
        for (int t = 0; t < T; t++)
            s += l[t];
        sums[i] = s;
    }
}

void gpt_forward_logits(gpt_model *m, const int32_t *tokens, int B, int T, int last_only,
                        float *logits) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    int C = c->n_embd, V = c->vocab;
    MS_CHECKF(m->tp == 1, "gpt_forward_logits: not with tensor parallelism (tp %d)", m->tp);
    forward_trunk(m, tokens, B, T);
    /* Rows of lnf whose logits are wanted are computed a block at a time into
     * the dfc scratch (N*4C act elements), or one row at a time into the
     * one-row logits buffer when a row does not fit there.  The logits are
     * fp32 whatever the act dtype (the GEMM's f32 output). */
    size_t es = be_dtype_size(be->act_dtype);
    size_t cap = (size_t)m->B * m->T * 4 * C * es / sizeof(float); /* floats in dfc */
    int rows_per = (int)(cap / (size_t)V);
    void *out = m->dfc;
    if (rows_per < 1) {
        rows_per = 1;
        out = m->logit_row;
    }
    int nrows = last_only ? B : B * T;
    for (int r0 = 0; r0 < nrows; r0 += rows_per) {
        int nr = nrows - r0 < rows_per ? nrows - r0 : rows_per;
        for (int i = 0; i < nr; i++) {
            int row = last_only ? (r0 + i) * T + (T - 1) : r0 + i;
            be->copy(be, (char *)m->dqkv + (size_t)i * C * es,
                     (char *)m->lnf + (size_t)row * C * es, (size_t)C * es);
        }
        be->gemm(be, 0, 1, nr, V, C, 1.0f, m->dqkv, C, gpt_w(m, m->t_wte), C, 0.0f, out, V, 1, NULL,
                 BE_EPI_NONE, NULL);
        be->to_host(be, logits + (size_t)r0 * V, out, (size_t)nr * V * sizeof(float));
    }
}

/* ---- pieces for the pipeline-stage passes (gpt_stage.c) ---- */

void gpt_block_fwd(gpt_model *m, int l, void *y, int B, int T) {
    if (m->tp > 1)
        gpt_tp_layer_fwd(m, l, y, B, T);
    else
        layer_fwd(m, l, y, B, T);
}

void gpt_block_bwd(gpt_model *m, int l, int B, int T) {
    if (m->tp > 1)
        gpt_tp_layer_bwd(m, l, B, T);
    else
        layer_bwd(m, l, B, T);
}

void gpt_embed_fwd(gpt_model *m, int B, int T) {
    if (m->tp > 1)
        gpt_tp_embed_fwd(m, B, T);
    else
        m->be->embedding_fwd(m->be, m->layers[0].resid_in, m->tokens, gpt_w(m, m->t_wte),
                             gpt_w(m, m->t_wpe), B, T, m->cfg.n_embd);
}

void gpt_embed_bwd(gpt_model *m, int B, int T) {
    if (m->tp > 1)
        gpt_tp_embed_bwd(m, B, T);
    else
        m->be->embedding_bwd(m->be, gpt_g(m, m->t_wte), gpt_g(m, m->t_wpe), m->dresid, m->tokens, B,
                             T, m->cfg.n_embd);
}

float gpt_head_pass(gpt_model *m, const int32_t *targets, int N, float dloss, int grad) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd;
    if (m->tp > 1)
        gpt_tp_ln_gather(m, m->lnf, m->lnf_mean, m->lnf_rstd, m->x_final, m->t_lnf_w, m->t_lnf_b,
                         N);
    else
        be->layernorm_fwd(be, m->lnf, m->lnf_mean, m->lnf_rstd, m->x_final, gpt_w(m, m->t_lnf_w),
                          gpt_w(m, m->t_lnf_b), N, C);
    classifier(m, targets, N, dloss, grad);
    if (grad && m->tp > 1) {
        gpt_tp_lnf_bwd(m, N);
    } else if (grad) {
        be->zero(be, m->dresid, (size_t)N * C * be_dtype_size(be->act_dtype));
        be->layernorm_bwd(be, m->dresid, gpt_g(m, m->t_lnf_w), gpt_g(m, m->t_lnf_b), m->dln,
                          m->x_final, gpt_w(m, m->t_lnf_w), m->lnf_mean, m->lnf_rstd, N, C);
    }
    return mean_loss(m, N);
}
