/* gpt_internal.h - the model's private state, shared by gpt_model.c (table,
 * allocation, init) and gpt_pass.c (forward / backward).  Not for callers. */
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
 * noted).  N = B*T. */
typedef struct {
    void *resid_in;             /* (N,C) input of the block */
    void *ln1;                  /* (N,C) */
    float *ln1_mean, *ln1_rstd; /* (N) f32 */
    void *qkv;                  /* (N,3C) */
    void *atty;                 /* (N,C) attention output before c_proj */
    void *att_state;            /* backend-defined, attention_state_bytes */
    void *resid_mid;            /* (N,C) serial block: input of ln_2 */
    void *ln2;                  /* (N,C) serial block */
    float *ln2_mean, *ln2_rstd;
    void *fc_pre;  /* (N,4C) before GeLU */
    void *fc_gelu; /* (N,4C) */
} gpt_layer_acts;

struct gpt_model {
    gpt_config cfg;
    be_backend *be;
    int B, T; /* capacity of the activation buffers */

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
    void *tmp;          /* (N,C): c_proj outputs before the residual add */
    float *host_losses; /* (N) host copy */
    gpt_grad_ready_fn grad_hook;
    void *grad_hook_ctx;
};

/* Device pointer (act dtype) of tensor i of the weights / f32 gradient. */
void *gpt_w(gpt_model *m, int t);
float *gpt_g(gpt_model *m, int t);

#endif
