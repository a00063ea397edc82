/* gpt_model.c - the parameter table (with each tensor's tensor-parallel
 * split), buffer layout, initialisation. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/hash.h"
#include "base/rng.h"
#include "base/events.h"
#include "model/gpt_internal.h"

/* Append tensor `name` of logical shape (d0) or (d0,d1), of which this rank
 * stores the shard that `split` gives it. */
static int add_tensor(gpt_model *m, int cap, const char *name, int d0, int d1, gpt_split split,
                      int decay, float std, float value, int layer) {
    MS_CHECK(m->n_tensors < cap);
    gpt_param *p = &m->table[m->n_tensors];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->local[0] = p->shape[0];
    p->local[1] = p->shape[1];
    p->split = m->tp > 1 ? split : GPT_SPLIT_NONE;
    if (p->split == GPT_SPLIT_ROWS || p->split == GPT_SPLIT_VOCAB) p->local[0] /= m->tp;
    if (p->split == GPT_SPLIT_QKV || p->split == GPT_SPLIT_COLS) p->local[p->ndim - 1] /= m->tp;
    p->numel = (size_t)p->local[0] * (size_t)(d1 > 0 ? p->local[1] : 1);
    /* align every tensor to 16 floats so views stay 64-byte aligned */
    p->offset = m->n_elems;
    m->n_elems += (p->numel + 15) & ~(size_t)15;
    p->decay = decay;
    p->init_std = std;
    p->init_value = value;
    p->layer = layer;
    return m->n_tensors++;
}

/* Round the end of the buffer up to a multiple of align elements. */
static void pad_to(gpt_model *m, size_t align) {
    m->n_elems = (m->n_elems + align - 1) / align * align;
}

int gpt_holds_layer(const gpt_model *m, int l) {
    if (!m->pipe) return 1;
    const gpt_stage *st = &m->stage;
    int g = l / st->chunk_layers; /* global chunk of block l */
    return g % st->pp == st->stage;
}

/* Add the tensors of block l (HF order) into layer_t. */
static void add_layer(gpt_model *m, int cap, int l) {
    const gpt_config *c = &m->cfg;
    int C = c->n_embd, L = c->n_layer;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    int *lt = &m->layer_t[l * GPT_LAYER_TENSORS];
    char n[64];
#define T_(idx, suffix, d0, d1, split, decay, s, v)                                                \
    do {                                                                                           \
        snprintf(n, sizeof n, "h.%d.%s", l, suffix);                                               \
        lt[idx] = add_tensor(m, cap, n, d0, d1, split, decay, s, v, l);                            \
    } while (0)
    T_(GPT_LN1_W, "ln_1.weight", C, 0, GPT_SPLIT_NONE, 0, 0, 1);
    T_(GPT_LN1_B, "ln_1.bias", C, 0, GPT_SPLIT_NONE, 0, 0, 0);
    T_(GPT_QKV_W, "attn.c_attn.weight", C, 3 * C, GPT_SPLIT_QKV, 1, std, 0);
    T_(GPT_QKV_B, "attn.c_attn.bias", 3 * C, 0, GPT_SPLIT_QKV, 0, 0, 0);
    T_(GPT_ATTPROJ_W, "attn.c_proj.weight", C, C, GPT_SPLIT_ROWS, 1, proj_std, 0);
    T_(GPT_ATTPROJ_B, "attn.c_proj.bias", C, 0, GPT_SPLIT_NONE, 0, 0, 0);
    if (c->block == GPT_BLOCK_SERIAL) {
        T_(GPT_LN2_W, "ln_2.weight", C, 0, GPT_SPLIT_NONE, 0, 0, 1);
        T_(GPT_LN2_B, "ln_2.bias", C, 0, GPT_SPLIT_NONE, 0, 0, 0);
    }
    T_(GPT_FC_W, "mlp.c_fc.weight", C, 4 * C, GPT_SPLIT_COLS, 1, std, 0);
    T_(GPT_FC_B, "mlp.c_fc.bias", 4 * C, 0, GPT_SPLIT_COLS, 0, 0, 0);
    T_(GPT_FCPROJ_W, "mlp.c_proj.weight", 4 * C, C, GPT_SPLIT_ROWS, 1, proj_std, 0);
    T_(GPT_FCPROJ_B, "mlp.c_proj.bias", C, 0, GPT_SPLIT_NONE, 0, 0, 0);
#undef T_
}

