/* gpt_model.c - the parameter table, buffer layout, initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/rng.h"
#include "model/gpt_internal.h"

static int add_tensor(gpt_model *m, int cap, const char *name, int d0, int d1, int decay, float std,
                      float value, int layer) {
    MS_CHECK(m->n_tensors < cap);
    gpt_param *p = &m->table[m->n_tensors];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    /* align every tensor to 16 floats so views stay 64-byte aligned */
    p->offset = m->n_elems;
    m->n_elems += (p->numel + 15) & ~(size_t)15;
    p->decay = decay;
    p->init_std = std;
    p->init_value = value;
    p->layer = layer;
    return m->n_tensors++;
}

/* Build the table in Hugging Face order: wte, wpe, h.0 ... h.{L-1}, ln_f. */
static void build_table(gpt_model *m) {
    const gpt_config *c = &m->cfg;
    int C = c->n_embd, L = c->n_layer;
    int cap = 4 + L * GPT_LAYER_TENSORS;
    m->table = calloc((size_t)cap, sizeof *m->table);
    m->layer_t = malloc(sizeof(int) * (size_t)(L * GPT_LAYER_TENSORS));
    MS_CHECK(m->table && m->layer_t);
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    m->t_wte = add_tensor(m, cap, "wte.weight", c->vocab_pad, C, 1, std, 0, -1);
    m->t_wpe = add_tensor(m, cap, "wpe.weight", c->seq_max, C, 1, std, 0, -1);
    for (int l = 0; l < L; l++) {
        int *lt = &m->layer_t[l * GPT_LAYER_TENSORS];
        char n[64];
#define T_(idx, suffix, d0, d1, decay, s, v)                                                       \
    do {                                                                                           \
        snprintf(n, sizeof n, "h.%d.%s", l, suffix);                                               \
        lt[idx] = add_tensor(m, cap, n, d0, d1, decay, s, v, l);                                   \
    } while (0)
        T_(GPT_LN1_W, "ln_1.weight", C, 0, 0, 0, 1);
        T_(GPT_LN1_B, "ln_1.bias", C, 0, 0, 0, 0);
        T_(GPT_QKV_W, "attn.c_attn.weight", C, 3 * C, 1, std, 0);
        T_(GPT_QKV_B, "attn.c_attn.bias", 3 * C, 0, 0, 0, 0);
        T_(GPT_ATTPROJ_W, "attn.c_proj.weight", C, C, 1, proj_std, 0);
        T_(GPT_ATTPROJ_B, "attn.c_proj.bias", C, 0, 0, 0, 0);
        if (c->block == GPT_BLOCK_SERIAL) {
            T_(GPT_LN2_W, "ln_2.weight", C, 0, 0, 0, 1);
            T_(GPT_LN2_B, "ln_2.bias", C, 0, 0, 0, 0);
        } else {
            lt[GPT_LN2_W] = lt[GPT_LN2_B] = -1;
        }
        T_(GPT_FC_W, "mlp.c_fc.weight", C, 4 * C, 1, std, 0);
        T_(GPT_FC_B, "mlp.c_fc.bias", 4 * C, 0, 0, 0, 0);
        T_(GPT_FCPROJ_W, "mlp.c_proj.weight", 4 * C, C, 1, proj_std, 0);
        T_(GPT_FCPROJ_B, "mlp.c_proj.bias", C, 0, 0, 0, 0);
#undef T_
    }
    m->t_lnf_w = add_tensor(m, cap, "ln_f.weight", C, 0, 0, 0, 1, -1);
    m->t_lnf_b = add_tensor(m, cap, "ln_f.bias", C, 0, 0, 0, 0, -1);
}

/* Lay out the activation buffer; with a NULL-based arena this only sizes it. */
static void layout_acts(gpt_model *m, ms_arena *a) {
    be_backend *be = m->be;
    size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.n_embd, es = be_dtype_size(be->act_dtype);
    size_t att = be->attention_state_bytes(be, m->B, m->T, m->cfg.n_head);
    int serial = m->cfg.block == GPT_BLOCK_SERIAL;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        gpt_layer_acts *la = &m->layers[l];
        memset(la, 0, sizeof *la);
        la->resid_in = ms_arena_push(a, N * C * es);
        la->ln1 = ms_arena_push(a, N * C * es);
        la->ln1_mean = ms_arena_push(a, N * 4);
        la->ln1_rstd = ms_arena_push(a, N * 4);
        la->qkv = ms_arena_push(a, N * 3 * C * es);
        la->atty = ms_arena_push(a, N * C * es);
        la->att_state = ms_arena_push(a, att);
        if (serial) {
            la->resid_mid = ms_arena_push(a, N * C * es);
            la->ln2 = ms_arena_push(a, N * C * es);
            la->ln2_mean = ms_arena_push(a, N * 4);
            la->ln2_rstd = ms_arena_push(a, N * 4);
        }
        la->fc_pre = ms_arena_push(a, N * 4 * C * es);
        la->fc_gelu = ms_arena_push(a, N * 4 * C * es);
    }
    m->x_final = ms_arena_push(a, N * C * es);
    m->lnf = ms_arena_push(a, N * C * es);
    m->lnf_mean = ms_arena_push(a, N * 4);
    m->lnf_rstd = ms_arena_push(a, N * 4);
    m->losses = ms_arena_push(a, N * 4);
    m->tokens = ms_arena_push(a, N * 4);
    m->targets = ms_arena_push(a, N * 4);
    m->dresid = ms_arena_push(a, N * C * es);
    m->dln = ms_arena_push(a, N * C * es);
    m->datty = ms_arena_push(a, N * C * es);
    m->tmp = ms_arena_push(a, N * C * es);
    m->dqkv = ms_arena_push(a, N * 3 * C * es);
    m->dfc = ms_arena_push(a, N * 4 * C * es);
    m->dfc_pre = ms_arena_push(a, N * 4 * C * es);
}

