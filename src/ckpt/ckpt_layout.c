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

ms_status ckpt_tensors_of(gpt_model *m, ckpt_tensor_info **out, int *n) {
    int nt = gpt_num_tensors(m);
    ckpt_tensor_info *t = calloc((size_t)nt, sizeof *t);
    if (!t) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0; i < nt; i++) {
        const gpt_param *p = gpt_tensor(m, i);
        snprintf(t[i].name, sizeof t[i].name, "%s", p->name);
        t[i].ndim = p->ndim;
        t[i].shape[0] = p->shape[0];
        t[i].shape[1] = p->ndim > 1 ? p->shape[1] : 0;
        if (!strcmp(p->name, "wte.weight")) t[i].shape[0] = gpt_get_config(m)->vocab;
    }
    *out = t;
    *n = nt;
    return MS_OK;
}

/* Append the run [off, off+n) of the parameter buffer, which lies in tensor
 * i, clipped to the logical tensor; mom/var point at element off. */
static void add_run(gpt_model *m, ckpt_run *runs, int *nr, uint64_t *data, int i, size_t off,
                    size_t n, float *mom, float *var) {
    const gpt_param *p = gpt_tensor(m, i);
    uint64_t numel = (uint64_t)p->numel;
    if (!strcmp(p->name, "wte.weight"))
        numel = (uint64_t)gpt_get_config(m)->vocab * (uint64_t)p->shape[1];
    uint64_t b = off - p->offset, e = b + n;
    if (e > numel) e = numel;
    if (b >= e) return; /* only padded vocabulary rows */
    ckpt_run *r = &runs[(*nr)++];
    *r = (ckpt_run){i, b, e, off, mom, var, *data};
    *data += 3 * (e - b);
}

ms_status ckpt_runs_of_opt(gpt_model *m, opt_state *o, ckpt_run **out, int *n) {
    int np = opt_state_pieces(o, NULL, 0);
    opt_state_piece *pc = calloc((size_t)np + 1, sizeof *pc);
    ckpt_run *runs = calloc((size_t)np + 1, sizeof *runs);
    if (!pc || !runs) {
        free(pc);
        free(runs);
        return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    }
    opt_state_pieces(o, pc, np);
    int nr = 0;
    uint64_t data = 0;
    for (int i = 0; i < np; i++)
        add_run(m, runs, &nr, &data, pc[i].tensor, pc[i].off, pc[i].n, pc[i].mom, pc[i].var);
    free(pc);
    *out = runs;
    *n = nr;
    return MS_OK;
}

ms_status ckpt_runs_of_dp(gpt_model *m, int dp, int rank, ckpt_run **out, int *n) {
    int nt = gpt_num_tensors(m), L = gpt_get_config(m)->n_layer;
    size_t *bounds = malloc(sizeof(size_t) * 2 * (size_t)(L + 2));
    ckpt_run *runs = calloc((size_t)(nt + L + 2) * 2, sizeof *runs);
    if (!bounds || !runs) {
        free(bounds);
        free(runs);
        return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    }
    int nb = 1, nr = 0;
    uint64_t data = 0;
    if (dp > 1) {
        nb = gpt_grad_ranges(m, bounds, L + 2);
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
            if (a < b) add_run(m, runs, &nr, &data, i, a, b - a, NULL, NULL);
        }
    }
    free(bounds);
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

ms_status ckpt_slice_scatter(const ckpt_tensor_info *t, const ckpt_slice *s, const float *src,
                             float *dst, const char *where) {
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