/* Build the table in Hugging Face order: wte, wpe, h.0 ... h.{L-1}, ln_f
 * (on a pipeline stage only the tensors it holds).  Each gradient-ready
 * range (embeddings, one block, ln_f) is padded to a multiple of align
 * elements and recorded. */
static void build_table(gpt_model *m, size_t align) {
    const gpt_config *c = &m->cfg;
    int C = c->n_embd, L = c->n_layer;
    int cap = 4 + L * GPT_LAYER_TENSORS;
    int first = !m->pipe || m->stage.stage == 0,
        last = !m->pipe || m->stage.stage == m->stage.pp - 1;
    m->table = calloc((size_t)cap, sizeof *m->table);
    m->layer_t = malloc(sizeof(int) * (size_t)(L * GPT_LAYER_TENSORS));
    m->lrange = calloc(2 * (size_t)L, sizeof *m->lrange);
    MS_CHECK(m->table && m->layer_t && m->lrange);
    float std = 0.02f;
    m->t_wte = m->t_wpe = m->t_lnf_w = m->t_lnf_b = -1;
    if (first || last)
        m->t_wte =
            add_tensor(m, cap, "wte.weight", c->vocab_pad, C, GPT_SPLIT_VOCAB, 1, std, 0, -1);
    pad_to(m, align); /* wte alone: its reduce-scatter may start before wpe's gradient is final */
    m->wrange[1] = m->prange[0] = m->n_elems;
    if (first)
        m->t_wpe = add_tensor(m, cap, "wpe.weight", c->seq_max, C, GPT_SPLIT_NONE, 1, std, 0, -1);
    pad_to(m, align);
    m->erange[1] = m->prange[1] = m->n_elems;
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < GPT_LAYER_TENSORS; i++)
            m->layer_t[l * GPT_LAYER_TENSORS + i] = -1;
        if (!gpt_holds_layer(m, l)) continue;
        m->lrange[2 * l] = m->n_elems;
        add_layer(m, cap, l);
        pad_to(m, align);
        m->lrange[2 * l + 1] = m->n_elems;
    }
    m->frange[0] = m->n_elems;
    if (last) {
        m->t_lnf_w = add_tensor(m, cap, "ln_f.weight", C, 0, GPT_SPLIT_NONE, 0, 0, 1, -1);
        m->t_lnf_b = add_tensor(m, cap, "ln_f.bias", C, 0, GPT_SPLIT_NONE, 0, 0, 0, -1);
    }
    pad_to(m, align);
    m->frange[1] = m->n_elems;
}

/* Push the saved activations of one block (see gpt_layer_acts). */
static void push_layer(gpt_model *m, ms_arena *a, gpt_layer_acts *la) {
    be_backend *be = m->be;
    size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.n_embd, es = be_dtype_size(be->act_dtype);
    size_t tp = (size_t)m->tp, Nl = N / tp, Ca = C / tp, F = 4 * C / tp;
    size_t att = be->attention_state_bytes(be, m->B, m->T, m->cfg.n_head / m->tp);
    memset(la, 0, sizeof *la);
    int rc = m->cfg.recompute;
    la->resid_in = ms_arena_push(a, Nl * C * es);
    la->ln1 = rc & GPT_RECOMPUTE_LN ? m->rc_ln : ms_arena_push(a, N * C * es);
    la->ln1_mean = ms_arena_push(a, Nl * 4);
    la->ln1_rstd = ms_arena_push(a, Nl * 4);
    la->qkv = ms_arena_push(a, N * 3 * Ca * es);
    la->atty = ms_arena_push(a, N * Ca * es);
    la->att_state = ms_arena_push(a, att);
    if (m->cfg.block == GPT_BLOCK_SERIAL) {
        la->resid_mid = ms_arena_push(a, Nl * C * es);
        la->ln2 = rc & GPT_RECOMPUTE_LN ? m->rc_ln : ms_arena_push(a, N * C * es);
        la->ln2_mean = ms_arena_push(a, Nl * 4);
        la->ln2_rstd = ms_arena_push(a, Nl * 4);
    }
    la->fc_pre = ms_arena_push(a, N * F * es);
    la->fc_gelu = rc & GPT_RECOMPUTE_GELU ? m->rc_gelu : ms_arena_push(a, N * F * es);
}

