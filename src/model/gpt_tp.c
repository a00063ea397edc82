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
 * parallel block feeds both branches from one all-gather of ln_1 and sums
 * both partial products before one reduce-scatter.  Backward runs the
 * conjugates: the output gradient of a row-parallel linear is
 * all-gathered, the input gradient of a column-parallel one (partial over
 * the local heads / units) is reduce-scattered before the LayerNorm
 * backward.  Gradients of replicated parameters used on the local rows
 * (LayerNorm gains/biases, row-parallel biases) are accumulated per block
 * in m->rep_grads and all-reduced over tp before they are added to the
 * gradients, so each micro-batch adds exactly its own sum.
 *
 * Communication hidden behind the GEMMs (MegaScale §3.2).  The four
 * exchanges of a block are point-to-point messages of one rank's Nl rows,
 * pipelined with GEMMs on row blocks of Nl rows:
 *  - all-gather, then column-parallel GEMMs (forward: ln -> qkv, fc; the
 *    backward's output gradient -> the data gradients of c_proj): every
 *    peer's block is posted at once, the GEMMs of this rank's own block run
 *    while they move, then each peer's block as it arrives (rank+1 first).
 *    The weight gradients, which need all rows, run after the last block.
 *  - row-parallel GEMMs, then reduce-scatter (forward: c_proj partial
 *    products; backward: the input gradient of c_attn / c_fc): the blocks
 *    the other ranks own are computed first (rank+1 first), each sent to
 *    its owner as soon as it is ready while the next is computed; this
 *    rank's own block comes last (and in backward the weight gradients run
 *    after it, before the wait).  The owner sums the tp partial products of
 *    its rows in rank order 0, 1, ..., tp-1.
 * Under --overlap without tp (gpt_set_tp_overlap 0) every message is waited
 * for right after it is posted: the same GEMMs on the same blocks and the
 * same sums, so both give the same bits; only the waiting moves.  With two
 * ranks the rank-order sum a + b is what MPI's reduce-scatter gives; with
 * more it fixes an order MPI leaves to its algorithm.  Row blocks are
 * independent in a GEMM, so the row-blocked products equal the whole ones
 * up to the BLAS's blocking (tests/mpi/test_tp.py's bounds).
 *
 * On NCCL groups send/recv are launched together at the first test or wait
 * (comm.h), so each batch of posts is followed by a comm_test that starts
 * it; a batch always pairs the send to a peer with the receive from the
 * peer that sends to this rank in the same step, so no receive waits behind
 * a send it depends on.  One tag serves all of it: each ordered pair of
 * ranks exchanges at most one message per phase and the phases run in the
 * same order on every rank (MPI matches same-tag messages in order).
 *
 * Communication errors are kept in m->err (first one wins); afterwards the
 * collectives are skipped and the pass returns NaN (gpt_take_error).
 */
#include <stdio.h>

#include "model/gpt_internal.h"

#define TP_TAG 17

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

/* Row `row` of an act buffer of rows of `width` elements. */
static void *rows_at(const gpt_model *m, const void *buf, size_t row, size_t width) {
    return (char *)buf + row * width * be_dtype_size(m->be->act_dtype);
}

/* This rank's first row of an (N,C) act buffer. */
static void *local_rows(gpt_model *m, void *full, int N) {
    return rows_at(m, full, (size_t)m->tp_rank * (size_t)(N / m->tp), (size_t)m->cfg.n_embd);
}

void gpt_tp_ln_gather(gpt_model *m, void *out, float *mean, float *rstd, const void *inp, int tw,
                      int tb, int N) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, Nl = N / m->tp;
    void *mine = local_rows(m, out, N);
    be->layernorm_fwd(be, mine, mean, rstd, inp, gpt_w(m, tw), gpt_w(m, tb), Nl, C);
    gpt_tp_allgather(m, out, mine, (size_t)Nl * C);
}

/* ---- the point-to-point exchanges ---------------------------------------- */

static void xwait(gpt_model *m, comm_req **r) {
    if (*r) keep_error(m, comm_wait(*r));
    *r = NULL;
}

