/* ckpt_layout.c - slice math: the logical tensors of a model, the runs a
 * rank holds (from its optimiser, or computed for any dp), and scattering a
 * slice (box + flat range) into a logical tensor. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

static const char *const kind_names[CKPT_NKINDS] = {"param", "m", "v"};

const char *ckpt_kind_name(int kind) {
    return kind >= 0 && kind < CKPT_NKINDS ? kind_names[kind] : "?";
}

int ckpt_kind_parse(const char *s) {
    for (int k = 0; k < CKPT_NKINDS; k++)
        if (s && !strcmp(s, kind_names[k])) return k;
    return -1;
}

uint64_t ckpt_numel(const ckpt_tensor_info *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

static void put_tensor(ckpt_tensor_info *t, int *n, const char *name, int64_t d0, int64_t d1) {
    ckpt_tensor_info *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ndim = d1 > 0 ? 2 : 1;
    x->shape[0] = d0;
    x->shape[1] = d1 > 0 ? d1 : 0;
}

ms_status ckpt_tensors_of(gpt_model *m, ckpt_tensor_info **out, int *n) {
    return ckpt_tensors_of_config(gpt_get_config(m), out, n);
}

ms_status ckpt_tensors_of_config(const gpt_config *c, ckpt_tensor_info **out, int *n) {
    int64_t C = c->n_embd;
    ckpt_tensor_info *t = calloc(4 + (size_t)c->n_layer * 12, sizeof *t);
    if (!t) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    int nt = 0;
    char nm[64];
    put_tensor(t, &nt, "wte.weight", c->vocab, C); /* as gpt_model.c's table, HF order */
    put_tensor(t, &nt, "wpe.weight", c->seq_max, C);
    for (int l = 0; l < c->n_layer; l++) {
#define T_(suffix, d0, d1)                                                                         \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);                                             \
        put_tensor(t, &nt, nm, d0, d1);                                                            \
    } while (0)
        T_("ln_1.weight", C, 0);
        T_("ln_1.bias", C, 0);
        T_("attn.c_attn.weight", C, 3 * C);
        T_("attn.c_attn.bias", 3 * C, 0);
        T_("attn.c_proj.weight", C, C);
        T_("attn.c_proj.bias", C, 0);
        if (c->block == GPT_BLOCK_SERIAL) {
            T_("ln_2.weight", C, 0);
            T_("ln_2.bias", C, 0);
        }
        T_("mlp.c_fc.weight", C, 4 * C);
        T_("mlp.c_fc.bias", 4 * C, 0);
        T_("mlp.c_proj.weight", 4 * C, C);
        T_("mlp.c_proj.bias", C, 0);
#undef T_
    }
    put_tensor(t, &nt, "ln_f.weight", C, 0);
    put_tensor(t, &nt, "ln_f.bias", C, 0);
    *out = t;
    *n = nt;
    return MS_OK;
}

int ckpt_tensor_find(const ckpt_tensor_info *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return i;
    return -1;
}

/* A box of the logical tensor that a local shard holds: box element k is
 * local element loc + (k / width) * stride + k % width. */
typedef struct {
    int64_t off[CKPT_MAX_DIMS], shape[CKPT_MAX_DIMS];
    size_t loc, width, stride, rows;
} box_map;

/* The boxes of local tensor i of m (its tp split, clipped to the real
 * vocabulary); returns their number (0..3). */
static int boxes_of(gpt_model *m, int i, box_map *b) {
    const gpt_param *p = gpt_tensor(m, i);
    int r = gpt_tp_rank(m), nd = p->ndim, nb = 1;
    size_t l0 = (size_t)p->local[0], l1 = nd > 1 ? (size_t)p->local[1] : 1;
    size_t lw = nd > 1 ? l1 : l0; /* local row width */
    memset(b, 0, 3 * sizeof *b);
    b[0].shape[0] = p->local[0];
    b[0].shape[1] = nd > 1 ? p->local[1] : 0;
    b[0].width = b[0].stride = lw;
    b[0].rows = nd > 1 ? l0 : 1;
    switch (p->split) {
    case GPT_SPLIT_COLS:
        b[0].off[nd - 1] = (int64_t)((size_t)r * lw);
        break;
    case GPT_SPLIT_QKV: { /* [q | k | v] thirds: one box each */
        size_t third = lw / 3, full = (size_t)p->shape[nd - 1] / 3;
        nb = 3;
        for (int s = 0; s < 3; s++) {
            b[s] = b[0];
            b[s].shape[nd - 1] = (int64_t)third;
            b[s].width = third;
            b[s].off[nd - 1] = (int64_t)((size_t)s * full + (size_t)r * third);
            b[s].loc = (size_t)s * third;
        }
        break;
    }
    case GPT_SPLIT_ROWS:
    case GPT_SPLIT_VOCAB:
        b[0].off[0] = (int64_t)((size_t)r * l0);
        break;
    default:
        break;
    }
    if (!strcmp(p->name, "wte.weight")) { /* padded vocabulary rows are not saved */
        int64_t V = gpt_get_config(m)->vocab, real = V - b[0].off[0];
        if (real <= 0) return 0;
        if (real < b[0].shape[0]) b[0].shape[0] = real;
        b[0].rows = (size_t)b[0].shape[0];
    }
    return nb;
}