/* Lay out the activation buffer; with a NULL-based arena this only sizes it.
 * Rows: N = B*T, Nl = N/tp (this rank's sequence rows); widths of the
 * split linears: Ca = C/tp (attention), F = 4C/tp (MLP).  A pipeline stage
 * has `slots` sets of one chunk's blocks (+ tokens, output gradient). */
static void layout_acts(gpt_model *m, ms_arena *a) {
    be_backend *be = m->be;
    size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.n_embd, es = be_dtype_size(be->act_dtype);
    size_t tp = (size_t)m->tp, Nl = N / tp, Ca = C / tp, F = 4 * C / tp;
    /* the shared recompute buffers come first: push_layer points at them */
    m->rc_gelu = m->cfg.recompute & GPT_RECOMPUTE_GELU ? ms_arena_push(a, N * F * es) : NULL;
    m->rc_ln = m->cfg.recompute & GPT_RECOMPUTE_LN ? ms_arena_push(a, N * C * es) : NULL;
    if (m->pipe) {
        size_t sets = (size_t)m->stage.slots, cl = (size_t)m->stage.chunk_layers;
        for (size_t k = 0; k < sets * cl; k++)
            push_layer(m, a, &m->slot_layers[k]);
        m->slot_tokens = ms_arena_push(a, sets * N * 4);
        m->slot_dout = ms_arena_push(a, sets * Nl * C * es);
    } else {
        for (int l = 0; l < m->cfg.n_layer; l++)
            push_layer(m, a, &m->layers[l]);
    }
    m->x_final = ms_arena_push(a, Nl * C * es);
    m->lnf = ms_arena_push(a, N * C * es);
    m->lnf_mean = ms_arena_push(a, Nl * 4);
    m->lnf_rstd = ms_arena_push(a, Nl * 4);
    m->losses = ms_arena_push(a, N * 4);
    m->tokens = ms_arena_push(a, N * 4);
    m->targets = ms_arena_push(a, N * 4);
    m->dresid = ms_arena_push(a, Nl * C * es);
    m->dln = ms_arena_push(a, N * C * es);
    m->datty = ms_arena_push(a, N * Ca * es);
    m->tmp = ms_arena_push(a, N * C * es);
    m->logit_row = ms_arena_push(a, (size_t)m->cfg.vocab_pad * sizeof(float)); /* f32 logits */
    m->dqkv = ms_arena_push(a, N * 3 * Ca * es);
    m->dfc = ms_arena_push(a, N * F * es);
    m->dfc_pre = ms_arena_push(a, N * F * es);
    if (tp == 1 && !m->pipe) { /* gpt_set_rows_hook */
        m->row_grads = ms_arena_push(a, N * C * sizeof(float));
        m->row_tokens = ms_arena_push(a, N * sizeof(int32_t));
    }
    if (tp > 1) {
        m->dfull = ms_arena_push(a, N * C * es);
        m->tp_rsbuf = ms_arena_push(a, N * C * es);
        m->cls_logits = ms_arena_push(a, (size_t)m->cls_rows * (m->cfg.vocab_pad / tp) * es);
        m->cls_stats = ms_arena_push(a, tp * (size_t)m->cls_rows * 3 * 4);
        m->rep_grads = ms_arena_push(a, 6 * C * 4);
    }
}

/* Rows of one chunk of the vocabulary-parallel classifier: about 64 MB of
 * logits, at least 16 rows, at most N. */
static int cls_chunk_rows(const gpt_model *m) {
    size_t rows = ((size_t)16 << 20) / (size_t)(m->cfg.vocab_pad / m->tp), N = (size_t)m->B * m->T;
    if (rows < 16) rows = 16;
    return (int)(rows < N ? rows : N);
}

/* Tensor-parallel preconditions; sets m->tp, m->tp_rank, the padded
 * vocabulary (a multiple of 128*tp) and the classifier chunk. */
