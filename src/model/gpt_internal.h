/* gpt_internal.h - the model's private state, shared by gpt_model.c (table,
 * allocation, init), gpt_pass.c (forward / backward) and the tensor-parallel
 * passes gpt_tp.c / gpt_tp_vocab.c.  Not for callers. */
#ifndef GPT_INTERNAL_H
#define GPT_INTERNAL_H

#include "model/gpt.h"

/* Indices into a layer's parameter tensors. */
enum {
    GPT_LN1_W,
    GPT_LN1_B,
    GPT_QKV_W,
    GPT_QKV_B,
    GPT_ATTPROJ_W,
    GPT_ATTPROJ_B,
    GPT_LN2_W,
    GPT_LN2_B,
    GPT_FC_W,
    GPT_FC_B,
    GPT_FCPROJ_W,
    GPT_FCPROJ_B,
    GPT_LAYER_TENSORS
};

/* Saved activations of one layer for a (B,T) micro-batch (act dtype unless
 * noted).  N = B*T.  With tensor parallelism over tp ranks, rows marked Nl
 * hold this rank's N/tp rows of the sequence, rows marked N are all-gathered
 * (ln1, ln2) or computed for all rows on this rank's heads / hidden units
 * (widths 3C/tp, C/tp, 4C/tp); without it Nl = N and the widths are full. */
typedef struct {
    void *resid_in;             /* (Nl,C) input of the block */
    void *ln1;                  /* (N,C) */
    float *ln1_mean, *ln1_rstd; /* (Nl) f32 */
    void *qkv;                  /* (N,3C) */
    void *atty;                 /* (N,C) attention output before c_proj */
    void *att_state;            /* backend-defined, attention_state_bytes */
    void *resid_mid;            /* (Nl,C) serial block: input of ln_2 */
    void *ln2;                  /* (N,C) serial block */
    float *ln2_mean, *ln2_rstd; /* (Nl) */
    void *fc_pre;               /* (N,4C) before GeLU */
    void *fc_gelu;              /* (N,4C) */
} gpt_layer_acts;
/* With cfg.recompute, fc_gelu (GPT_RECOMPUTE_GELU) and ln1/ln2
 * (GPT_RECOMPUTE_LN) of every block point at one shared buffer of the model
 * (m->rc_gelu, m->rc_ln): the forward writes them there for its own use and
 * the backward recomputes them there (gpt_recompute_*) before reading. */

struct gpt_model {
    gpt_config cfg;
    be_backend *be;
    int B, T; /* capacity of the activation buffers */
    int trace_mb;             /* micro-batch index for the fwd/bwd spans (gpt_trace_micro_batch) */
    uint16_t ev_fwd, ev_bwd;  /* event recorder names */

    gpt_param *table;
    int n_tensors;
    int t_wte, t_wpe, t_lnf_w, t_lnf_b;
    int *layer_t; /* n_layer * GPT_LAYER_TENSORS tensor indices (-1: absent) */
    size_t n_elems;

    float *params, *grads;
    void *params_act; /* == params when act dtype is f32 */
    int own_params_act;

    void *act_buf;
    size_t act_bytes;
    gpt_layer_acts *layers;
    void *x_final; /* (N,C) output of the last block */
    void *lnf;     /* (N,C) */
    float *lnf_mean, *lnf_rstd;
    float *losses;             /* (N) f32 */
    int32_t *tokens, *targets; /* (N) device */
    /* backward scratch, shared by all layers */
    void *dresid, *dln, *datty, *dqkv, *dfc, *dfc_pre; /* (N,C)x3, (N,3C), (N,4C)x2 */
    void *tmp;             /* (N,C): c_proj outputs before the residual add */
    void *rc_gelu, *rc_ln; /* shared recompute buffers (N,4C/tp), (N,C), or NULL */
    void *logit_row;       /* (Vp) act: one row of logits for gpt_forward_logits */
    float *host_losses;    /* (N) host copy */
    gpt_grad_ready_fn grad_hook, param_hook;
    void *grad_hook_ctx, *param_hook_ctx;

    /* tensor parallelism (tp == 1: none).  Activations above: x_final,
     * dresid (Nl,C); lnf, dln, tmp (N,C); datty (N,C/tp), dqkv (N,3C/tp),
     * dfc, dfc_pre (N,4C/tp). */
    comm_group *tpg;
    int tp, tp_rank;
    int tp_overlap; /* gpt_set_tp_overlap */
    void *tp_rsbuf;    /* (N,C): the peers' partial products of this rank's rows, and their sum */
    comm_req **tp_req; /* [2*tp]: receive from / send to peer p at [p] / [tp+p] (gpt_tp.c) */
    void *dfull;      /* (N,C) all-gathered output gradient of a row-parallel linear */
    void *cls_logits; /* (cls_rows, Vp/tp) one chunk of this rank's vocabulary logits */
    float *cls_stats; /* (tp, cls_rows, 3) their statistics, gathered over tp */
    int cls_rows;
    float *rep_grads; /* (6C) f32: replicated parameters' gradients before the all-reduce */
    ms_status err;    /* first communication failure (gpt_take_error) */
    char errmsg[512];