/* Elements of box b whose local index is below x. */
static uint64_t box_count(const box_map *b, size_t x) {
    if (x <= b->loc) return 0;
    size_t rel = x - b->loc, row = rel / b->stride, col = rel % b->stride;
    uint64_t c = (uint64_t)row * b->width + (col < b->width ? col : b->width);
    uint64_t all = (uint64_t)b->rows * b->width;
    return c < all ? c : all;
}

/* Append the slices of the local run [off, off+n) of the parameter buffer,
 * which lies in local tensor i (global gi); mom/var are m/v of element off.
 * save: 0 for a replica another rank saves (appended at the end). */
static void add_run(gpt_model *m, ckpt_run *runs, int *nr, int i, int gi, size_t off, size_t n,
                    float *mom, float *var) {
    const gpt_param *p = gpt_tensor(m, i);
    box_map b[3];
    int nb = boxes_of(m, i, b);
    size_t a = off - p->offset, e = a + n;
    for (int k = 0; k < nb; k++) {
        uint64_t lo = box_count(&b[k], a), hi = box_count(&b[k], e);
        if (lo >= hi) continue;
        ckpt_run *r = &runs[(*nr)++];
        memset(r, 0, sizeof *r);
        r->tensor = gi;
        r->local = i;
        r->begin = lo;
        r->end = hi;
        memcpy(r->box_off, b[k].off, sizeof r->box_off);
        memcpy(r->box_shape, b[k].shape, sizeof r->box_shape);
        r->box_loc = b[k].loc;
        r->width = b[k].width;
        r->stride = b[k].stride;
        r->tensor_off = p->offset;
        r->mom = mom;
        r->var = var;
        r->state_off = off;
        size_t pos = 0;
        (void)ckpt_run_seg(r, lo, &pos);
        r->param_off = pos;
    }
}

size_t ckpt_run_seg(const ckpt_run *r, uint64_t k, size_t *pos) {
    uint64_t row = k / r->width, col = k % r->width;
    *pos = r->tensor_off + r->box_loc + row * r->stride + col;
    if (r->stride == r->width) return r->end - k;
    uint64_t len = r->width - col;
    return len < r->end - k ? len : r->end - k;
}

/* 1 if this rank saves local tensor i (not a replica that another saves). */
static int saves(gpt_model *m, int i) {
    const gpt_param *p = gpt_tensor(m, i);
    const gpt_stage *st = gpt_get_stage(m);
    if (!strcmp(p->name, "wte.weight") && st && st->stage != 0) return 0; /* the tied copy */
    return p->split != GPT_SPLIT_NONE || gpt_tp_rank(m) == 0;
}

/* Order the runs: saved first, then replicas; set data_off. */
static ms_status finish_runs(gpt_model *m, ckpt_run *runs, int nr, int *n_save) {
    ckpt_run *tmp = malloc(sizeof *tmp * ((size_t)nr + 1));
    if (!tmp) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    int k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < nr; i++)
            if (saves(m, runs[i].local) == !pass) tmp[k++] = runs[i];
    uint64_t data = 0;
    int ns = 0;
    for (int i = 0; i < nr; i++) {
        runs[i] = tmp[i];
        runs[i].data_off = data;
        data += 3 * (runs[i].end - runs[i].begin);
        ns += saves(m, runs[i].local);
    }
    free(tmp);
    if (n_save) *n_save = ns;
    return MS_OK;
}

ms_status ckpt_runs_of_opt(gpt_model *m, opt_state *o, ckpt_run **out, int *n) {
    return ckpt_runs_of_opt_save(m, o, out, n, NULL);
}

ms_status ckpt_runs_of_opt_save(gpt_model *m, opt_state *o, ckpt_run **out, int *n, int *n_save) {
    int np = opt_state_pieces(o, NULL, 0);
    opt_state_piece *pc = calloc((size_t)np + 1, sizeof *pc);
    ckpt_run *runs = calloc(3 * (size_t)np + 1, sizeof *runs);
    ckpt_tensor_info *tens = NULL;
    int nt = 0;
    ms_status st = pc && runs ? ckpt_tensors_of(m, &tens, &nt)
                              : ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    int nr = 0;
    if (st == MS_OK) opt_state_pieces(o, pc, np);
    for (int i = 0; st == MS_OK && i < np; i++) {
        int gi = ckpt_tensor_find(tens, nt, gpt_tensor(m, pc[i].tensor)->name);
        if (gi < 0)
            st = ms_error(MS_ERR_INTERNAL, "checkpoint: tensor '%s' is not a GPT-2 tensor",
                          gpt_tensor(m, pc[i].tensor)->name);
        else
            add_run(m, runs, &nr, pc[i].tensor, gi, pc[i].off, pc[i].n, pc[i].mom, pc[i].var);
    }
    if (st == MS_OK) st = finish_runs(m, runs, nr, n_save);
    free(pc);
    free(tens);
    if (st != MS_OK) {
        free(runs);
        return st;
    }
    *out = runs;
    *n = nr;
    return MS_OK;
}