ms_status gpt_create(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T) {
    *out = NULL;
    gpt_config c = *cfg;
    MS_TRY(gpt_config_validate(&c));
    if (B < 1 || T < 1)
        return ms_error(MS_ERR_ARG, "micro-batch %d and sequence %d must be positive", B, T);
    if (T > c.seq_max)
        return ms_error(MS_ERR_ARG, "sequence length %d exceeds the model's seq-max %d", T,
                        c.seq_max);
    gpt_model *m = calloc(1, sizeof *m);
    if (!m) return ms_error(MS_ERR_NOMEM, "model: out of host memory");
    m->cfg = c;
    m->be = be;
    m->B = B;
    m->T = T;
    build_table(m);
    m->layers = calloc((size_t)c.n_layer, sizeof *m->layers);
    m->host_losses = malloc(sizeof(float) * (size_t)B * T);
    ms_status st = MS_OK;
    size_t pbytes = m->n_elems * sizeof(float);
    m->params = be->alloc(be, pbytes);
    m->grads = be->alloc(be, pbytes);
    if (be->act_dtype == BE_F32) {
        m->params_act = m->params;
    } else {
        m->params_act = be->alloc(be, m->n_elems * be_dtype_size(be->act_dtype));
        m->own_params_act = 1;
    }
    ms_arena a;
    ms_arena_init(&a, NULL, 0);
    layout_acts(m, &a);
    m->act_bytes = ms_arena_used(&a);
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
    be_limits lim = {B, T, c.n_embd, c.n_head, c.vocab_pad, m->n_elems};
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
    free(m->table);
    free(m->layer_t);
    free(m->host_losses);
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

void gpt_params_updated(gpt_model *m) {
    MS_CHECKF(!m->own_params_act, "act-dtype weight copies are not implemented for backend %s",
              m->be->name);
}

void gpt_zero_grads(gpt_model *m) {
    m->be->zero(m->be, m->grads, m->n_elems * sizeof(float));
}

/* FNV-1a of the tensor name: the RNG stream of that tensor. */
static uint64_t name_stream(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

void gpt_init(gpt_model *m, uint64_t seed) {
    float *host = malloc(m->n_elems * sizeof(float));
    MS_CHECK(host);
    memset(host, 0, m->n_elems * sizeof(float));
    for (int i = 0; i < m->n_tensors; i++) {
        const gpt_param *p = &m->table[i];
        float *w = host + p->offset;
        size_t n = p->numel;
        if (i == m->t_wte) n = (size_t)m->cfg.vocab * (size_t)m->cfg.n_embd; /* padding stays 0 */
        if (p->init_std > 0) {
            uint64_t stream = name_stream(p->name);
            float std = p->init_std;
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < n; j++)
                w[j] = std * ms_rng_normal(seed, stream, j);
        } else {
            for (size_t j = 0; j < n; j++)
                w[j] = p->init_value;
        }
    }
    m->be->to_device(m->be, m->params, host, m->n_elems * sizeof(float));
    free(host);
    gpt_params_updated(m);
}

void gpt_set_grad_hook(gpt_model *m, gpt_grad_ready_fn fn, void *ctx) {
    m->grad_hook = fn;
    m->grad_hook_ctx = ctx;
}

int gpt_grad_ranges(const gpt_model *m, size_t *bounds, int max_ranges) {
    int L = m->cfg.n_layer, n = 0;
    MS_CHECK(max_ranges >= L + 2);
    for (int l = L - 1; l >= 0; l--) { /* blocks, last first */
        bounds[2 * n] = m->table[m->layer_t[l * GPT_LAYER_TENSORS]].offset;
        bounds[2 * n + 1] = l + 1 < L ? m->table[m->layer_t[(l + 1) * GPT_LAYER_TENSORS]].offset
                                      : m->table[m->t_lnf_w].offset;
        n++;
    }
    bounds[2 * n] = m->table[m->t_lnf_w].offset; /* ln_f */
    bounds[2 * n + 1] = m->n_elems;
    n++;
    bounds[2 * n] = 0; /* wte, wpe */
    bounds[2 * n + 1] = m->table[m->layer_t[0]].offset;
    return n + 1;
}