    /* gradient-ready ranges: block l [lrange[2l], lrange[2l+1]), the
     * embeddings (erange: wte then wpe, each padded on its own: wrange and
     * prange) and ln_f (empty when absent on a pipeline stage) */
    size_t *lrange, erange[2], wrange[2], prange[2], frange[2];
    /* wte's lookup rows kept apart (gpt_set_rows_hook; tp 1, whole model
     * only): row_grads (N,C) f32 device = the gradient rows of the
     * micro-batch's distinct tokens row_ids (N host, ascending), n_rows of
     * them; row_tokens (N) device = each position's row; row_of (Vp) host
     * scratch, -1 between passes */
    gpt_rows_ready_fn rows_hook;
    void *rows_hook_ctx;
    float *row_grads;
    int32_t *row_tokens, *row_ids, *row_of, *row_host;
    int n_rows;
    /* pipeline stage (pipe == 0: the whole model).  `layers` is then a view
     * of set k's blocks (slot_layers[k*cl ..]), set by gpt_stage.c. */
    int pipe;
    gpt_stage stage;
    gpt_layer_acts *slot_layers; /* slots * chunk_layers */
    int32_t *slot_tokens;        /* (slots, N) device */
    void *slot_dout;             /* (slots, Nl, C) act */
};

/* gpt_pass.c, for gpt_stage.c: block l forward (la->resid_in -> y (Nl,C))
 * and backward (m->dresid: dL/dy in, dL/dx out), tensor parallel or not;
 * the embedding of m->tokens into layers[0].resid_in and its backward from
 * m->dresid; the head: ln_f of m->x_final, the classifier against targets
 * (N host) and with grad the backward into m->dresid (Nl,C).  Returns the
 * mean loss (NaN after a communication failure). */
void gpt_block_fwd(gpt_model *m, int l, void *y, int B, int T);
void gpt_block_bwd(gpt_model *m, int l, int B, int T);
void gpt_embed_fwd(gpt_model *m, int B, int T);
void gpt_embed_bwd(gpt_model *m, int B, int T);
float gpt_head_pass(gpt_model *m, const int32_t *targets, int N, float dloss, int grad);

/* 1 if this model holds block l (always without a pipeline). */
int gpt_holds_layer(const gpt_model *m, int l);

/* The slice of the padded vocabulary that tp rank r holds: ids v0..v0+Vl-1
 * (wte rows), of which the first Vs (maybe 0) are real (< V). */
void gpt_vocab_slice(const gpt_model *m, int r, int *v0, int *Vl, int *Vs);

/* Device pointer (act dtype) of tensor i of the weights / f32 gradient. */
void *gpt_w(gpt_model *m, int t);
float *gpt_g(gpt_model *m, int t);

/* gpt_pass.c: out (N,OC) = inp (N,IC) @ W (IC,OC) [+ b] (tb < 0: no bias),
 * optionally through GeLU (pre receives the value before it). */
void gpt_linear_fwd(gpt_model *m, void *out, const void *inp, int tw, int tb, int N, int IC, int OC,
                    be_epilogue epi, void *pre);
/* Backward of gpt_linear_fwd: dW += inp^T dout, dbias += colsum(dout) when
 * dbias != NULL, dinp (N,IC) = dout W^T (+= when accumulate). */
void gpt_linear_bwd(gpt_model *m, void *dinp, int accumulate, const void *dout, const void *inp,
                    int tw, float *dbias, int N, int IC, int OC);

/* gpt_pass.c: with GPT_RECOMPUTE_GELU, la->fc_gelu = gelu(la->fc_pre) again
 * (n elements) before the backward reads it; a no-op otherwise. */
void gpt_recompute_gelu(gpt_model *m, gpt_layer_acts *la, size_t n);

/* gpt_tp.c: collectives over the tp group (counts in elements of the act
 * dtype unless named _f32; no-ops once a failure is recorded in m->err) and
 * the tensor-parallel blocks. */
void gpt_tp_allgather(gpt_model *m, void *full, const void *part, size_t count);
void gpt_tp_allgather_f32(gpt_model *m, float *full, const float *part, size_t count);
void gpt_tp_reduce_scatter(gpt_model *m, void *part, const void *full, size_t count);
void gpt_tp_broadcast_f32(gpt_model *m, float *x, size_t n);
/* LayerNorm of this rank's rows inp (Nl,C) -> out (N,C) all-gathered. */
void gpt_tp_ln_gather(gpt_model *m, void *out, float *mean, float *rstd, const void *inp, int tw,
                      int tb, int N);
/* One block: la->resid_in (Nl,C) -> y (Nl,C); backward: m->dresid (Nl,C)
 * holds dL/dy on entry and dL/dx on exit. */
void gpt_tp_layer_fwd(gpt_model *m, int l, void *y, int B, int T);
void gpt_tp_layer_bwd(gpt_model *m, int l, int B, int T);
/* Final LayerNorm backward from the partial sums dln (N,C) (reduce-scattered
 * in place): m->dresid (Nl,C) =, ln_f gradients all-reduced over tp. */
void gpt_tp_lnf_bwd(gpt_model *m, int N);

/* gpt_tp_vocab.c: vocabulary-parallel embedding (m->tokens (N) ->
 * layers[0].resid_in (Nl,C)) and its backward from m->dresid; the
 * vocabulary-parallel classifier over m->lnf (N,C): m->losses (N) on every
 * rank, and with grad m->dln (N,C) = this rank's partial dL/dlnf. */
void gpt_tp_embed_fwd(gpt_model *m, int B, int T);
void gpt_tp_embed_bwd(gpt_model *m, int B, int T);
void gpt_tp_classifier(gpt_model *m, int N, float dloss, int grad);

/* gpt_pass.c: record a forward span [t0, t1] and a backward span [t1, t2]
 * of model chunk `chunk` (with m->trace_mb); a zero-length span is left out. */
void gpt_trace_pass(gpt_model *m, int chunk, int64_t t0, int64_t t1, int64_t t2);

#endif