static ms_status setup_tp(gpt_model *m, comm_group *tp) {
    gpt_config *c = &m->cfg;
    m->tpg = tp && comm_group_size(tp) > 1 ? tp : NULL;
    m->tp = m->tpg ? comm_group_size(tp) : 1;
    m->tp_overlap = 1; /* gpt_set_tp_overlap */
    m->tp_rank = m->tpg ? comm_group_rank(tp) : 0;
    m->tp_req = calloc(2 * (size_t)m->tp, sizeof *m->tp_req);
    if (!m->tp_req) return ms_error(MS_ERR_NOMEM, "tensor parallelism: out of memory");
    if (m->tp > 1) {
        if (c->n_head % m->tp != 0)
            return ms_error(MS_ERR_ARG,
                            "tensor parallelism: %d heads are not divisible by tp %d (each rank "
                            "takes heads/tp heads)",
                            c->n_head, m->tp);
        if (((size_t)m->B * m->T) % (size_t)m->tp != 0)
            return ms_error(MS_ERR_ARG,
                            "sequence parallelism: B*T = %d*%d rows are not divisible by tp %d "
                            "(each rank holds B*T/tp rows of the residual stream)",
                            m->B, m->T, m->tp);
        if (c->recompute & GPT_RECOMPUTE_LN)
            return ms_error(MS_ERR_ARG,
                            "--recompute ln is not supported with tensor parallelism (tp %d): "
                            "the LayerNorm outputs are all-gathered over the tp ranks; use "
                            "--recompute gelu",
                            m->tp);
        int q = 128 * m->tp;
        c->vocab_pad = (c->vocab + q - 1) / q * q;
    }
    m->cls_rows = cls_chunk_rows(m);
    return MS_OK;
}

ms_status gpt_create(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T) {
    return gpt_create_aligned(out, cfg, be, B, T, 16);
}

ms_status gpt_create_aligned(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T,
                             size_t range_align) {
    return gpt_create_tp(out, cfg, be, B, T, range_align, NULL);
}

ms_status gpt_create_tp(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T,
                        size_t range_align, comm_group *tp) {
    return gpt_create_stage(out, cfg, be, B, T, range_align, tp, NULL);
}

