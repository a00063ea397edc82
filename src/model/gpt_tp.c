/* gpt_tp.c - tensor-parallel blocks (Megatron style, with sequence
 * parallelism) and the collectives they use over the model's tp group.
 *
 * Rank r of tp holds rows [r*Nl, (r+1)*Nl) of the residual stream (Nl =
 * N/tp of the N = B*T rows of a micro-batch) and heads r*NH/tp .. of every
 * attention, hidden units r*4C/tp .. of every MLP:
 *   ln   = LayerNorm(x)          on the Nl local rows
 *   all-gather ln -> (N,C)                         [column-parallel input]
 *   qkv  = ln @ Wqkv_r + b_r     (N,3C/tp); attention on the local heads
 *   part = atty @ Wproj_r        (N,C) partial sums over the heads
 *   reduce-scatter part -> (Nl,C), + bias (replicated, added once), + x
 * and likewise for the MLP (c_fc column-parallel, c_proj row-parallel); the
 * parallel block sums both partial products before one reduce-scatter.
 * Backward runs the conjugates: the output gradient of a row-parallel
 * linear is all-gathered, the input gradient of a column-parallel one
 * (partial over the local heads / units) is reduce-scattered before the
 * LayerNorm backward.  Gradients of replicated parameters used on the
 * local rows (LayerNorm gains/biases, row-parallel biases) are accumulated
 * per block in m->rep_grads and all-reduced over tp before they are added
 * to the gradients, so each micro-batch adds exactly its own sum.
 *
 * Communication errors are kept in m->err (first one wins); afterwards the
 * collectives are skipped and the pass returns NaN (gpt_take_error).
 */
#include <stdio.h>

#include "model/gpt_internal.h"

static void keep_error(gpt_model *m, ms_status st) {
    if (st == MS_OK || m->err != MS_OK) return;
    m->err = st;
    snprintf(m->errmsg, sizeof m->errmsg, "tensor parallel pass: %s", ms_errmsg());
}

void gpt_tp_allgather(gpt_model *m, void *full, const void *part, size_t count) {
    if (m->err == MS_OK)
        keep_error(m, comm_allgather(m->tpg, part, full, count, gpt_act_comm_dtype(m)));
}

void gpt_tp_allgather_f32(gpt_model *m, float *full, const float *part, size_t count) {
    if (m->err == MS_OK) keep_error(m, comm_allgather(m->tpg, part, full, count, COMM_F32));
}

void gpt_tp_reduce_scatter(gpt_model *m, void *part, const void *full, size_t count) {
    if (m->err == MS_OK)
        keep_error(m,
                   comm_reduce_scatter(m->tpg, full, part, count, gpt_act_comm_dtype(m), COMM_SUM));
}

void gpt_tp_broadcast_f32(gpt_model *m, float *x, size_t n) {
    if (m->err == MS_OK) keep_error(m, comm_broadcast(m->tpg, x, n, COMM_F32, 0));
}

/* This rank's first row of an (N,C) act buffer. */
static void *local_rows(gpt_model *m, void *full, int N) {
    size_t off = (size_t)m->tp_rank * (size_t)(N / m->tp) * (size_t)m->cfg.n_embd;
    return (char *)full + off * be_dtype_size(m->be->act_dtype);
}

void gpt_tp_ln_gather(gpt_model *m, void *out, float *mean, float *rstd, const void *inp, int tw,
                      int tb, int N) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, Nl = N / m->tp;
    void *mine = local_rows(m, out, N);
    be->layernorm_fwd(be, mine, mean, rstd, inp, gpt_w(m, tw), gpt_w(m, tb), Nl, C);
    gpt_tp_allgather(m, out, mine, (size_t)Nl * C);
}

/* LayerNorm backward from partial input gradients dfull (N,C) (summed over
 * tp in place by a reduce-scatter): m->dresid (Nl,C) +=, dw/db (C) f32 +=. */
static void ln_bwd_scatter(gpt_model *m, void *dfull, const void *inp, int tw, const float *mean,
                           const float *rstd, float *dw, float *db, int N) {
    int C = m->cfg.n_embd, Nl = N / m->tp;
    void *mine = local_rows(m, dfull, N);
    gpt_tp_reduce_scatter(m, mine, dfull, (size_t)Nl * C);
    m->be->layernorm_bwd(m->be, m->dresid, dw, db, mine, inp, gpt_w(m, tw), mean, rstd, Nl, C);
}