/* Start the ops just posted (an NCCL group launches its pending send/recv
 * at the first test or wait of one of them: `last`, posted last); without
 * overlap, finish everything outstanding at once. */
static void xlaunch(gpt_model *m, comm_req *last) {
    if (!m->tp_overlap) {
        for (int i = 0; i < 2 * m->tp; i++)
            xwait(m, &m->tp_req[i]);
    } else if (last) {
        int done = 0;
        keep_error(m, comm_test(last, &done));
    }
}

static void xwait_all(gpt_model *m) {
    for (int i = 0; i < 2 * m->tp; i++)
        xwait(m, &m->tp_req[i]);
}

/* Post the all-gather of (N,C) full: this rank's rows, in place, to every
 * peer; every peer's rows into their place. */
static void gather_post(gpt_model *m, void *full, const void *mine, int N) {
    size_t Nl = (size_t)(N / m->tp), C = (size_t)m->cfg.n_embd;
    comm_dtype dt = gpt_act_comm_dtype(m);
    comm_req *last = NULL;
    for (int p = 0; p < m->tp && m->err == MS_OK; p++) {
        if (p == m->tp_rank) continue;
        keep_error(m, comm_recv_start(m->tpg, rows_at(m, full, p * Nl, C), Nl * C, dt, p, TP_TAG,
                                      &m->tp_req[p]));
        keep_error(m, comm_send_start(m->tpg, mine, Nl * C, dt, p, TP_TAG, &m->tp_req[m->tp + p]));
        last = m->tp_req[m->tp + p];
    }
    xlaunch(m, last);
}

/* Step i of the gather loop: the block of rank (rank + i) % tp, waited for. */
static int gather_block(gpt_model *m, int i) {
    int p = (m->tp_rank + i) % m->tp;
    xwait(m, &m->tp_req[p]);
    return p;
}

/* Step i (1..tp-1) of a reduce-scatter: send the partial product of the
 * rows of rank d = rank + i (ready in part) to it, and receive the partial
 * product of this rank's rows from rank rank - i, which sends in its step
 * i, into slot i-1 of m->tp_rsbuf. */
static void scatter_post(gpt_model *m, const void *part, int i, int N) {
    size_t Nl = (size_t)(N / m->tp), C = (size_t)m->cfg.n_embd;
    int d = (m->tp_rank + i) % m->tp, s = (m->tp_rank - i + m->tp) % m->tp;
    comm_dtype dt = gpt_act_comm_dtype(m);
    if (m->err == MS_OK)
        keep_error(m, comm_recv_start(m->tpg, rows_at(m, m->tp_rsbuf, (size_t)(i - 1) * Nl, C),
                                      Nl * C, dt, s, TP_TAG, &m->tp_req[s]));
    if (m->err == MS_OK)
        keep_error(m, comm_send_start(m->tpg, rows_at(m, part, d * Nl, C), Nl * C, dt, d, TP_TAG,
                                      &m->tp_req[m->tp + d]));
    xlaunch(m, m->tp_req[m->tp + d]);
}

/* After every scatter_post: out (Nl,C) = the sum in rank order of the tp
 * partial products of this rank's rows (its own in part).  out must not be
 * one of them. */
static void scatter_finish(gpt_model *m, void *out, const void *part, int N) {
    size_t Nl = (size_t)(N / m->tp), C = (size_t)m->cfg.n_embd;
    xwait_all(m);
    const void *p[2];
    for (int r = 0; r < m->tp; r++) {
        int i = (m->tp_rank - r + m->tp) % m->tp; /* rank r sent in its step i */
        const void *pr = i == 0 ? rows_at(m, part, (size_t)m->tp_rank * Nl, C)
                                : rows_at(m, m->tp_rsbuf, (size_t)(i - 1) * Nl, C);
        if (r < 2) {
            p[r] = pr;
            if (r == 1) m->be->residual_add(m->be, out, p[0], p[1], Nl * C);
        } else {
            m->be->residual_add(m->be, out, out, pr, Nl * C);
        }
    }
}

/* ---- forward ------------------------------------------------------------- */