ms_status gpt_create_stage(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T,
                           size_t range_align, comm_group *tp, const gpt_stage *stage) {
    *out = NULL;
    gpt_config c = *cfg;
    MS_TRY(gpt_config_validate(&c));
    if (B < 1 || T < 1)
        return ms_error(MS_ERR_ARG, "micro-batch %d and sequence %d must be positive", B, T);
    if (T > c.seq_max)
        return ms_error(MS_ERR_ARG, "sequence length %d exceeds the model's seq-max %d", T,
                        c.seq_max);
    /* what the backend's kernels take: refused here, not aborted in the first step */
    if (be->max_head_size && c.n_embd / c.n_head > be->max_head_size)
        return ms_error(MS_ERR_ARG,
                        "head size %d (--dim %d / --heads %d) is more than backend %s's attention "
                        "takes (%d): give more --heads",
                        c.n_embd / c.n_head, c.n_embd, c.n_head, be->name, be->max_head_size);
    if (be->max_dim && c.n_embd > be->max_dim)
        return ms_error(MS_ERR_ARG, "--dim %d is more than backend %s's LayerNorm takes (%d)",
                        c.n_embd, be->name, be->max_dim);
    gpt_model *m = calloc(1, sizeof *m);
    if (!m) return ms_error(MS_ERR_NOMEM, "model: out of host memory");
    m->cfg = c;
    m->be = be;
    m->ev_fwd = ms_ev_intern("fwd");
    m->ev_bwd = ms_ev_intern("bwd");
    m->B = B;
    m->T = T;
    if (stage) {
        m->pipe = 1;
        m->stage = *stage;
    }
    ms_status st = setup_tp(m, tp);
    if (st != MS_OK) goto out;
    build_table(m, range_align < 16 ? 16 : (range_align + 15) / 16 * 16);
    m->layers = calloc((size_t)m->cfg.n_layer, sizeof *m->layers);
    if (m->pipe) {
        m->slot_layers =
            calloc((size_t)stage->slots * (size_t)stage->chunk_layers, sizeof *m->slot_layers);
        MS_CHECK(m->slot_layers); /* a few small structs */
    }
    m->host_losses = malloc(sizeof(float) * (size_t)B * T);
    if (m->tp == 1 && !m->pipe) { /* gpt_set_rows_hook's host side */
        m->row_ids = malloc(sizeof(int32_t) * (size_t)B * T);
        m->row_host = malloc(sizeof(int32_t) * (size_t)B * T);
        m->row_of = malloc(sizeof(int32_t) * (size_t)m->cfg.vocab_pad);
        MS_CHECK(m->row_ids && m->row_host && m->row_of); /* a few small arrays */
        for (int v = 0; v < m->cfg.vocab_pad; v++)
            m->row_of[v] = -1;
    }
    size_t pbytes = m->n_elems * sizeof(float);
    size_t cbytes = be->act_dtype == BE_F32 ? 0 : m->n_elems * be_dtype_size(be->act_dtype);
    ms_arena a;
    ms_arena_init(&a, NULL, 0);
    layout_acts(m, &a);
    m->act_bytes = ms_arena_used(&a);
    if (!strcmp(be->name, "cpu")) { /* more than the host holds: refused before any allocation */
        char copy[64] = "", parts[256];
        if (cbytes) snprintf(copy, sizeof copy, ", their bf16 copy %.1f GB", (double)cbytes / 1e9);
        snprintf(parts, sizeof parts,
                 "parameters %.1f GB, gradients %.1f GB%s, activations %.1f GB",
                 (double)pbytes / 1e9, (double)pbytes / 1e9, copy, (double)m->act_bytes / 1e9);
        st = be_cpu_check_host_memory(
            "model", 2.0 * (double)pbytes + (double)cbytes + (double)m->act_bytes, parts);
        if (st != MS_OK) goto out;
    }
    m->params = be->alloc(be, pbytes);
    m->grads = be->alloc(be, pbytes);
    if (be->act_dtype == BE_F32) {
        m->params_act = m->params;
    } else {
        m->params_act = be->alloc(be, cbytes);
        m->own_params_act = 1;
    }
    m->act_buf = be->alloc(be, m->act_bytes);
    if (!m->layers || !m->host_losses || !m->params || !m->grads || !m->params_act || !m->act_buf) {
        st = ms_error(MS_ERR_NOMEM,
                      "model: cannot allocate %.1f MB of parameters+gradients and %.1f MB of "
                      "activations on backend %s",
                      2.0 * (double)pbytes / 1e6, (double)m->act_bytes / 1e6, be->name);
        goto out;
    }
    ms_arena_init(&a, m->act_buf, m->act_bytes);
    layout_acts(m, &a);
    /* the tensor-parallel classifier keeps its chunk in the model */
    be_limits lim = {B, T, c.n_embd, c.n_head, m->tp > 1 ? 0 : c.vocab_pad, m->n_elems};
    st = be->reserve(be, &lim);
out:
    if (st != MS_OK)
        gpt_destroy(m);
    else
        *out = m;
    return st;
}

void gpt_destroy(gpt_model *m) {
    if (!m) return;
    be_backend *be = m->be;
    if (m->params) be->free(be, m->params);
    if (m->grads) be->free(be, m->grads);
    if (m->own_params_act && m->params_act) be->free(be, m->params_act);
    if (m->act_buf) be->free(be, m->act_buf);
    free(m->layers);
    free(m->slot_layers);
    free(m->lrange);
    free(m->table);
    free(m->layer_t);
    free(m->host_losses);
    free(m->tp_req);
    free(m->row_ids);
    free(m->row_host);
    free(m->row_of);
    free(m);
}

const gpt_config *gpt_get_config(const gpt_model *m) {
    return &m->cfg;
}
be_backend *gpt_backend(const gpt_model *m) {
    return m->be;
}
int gpt_num_tensors(const gpt_model *m) {
    return m->n_tensors;
}
const gpt_param *gpt_tensor(const gpt_model *m, int i) {
    return &m->table[i];
}
size_t gpt_num_elements(const gpt_model *m) {
    return m->n_elems;
}
float *gpt_params(gpt_model *m) {
    return m->params;
}
float *gpt_grads(gpt_model *m) {
    return m->grads;
}
void *gpt_params_act(gpt_model *m) {
    return m->params_act;
}
size_t gpt_activation_bytes(const gpt_model *m) {
    return m->act_bytes;
}