/* out (Nl,C) = resid (Nl,C) + reduce-scatter(m->tmp (N,C)) + bias tb [+ tb2]. */
static void row_reduce(gpt_model *m, void *out, const void *resid, int tb, int tb2, int N) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, Nl = N / m->tp;
    gpt_tp_reduce_scatter(m, out, m->tmp, (size_t)Nl * C);
    be->bias_add(be, out, gpt_w(m, tb), Nl, C);
    if (tb2 >= 0) be->bias_add(be, out, gpt_w(m, tb2), Nl, C);
    be->residual_add(be, out, resid, out, (size_t)Nl * C);
}

/* m->tmp (N,C) = inp (N,K) @ W_r (K,C) (+ m->tmp when accumulate): the
 * partial product of a row-parallel linear, bias not yet added. */
static void row_partial(gpt_model *m, const void *inp, int tw, int N, int K, int accumulate) {
    int C = m->cfg.n_embd;
    m->be->gemm(m->be, 0, 0, N, C, K, 1.0f, inp, K, gpt_w(m, tw), C, accumulate ? 1.0f : 0.0f,
                m->tmp, C, 0, NULL, BE_EPI_NONE, NULL);
}

void gpt_tp_layer_fwd(gpt_model *m, int l, void *y, int B, int T) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    gpt_layer_acts *la = &m->layers[l];
    const int *lt = &m->layer_t[l * GPT_LAYER_TENSORS];
    int N = B * T, C = c->n_embd, Ca = C / m->tp, F = 4 * C / m->tp;
    int serial = c->block == GPT_BLOCK_SERIAL;

    gpt_tp_ln_gather(m, la->ln1, la->ln1_mean, la->ln1_rstd, la->resid_in, lt[GPT_LN1_W],
                     lt[GPT_LN1_B], N);
    gpt_linear_fwd(m, la->qkv, la->ln1, lt[GPT_QKV_W], lt[GPT_QKV_B], N, C, 3 * Ca, BE_EPI_NONE,
                   NULL);
    be->attention_fwd(be, la->atty, la->att_state, la->qkv, B, T, Ca, c->n_head / m->tp,
                      c->attn_window);
    row_partial(m, la->atty, lt[GPT_ATTPROJ_W], N, Ca, 0);
    const void *mlp_in = la->ln1;
    if (serial) {
        row_reduce(m, la->resid_mid, la->resid_in, lt[GPT_ATTPROJ_B], -1, N);
        gpt_tp_ln_gather(m, la->ln2, la->ln2_mean, la->ln2_rstd, la->resid_mid, lt[GPT_LN2_W],
                         lt[GPT_LN2_B], N);
        mlp_in = la->ln2;
    }
    gpt_linear_fwd(m, la->fc_gelu, mlp_in, lt[GPT_FC_W], lt[GPT_FC_B], N, C, F, BE_EPI_GELU,
                   la->fc_pre);
    row_partial(m, la->fc_gelu, lt[GPT_FCPROJ_W], N, F, !serial); /* parallel: one sum */
    row_reduce(m, y, serial ? la->resid_mid : la->resid_in, lt[GPT_FCPROJ_B],
               serial ? -1 : lt[GPT_ATTPROJ_B], N);
}

/* Sum rep_grads[i*C .. (i+1)*C) over tp and add it to the gradient of
 * tensor ts[i] (i < n; entries -1 are skipped). */
static void rep_flush(gpt_model *m, const int *ts, int n) {
    int C = m->cfg.n_embd;
    if (m->err == MS_OK)
        keep_error(m, comm_allreduce(m->tpg, m->rep_grads, m->rep_grads, (size_t)n * C, COMM_F32,
                                     COMM_SUM));
    for (int i = 0; i < n; i++)
        if (ts[i] >= 0) m->be->add_f32(m->be, gpt_g(m, ts[i]), m->rep_grads + (size_t)i * C, C);
}