/* A linear whose rows can be computed block by block. */
typedef struct {
    void *out;
    const void *inp;
    int tw, tb, IC, OC;
    be_epilogue epi;
    void *pre;
} tp_linear;

static void linear_rows(gpt_model *m, const tp_linear *L, size_t r0, int rows, int accumulate) {
    void *out = rows_at(m, L->out, r0, (size_t)L->OC);
    const void *inp = rows_at(m, L->inp, r0, (size_t)L->IC);
    m->be->gemm(m->be, 0, 0, rows, L->OC, L->IC, 1.0f, inp, L->IC, gpt_w(m, L->tw), L->OC,
                accumulate ? 1.0f : 0.0f, out, L->OC, 0, L->tb >= 0 ? gpt_w(m, L->tb) : NULL,
                L->epi, L->pre ? rows_at(m, L->pre, r0, (size_t)L->OC) : NULL);
}

/* ln (N,C) = the all-gather of LayerNorm(inp) (Nl local rows), and the
 * column-parallel linears of L[0..n) on it, block by block as the rows
 * arrive. */
static void ln_column_fwd(gpt_model *m, void *ln, float *mean, float *rstd, const void *inp, int tw,
                          int tb, const tp_linear *L, int n, int N) {
    int C = m->cfg.n_embd, Nl = N / m->tp;
    void *mine = local_rows(m, ln, N);
    m->be->layernorm_fwd(m->be, mine, mean, rstd, inp, gpt_w(m, tw), gpt_w(m, tb), Nl, C);
    gather_post(m, ln, mine, N);
    for (int i = 0; i < m->tp; i++) {
        int p = gather_block(m, i);
        for (int k = 0; k < n; k++)
            linear_rows(m, &L[k], (size_t)p * Nl, Nl, 0);
    }
    xwait_all(m); /* the sends of this rank's rows */
}

/* out (Nl,C) = resid + the reduce-scatter of sum_k L[k] (the row-parallel
 * partial products, into m->tmp) + bias tb [+ tb2]. */
static void row_reduce_fwd(gpt_model *m, void *out, const void *resid, const tp_linear *L, int n,
                           int tb, int tb2, int N) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, Nl = N / m->tp;
    for (int i = 1; i <= m->tp; i++) {
        size_t r0 = (size_t)((m->tp_rank + i) % m->tp) * Nl; /* own rows last (i == tp) */
        for (int k = 0; k < n; k++)
            linear_rows(m, &L[k], r0, Nl, k > 0);
        if (i < m->tp) scatter_post(m, m->tmp, i, N);
    }
    scatter_finish(m, out, m->tmp, N);
    be->bias_add(be, out, gpt_w(m, tb), Nl, C);
    if (tb2 >= 0) be->bias_add(be, out, gpt_w(m, tb2), Nl, C);
    be->residual_add(be, out, resid, out, (size_t)Nl * C);
}

void gpt_tp_layer_fwd(gpt_model *m, int l, void *y, int B, int T) {
    be_backend *be = m->be;
    const gpt_config *c = &m->cfg;
    gpt_layer_acts *la = &m->layers[l];
    const int *lt = &m->layer_t[l * GPT_LAYER_TENSORS];
    int N = B * T, C = c->n_embd, Ca = C / m->tp, F = 4 * C / m->tp;
    int serial = c->block == GPT_BLOCK_SERIAL;
    tp_linear qkv = {la->qkv, la->ln1, lt[GPT_QKV_W], lt[GPT_QKV_B], C, 3 * Ca, BE_EPI_NONE, NULL};
    tp_linear fc = {la->fc_gelu,   serial ? la->ln2 : la->ln1, lt[GPT_FC_W], lt[GPT_FC_B], C, F,
                    BE_EPI_GELU, la->fc_pre};
    tp_linear proj[2] = {{m->tmp, la->atty, lt[GPT_ATTPROJ_W], -1, Ca, C, BE_EPI_NONE, NULL},
                         {m->tmp, la->fc_gelu, lt[GPT_FCPROJ_W], -1, F, C, BE_EPI_NONE, NULL}};
    tp_linear col[2] = {qkv, fc};

    /* the parallel block's MLP reads ln_1 too: one gather feeds both */
    ln_column_fwd(m, la->ln1, la->ln1_mean, la->ln1_rstd, la->resid_in, lt[GPT_LN1_W],
                  lt[GPT_LN1_B], col, serial ? 1 : 2, N);
    be->attention_fwd(be, la->atty, la->att_state, la->qkv, B, T, Ca, c->n_head / m->tp,
                      c->attn_window);
    if (serial) {
        row_reduce_fwd(m, la->resid_mid, la->resid_in, &proj[0], 1, lt[GPT_ATTPROJ_B], -1, N);
        ln_column_fwd(m, la->ln2, la->ln2_mean, la->ln2_rstd, la->resid_mid, lt[GPT_LN2_W],
                      lt[GPT_LN2_B], &fc, 1, N);
        row_reduce_fwd(m, y, la->resid_mid, &proj[1], 1, lt[GPT_FCPROJ_B], -1, N);
    } else { /* one sum of both partial products, one reduce-scatter */
        row_reduce_fwd(m, y, la->resid_in, proj, 2, lt[GPT_FCPROJ_B], lt[GPT_ATTPROJ_B], N);
    }
}