int gpt_tp_size(const gpt_model *m) {
    return m->tp;
}
int gpt_tp_rank(const gpt_model *m) {
    return m->tp_rank;
}
comm_dtype gpt_act_comm_dtype(const gpt_model *m) {
    return m->be->act_dtype == BE_BF16 ? COMM_BF16 : COMM_F32;
}

void gpt_set_tp_overlap(gpt_model *m, int on) {
    m->tp_overlap = on;
}

comm_group *gpt_tp_group(const gpt_model *m) {
    return m->tpg;
}

size_t gpt_logical_index(const gpt_model *m, int t, int rank, size_t j) {
    const gpt_param *p = &m->table[t];
    if (p->split == GPT_SPLIT_NONE) return j;
    size_t lc = (size_t)p->local[p->ndim - 1], cols = (size_t)p->shape[p->ndim - 1];
    size_t row = j / lc, col = j % lc, r = (size_t)rank;
    switch (p->split) {
    case GPT_SPLIT_QKV: { /* columns [q | k | v], each third split by heads */
        size_t third = lc / 3;
        return row * cols + (col / third) * (cols / 3) + r * third + col % third;
    }
    case GPT_SPLIT_COLS:
        return row * cols + r * lc + col;
    default: /* rows: GPT_SPLIT_ROWS, GPT_SPLIT_VOCAB */
        return (r * (size_t)p->local[0] + row) * cols + col;
    }
}

void gpt_vocab_slice(const gpt_model *m, int r, int *v0, int *Vl, int *Vs) {
    *Vl = m->cfg.vocab_pad / m->tp;
    *v0 = r * *Vl;
    int real = m->cfg.vocab - *v0;
    *Vs = real < 0 ? 0 : (real > *Vl ? *Vl : real);
}

ms_status gpt_take_error(gpt_model *m) {
    ms_status st = m->err;
    if (st == MS_OK) return MS_OK;
    m->err = MS_OK;
    return ms_error(st, "%s", m->errmsg);
}

int gpt_find(const gpt_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->table[i].name, name)) return i;
    return -1;
}

void *gpt_w(gpt_model *m, int t) {
    return (char *)m->params_act + m->table[t].offset * be_dtype_size(m->be->act_dtype);
}
float *gpt_g(gpt_model *m, int t) {
    return m->grads + m->table[t].offset;
}

/* Refresh the act-dtype copy of every weight from the fp32 masters (one
 * pass over the parameters; a no-op where they are the same buffer). */
void gpt_params_updated(gpt_model *m) {
    gpt_params_range_updated(m, 0, m->n_elems);
}

void gpt_params_range_updated(gpt_model *m, size_t begin, size_t end) {
    MS_CHECKF(begin <= end && end <= m->n_elems, "parameter range [%zu, %zu) of %zu", begin, end,
              m->n_elems);
    if (m->own_params_act && end > begin)
        m->be->to_act(m->be, (char *)m->params_act + begin * be_dtype_size(m->be->act_dtype),
                      m->params + begin, end - begin);
}

void gpt_zero_grads(gpt_model *m) {
    m->be->zero(m->be, m->grads, m->n_elems * sizeof(float));
}

/* FNV-1a of the tensor name: the RNG stream of that tensor.  Its basis is
 * FNV's with the last digit lost; every tensor's initial weights depend on
 * it (PyTorch parity, bitwise resumes), so it stays. */
static uint64_t name_stream(const char *s) {
    return ms_fnv1a_str(1469598103934665603ULL, s);
}

/* How many elements from j on (at most n - j) have consecutive logical
 * indices: the rest of the shard, of a row of a column shard, or of one
 * third of a row of the q|k|v shard (gpt_logical_index). */
static size_t logical_run(const gpt_param *p, size_t j, size_t n) {
    size_t lc = (size_t)p->local[p->ndim - 1], run = n - j;
    if (p->split == GPT_SPLIT_COLS) run = lc - j % lc;
    if (p->split == GPT_SPLIT_QKV) run = lc / 3 - j % lc % (lc / 3);
    return run < n - j ? run : n - j;
}

/* Elements [j0, j1) of tensor i's shard into w: element j draws the number
 * of its logical index k, std * ms_rng_normal(seed, stream, k), or 0 past
 * lim (wte's padding rows), a run of consecutive k at a time. */