/* The gradient dL/dy (Nl,C) in m->dresid: its column sums into the
 * replicated bias slots, then all-gathered into m->dfull (N,C). */
static void row_out_grad(gpt_model *m, float *db, float *db2, int N) {
    int C = m->cfg.n_embd, Nl = N / m->tp;
    m->be->bias_bwd(m->be, db, m->dresid, Nl, C);
    if (db2) m->be->bias_bwd(m->be, db2, m->dresid, Nl, C);
    gpt_tp_allgather(m, m->dfull, m->dresid, (size_t)Nl * C);
}

void gpt_tp_layer_bwd(gpt_model *m, int l, int B, int T) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    gpt_layer_acts *la = &m->layers[l];
    const int *lt = &m->layer_t[l * GPT_LAYER_TENSORS];
    int N = B * T, C = c->n_embd, Ca = C / m->tp, F = 4 * C / m->tp;
    int serial = c->block == GPT_BLOCK_SERIAL;
    /* replicated slots: ln_1 w, b | attn c_proj b | ln_2 w, b | mlp c_proj b */
    float *rep = m->rep_grads;
    be->zero(be, rep, 6 * (size_t)C * sizeof(float));

    /* MLP: y = r + c_proj(gelu(c_fc(ln))) */
    row_out_grad(m, rep + 5 * C, serial ? NULL : rep + 2 * C, N);
    gpt_recompute_gelu(m, la, (size_t)N * F);
    gpt_linear_bwd(m, m->dfc, 0, m->dfull, la->fc_gelu, lt[GPT_FCPROJ_W], NULL, N, F, C);
    be->gelu_bwd(be, m->dfc_pre, la->fc_pre, m->dfc, (size_t)N * F);
    if (serial) {
        gpt_linear_bwd(m, m->dln, 0, m->dfc_pre, la->ln2, lt[GPT_FC_W], gpt_g(m, lt[GPT_FC_B]), N,
                       C, F);
        ln_bwd_scatter(m, m->dln, la->resid_mid, lt[GPT_LN2_W], la->ln2_mean, la->ln2_rstd,
                       rep + 3 * C, rep + 4 * C, N);
        row_out_grad(m, rep + 2 * C, NULL, N);
    }
    /* attention: r = x + c_proj(attn(c_attn(ln_1(x)))); m->dfull = dL/dr */
    gpt_linear_bwd(m, m->datty, 0, m->dfull, la->atty, lt[GPT_ATTPROJ_W], NULL, N, Ca, C);
    be->attention_bwd(be, m->dqkv, m->datty, la->atty, la->qkv, la->att_state, B, T, Ca,
                      c->n_head / m->tp, c->attn_window);
    gpt_linear_bwd(m, m->dln, 0, m->dqkv, la->ln1, lt[GPT_QKV_W], gpt_g(m, lt[GPT_QKV_B]), N, C,
                   3 * Ca);
    if (!serial) /* the MLP branch also reads ln_1 */
        gpt_linear_bwd(m, m->dln, 1, m->dfc_pre, la->ln1, lt[GPT_FC_W], gpt_g(m, lt[GPT_FC_B]), N,
                       C, F);
    ln_bwd_scatter(m, m->dln, la->resid_in, lt[GPT_LN1_W], la->ln1_mean, la->ln1_rstd, rep, rep + C,
                   N);
    int ts[6] = {lt[GPT_LN1_W], lt[GPT_LN1_B], lt[GPT_ATTPROJ_B],
                 lt[GPT_LN2_W], lt[GPT_LN2_B], lt[GPT_FCPROJ_B]};
    rep_flush(m, ts, 6);
}

void gpt_tp_lnf_bwd(gpt_model *m, int N) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, Nl = N / m->tp;
    be->zero(be, m->dresid, (size_t)Nl * C * be_dtype_size(be->act_dtype));
    be->zero(be, m->rep_grads, 2 * (size_t)C * sizeof(float));
    ln_bwd_scatter(m, m->dln, m->x_final, m->t_lnf_w, m->lnf_mean, m->lnf_rstd, m->rep_grads,
                   m->rep_grads + C, N);
    int ts[2] = {m->t_lnf_w, m->t_lnf_b};
    rep_flush(m, ts, 2);
}