/* ---- backward ------------------------------------------------------------ */

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

/* The data gradient of a row-parallel linear out = inp @ W (inp (N,IC)):
 * dinp = dout @ W^T, by row blocks; its weight gradient comes after. */
typedef struct {
    void *dinp;
    const void *inp;
    int tw, IC;
} tp_dlinear;

/* m->dfull (N,C) = the all-gather of dL/dy (m->dresid, Nl rows), whose
 * column sums first go to the replicated bias slots db [, db2]; then for
 * each row block as it arrives the data gradients of D[0..n) (and, for
 * the MLP, the GeLU backward of those rows: dfc_pre = gelu'(fc_pre) dfc),
 * and after the last block their weight gradients. */
static void row_bwd_gather(gpt_model *m, float *db, float *db2, const tp_dlinear *D, int n,
                           const void *gelu_pre, int N) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, Nl = N / m->tp;
    be->bias_bwd(be, db, m->dresid, Nl, C);
    if (db2) be->bias_bwd(be, db2, m->dresid, Nl, C);
    void *mine = local_rows(m, m->dfull, N);
    be->copy(be, mine, m->dresid, (size_t)Nl * C * be_dtype_size(be->act_dtype));
    gather_post(m, m->dfull, m->dresid, N);
    for (int i = 0; i < m->tp; i++) {
        size_t r0 = (size_t)gather_block(m, i) * Nl;
        for (int k = 0; k < n; k++)
            be->gemm(be, 0, 1, Nl, D[k].IC, C, 1.0f, rows_at(m, m->dfull, r0, C), C,
                     gpt_w(m, D[k].tw), C, 0.0f, rows_at(m, D[k].dinp, r0, D[k].IC), D[k].IC, 0,
                     NULL, BE_EPI_NONE, NULL);
        if (gelu_pre) /* D[0] is c_proj of the MLP: its input gradient through the GeLU */
            be->gelu_bwd(be, rows_at(m, m->dfc_pre, r0, D[0].IC), rows_at(m, gelu_pre, r0, D[0].IC),
                         rows_at(m, D[0].dinp, r0, D[0].IC), (size_t)Nl * D[0].IC);
    }
    xwait_all(m);
    for (int k = 0; k < n; k++) /* dW += inp^T dout, over all N rows */
        be->gemm(be, 1, 0, D[k].IC, C, N, 1.0f, D[k].inp, D[k].IC, m->dfull, C, 1.0f,
                 gpt_g(m, D[k].tw), C, 1, NULL, BE_EPI_NONE, NULL);
}

/* The input gradient of column-parallel linears y_k = ln @ W_k + b_k
 * (dout_k (N,OC_k) given): dln = sum_k dout_k @ W_k^T, partial over this
 * rank's heads / units, by row blocks (the other ranks' first, each sent
 * to its owner at once); the weight and bias gradients of each while the
 * blocks move; then the owners' sum of this rank's rows, through the
 * LayerNorm backward (m->dresid +=, dw/db (C) f32 +=). */