static void init_range(const gpt_model *m, int i, uint64_t seed, uint64_t stream, size_t lim,
                       float *w, size_t j0, size_t j1) {
    const gpt_param *p = &m->table[i];
    for (size_t j = j0; j < j1;) {
        size_t len = logical_run(p, j, j1), k = gpt_logical_index(m, i, m->tp_rank, j);
        MS_CHECKF(gpt_logical_index(m, i, m->tp_rank, j + len - 1) == k + len - 1,
                  "init: %s: elements %zu..%zu are not one logical run", p->name, j, j + len - 1);
        size_t real = k >= lim ? 0 : (lim - k < len ? lim - k : len);
        ms_rng_normal_fill(seed, stream, k, p->init_std, w + j, real);
        memset(w + j + real, 0, (len - real) * sizeof(float));
        j += len;
    }
}

/* Element j of this rank's shard of tensor t draws the number of its
 * logical index; logical elements past the real vocabulary (wte padding)
 * stay 0.  Written in place where the host can address the parameters
 * (the CPU backend), else through a host copy. */
void gpt_init(gpt_model *m, uint64_t seed) {
    enum { BLOCK = 16384 }; /* elements a thread draws at a time */
    int direct = !m->be->is_device(m->be, m->params);
    float *host = direct ? m->params : calloc(m->n_elems, sizeof(float));
    MS_CHECK(host);
    for (int i = 0; i < m->n_tensors; i++) {
        const gpt_param *p = &m->table[i];
        float *w = host + p->offset;
        size_t n = p->numel, lim = SIZE_MAX;
        if (i == m->t_wte) lim = (size_t)m->cfg.vocab * (size_t)m->cfg.n_embd;
        if (p->init_std > 0) {
            uint64_t stream = name_stream(p->name);
            size_t nblk = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (nblk > 1)
            for (size_t b = 0; b < nblk; b++)
                init_range(m, i, seed, stream, lim, w, b * BLOCK,
                           (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n);
        } else {
            for (size_t j = 0; j < n; j++)
                w[j] = p->init_value;
        }
    }
    if (!direct) {
        m->be->to_device(m->be, m->params, host, m->n_elems * sizeof(float));
        free(host);
    }
    gpt_params_updated(m);
}

void gpt_set_grad_hook(gpt_model *m, gpt_grad_ready_fn fn, void *ctx) {
    m->grad_hook = fn;
    m->grad_hook_ctx = ctx;
}

void gpt_set_param_hook(gpt_model *m, gpt_grad_ready_fn fn, void *ctx) {
    m->param_hook = fn;
    m->param_hook_ctx = ctx;
}

void gpt_set_rows_hook(gpt_model *m, gpt_rows_ready_fn fn, void *ctx) {
    m->rows_hook = m->row_grads ? fn : NULL;
    m->rows_hook_ctx = ctx;
}

int gpt_rows_max(const gpt_model *m) {
    return m->row_grads ? m->B * m->T : 0;
}

/* Append range r to bounds (n so far) unless it is empty; the new n. */
static int add_range(size_t *bounds, int n, const size_t *r) {
    if (r[1] == r[0]) return n; /* not on this pipeline stage */
    bounds[2 * n] = r[0];
    bounds[2 * n + 1] = r[1];
    return n + 1;
}

/* Forward read order: the embeddings (wte, wpe) where this model embeds
 * the tokens, its blocks, ln_f, and a last stage's wte copy after it. */
int gpt_grad_ranges(const gpt_model *m, size_t *bounds, int max_ranges) {
    int L = m->cfg.n_layer, n = 0;
    MS_CHECK(max_ranges >= L + 3);
    int embeds = m->prange[1] > m->prange[0]; /* holds wpe: a whole model or the first stage */
    if (embeds) {
        n = add_range(bounds, n, m->wrange);
        n = add_range(bounds, n, m->prange);
    }
    for (int l = 0; l < L; l++)
        if (gpt_holds_layer(m, l)) n = add_range(bounds, n, &m->lrange[2 * l]);
    n = add_range(bounds, n, m->frange);
    if (!embeds) n = add_range(bounds, n, m->wrange); /* the last stage's tied copy */
    return n;
}

void gpt_trace_micro_batch(gpt_model *m, int mb) {
    m->trace_mb = mb;
}