ms_status ckpt_runs_of_range(gpt_model *m, int i, int gi, size_t off, size_t n, ckpt_run **out,
                             int *nr) {
    ckpt_run *runs = calloc(4, sizeof *runs);
    if (!runs) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    *nr = 0;
    add_run(m, runs, nr, i, gi, off, n, NULL, NULL);
    *out = runs;
    return MS_OK;
}

ms_status ckpt_runs_of_dp(gpt_model *m, int dp, int rank, ckpt_run **out, int *n) {
    int nt = gpt_num_tensors(m), L = gpt_get_config(m)->n_layer;
    size_t *bounds = malloc(sizeof(size_t) * 2 * (size_t)(L + 3));
    ckpt_run *runs = calloc((size_t)(nt + L + 3) * 6, sizeof *runs);
    if (!bounds || !runs) {
        free(bounds);
        free(runs);
        return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    }
    int nb = 1, nr = 0;
    if (dp > 1) {
        nb = gpt_grad_ranges(m, bounds, L + 3);
    } else {
        bounds[0] = 0;
        bounds[1] = gpt_num_elements(m);
    }
    for (int s = 0; s < nb; s++) { /* as par_zero_shard + the optimiser's plan */
        size_t cnt = (bounds[2 * s + 1] - bounds[2 * s]) / (size_t)dp;
        size_t lo = bounds[2 * s] + (size_t)rank * cnt, hi = lo + cnt;
        for (int i = 0; i < nt; i++) {
            const gpt_param *p = gpt_tensor(m, i);
            size_t a = p->offset > lo ? p->offset : lo;
            size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
            if (a < b) add_run(m, runs, &nr, i, i, a, b - a, NULL, NULL);
        }
    }
    free(bounds);
    ms_status st = finish_runs(m, runs, nr, NULL);
    if (st != MS_OK) {
        free(runs);
        return st;
    }
    *out = runs;
    *n = nr;
    return MS_OK;
}

uint64_t ckpt_runs_elems(const ckpt_run *r, int n) {
    uint64_t e = 0;
    for (int i = 0; i < n; i++)
        e += r[i].end - r[i].begin;
    return e;
}

ms_status ckpt_slice_check(const ckpt_tensor_info *t, const ckpt_slice *s, const char *where) {
    uint64_t box = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (s->box_off[d] < 0 || s->box_shape[d] < 0 ||
            s->box_off[d] + s->box_shape[d] > t->shape[d])
            return ms_error(MS_ERR_FORMAT,
                            "%s: tensor '%s' (%s): slice box [%" PRId64 "+%" PRId64
                            ") lies outside dimension %d of size %" PRId64,
                            where, t->name, ckpt_kind_name(s->kind), s->box_off[d], s->box_shape[d],
                            d, t->shape[d]);
        box *= (uint64_t)s->box_shape[d];
    }
    if (s->begin > s->end || s->end > box)
        return ms_error(MS_ERR_FORMAT,
                        "%s: tensor '%s' (%s): slice range [%" PRIu64 ", %" PRIu64
                        ") outside its box of %" PRIu64 " elements",
                        where, t->name, ckpt_kind_name(s->kind), s->begin, s->end, box);
    return MS_OK;
}

ms_status ckpt_slice_scatter(const ckpt_tensor_info *t, const ckpt_slice *s, const float *src,
                             float *dst, const char *where) {
    MS_TRY(ckpt_slice_check(t, s, where));
    if (t->ndim == 1) {
        memcpy(dst + s->box_off[0] + s->begin, src, sizeof(float) * (s->end - s->begin));
        return MS_OK;
    }
    uint64_t bc = (uint64_t)s->box_shape[1], C = (uint64_t)t->shape[1];
    for (uint64_t k = s->begin; k < s->end;) { /* one run per box row */
        uint64_t row = k / bc, col = k % bc, len = bc - col;
        if (len > s->end - k) len = s->end - k;
        memcpy(dst + ((uint64_t)s->box_off[0] + row) * C + (uint64_t)s->box_off[1] + col,
               src + (k - s->begin), sizeof(float) * len);
        k += len;
    }
    return MS_OK;
}

void ckpt_slice_key(char *buf, size_t n, const char *tensor, int kind, uint64_t begin,
                    uint64_t end) {
    snprintf(buf, n, "%s/%s/%" PRIu64 "-%" PRIu64, tensor, ckpt_kind_name(kind), begin, end);
}

void ckpt_run_key(char *buf, size_t n, const char *tensor, int kind, const ckpt_run *r) {
    if (!r->box_off[0] && !r->box_off[1])
        ckpt_slice_key(buf, n, tensor, kind, r->begin, r->end);
    else
        snprintf(buf, n, "%s/%s@%" PRId64 ",%" PRId64 "/%" PRIu64 "-%" PRIu64, tensor,
                 ckpt_kind_name(kind), r->box_off[0], r->box_off[1], r->begin, r->end);
}