typedef struct {
    const void *dout;
    int tw, OC;
    float *dbias;
} tp_col;

static void col_bwd_scatter(gpt_model *m, const void *ln, const tp_col *K, int n, const void *inp,
                            int ln_w, const float *mean, const float *rstd, float *dw, float *db,
                            int N) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, Nl = N / m->tp;
    for (int i = 1; i <= m->tp; i++) {
        size_t r0 = (size_t)((m->tp_rank + i) % m->tp) * Nl; /* own rows last */
        for (int k = 0; k < n; k++)
            be->gemm(be, 0, 1, Nl, C, K[k].OC, 1.0f, rows_at(m, K[k].dout, r0, K[k].OC), K[k].OC,
                     gpt_w(m, K[k].tw), K[k].OC, k > 0 ? 1.0f : 0.0f, rows_at(m, m->dln, r0, C),
                     C, 0, NULL, BE_EPI_NONE, NULL);
        if (i < m->tp) scatter_post(m, m->dln, i, N);
    }
    for (int k = 0; k < n; k++) { /* hidden behind the last messages */
        be->gemm(be, 1, 0, C, K[k].OC, N, 1.0f, ln, C, K[k].dout, K[k].OC, 1.0f, gpt_g(m, K[k].tw),
                 K[k].OC, 1, NULL, BE_EPI_NONE, NULL);
        if (K[k].dbias) be->bias_bwd(be, K[k].dbias, K[k].dout, N, K[k].OC);
    }
    void *sum = rows_at(m, m->tp_rsbuf, (size_t)(m->tp - 1) * Nl, C); /* the last slot is free */
    scatter_finish(m, sum, m->dln, N);
    be->layernorm_bwd(be, m->dresid, dw, db, sum, inp, gpt_w(m, ln_w), mean, rstd, Nl, C);
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
    tp_dlinear dproj[2] = {{m->dfc, la->fc_gelu, lt[GPT_FCPROJ_W], F},
                           {m->datty, la->atty, lt[GPT_ATTPROJ_W], Ca}};
    tp_col dqkv = {m->dqkv, lt[GPT_QKV_W], 3 * Ca, gpt_g(m, lt[GPT_QKV_B])};
    tp_col dfc = {m->dfc_pre, lt[GPT_FC_W], F, gpt_g(m, lt[GPT_FC_B])};

    /* MLP: y = r + c_proj(gelu(c_fc(ln))); the parallel block's attention
     * c_proj reads the same gathered dL/dy */
    gpt_recompute_gelu(m, la, (size_t)N * F);
    row_bwd_gather(m, rep + 5 * C, serial ? NULL : rep + 2 * C, dproj, serial ? 1 : 2, la->fc_pre,
                   N);
    if (serial) {
        col_bwd_scatter(m, la->ln2, &dfc, 1, la->resid_mid, lt[GPT_LN2_W], la->ln2_mean,
                        la->ln2_rstd, rep + 3 * C, rep + 4 * C, N);
        /* attention: r = x + c_proj(attn(c_attn(ln_1(x)))); dL/dr in m->dresid */
        row_bwd_gather(m, rep + 2 * C, NULL, &dproj[1], 1, NULL, N);
    }
    be->attention_bwd(be, m->dqkv, m->datty, la->atty, la->qkv, la->att_state, B, T, Ca,
                      c->n_head / m->tp, c->attn_window);
    tp_col cols[2] = {dqkv, dfc}; /* the parallel block's MLP branch also reads ln_1 */
    col_bwd_scatter(m, la->ln1, cols, serial ? 1 : 2, la->resid_in, lt[GPT_LN1_W], la->ln1_mean,
                    la->ln1_rstd, rep, rep + C, N);
    int ts[6] = {lt[GPT_LN1_W], lt[GPT_LN1_B], lt[GPT_ATTPROJ_B],
                 lt[GPT_LN2_W], lt[GPT_LN2_B], lt[GPT_FCPROJ_B]};
    rep_flush(m, ts, 6);
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
