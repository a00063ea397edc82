/* hf_pipe.c - Hugging Face export of a pipeline-parallel model
 * (ckpt_hf_save_pipeline): each stage's logical tensors (tp shards
 * gathered by ckpt_hf_logical) travel over the pp group to stage 0, which
 * writes them in Hugging Face order (wte, wpe, h.0 ... h.{L-1}, ln_f).
 * Per stage s > 0, to stage 0 (tag 0): the tensor count (i32), then per
 * tensor an hf_pipe_hdr (u8) and its data (f32). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hf.h"
#include "ckpt/hf_internal.h"

typedef struct {
    char name[64];
    int64_t ndim, shape[2];
} hf_pipe_hdr;

typedef struct {
    hf_pipe_hdr h;
    const float *data;
    int key, idx; /* file order: wte, wpe, blocks, ln_f; then arrival */
} hf_entry;

static size_t hdr_numel(const hf_pipe_hdr *h) {
    return (size_t)h->shape[0] * (size_t)(h->ndim > 1 ? h->shape[1] : 1);
}

static int entry_key(const char *name, int L) {
    int l;
    if (!strcmp(name, "wte.weight")) return 0;
    if (!strcmp(name, "wpe.weight")) return 1;
    if (sscanf(name, "h.%d.", &l) == 1) return 2 + l;
    return 2 + L;
}

static int cmp_entry(const void *a, const void *b) {
    const hf_entry *x = a, *y = b;
    return x->key != y->key ? (x->key > y->key) - (x->key < y->key)
                            : (x->idx > y->idx) - (x->idx < y->idx);
}

/* Stage s > 0: send this stage's tensors (wte excluded) to stage 0. */
static ms_status send_stage(gpt_model *m, comm_group *pp, const float *src, const size_t *offs) {
    int nt = gpt_num_tensors(m), n = 0;
    for (int i = 0; i < nt; i++)
        n += strcmp(gpt_tensor(m, i)->name, "wte.weight") != 0;
    MS_TRY(comm_send(pp, &n, 1, COMM_I32, 0, 0));
    for (int i = 0; i < nt; i++) {
        const gpt_param *p = gpt_tensor(m, i);
        if (!strcmp(p->name, "wte.weight")) continue;
        hf_pipe_hdr h = {{0}, p->ndim, {0, 0}};
        snprintf(h.name, sizeof h.name, "%s", p->name);
        ckpt_hf_file_shape(m, p, h.shape);
        MS_TRY(comm_send(pp, &h, sizeof h, COMM_U8, 0, 0));
        MS_TRY(comm_send(pp, src + offs[i], hdr_numel(&h), COMM_F32, 0, 0));
    }
    return MS_OK;
}

/* Stage 0: receive stage s's tensors into e[*n ..] (data malloc'ed). */
static ms_status recv_stage(comm_group *pp, int s, hf_entry *e, int *n, int cap, int L) {
    int k;
    MS_TRY(comm_recv(pp, &k, 1, COMM_I32, s, 0));
    if (*n + k > cap) return ms_error(MS_ERR_FORMAT, "save: stage %d sends %d tensors", s, k);
    for (int i = 0; i < k; i++) {
        hf_entry *x = &e[*n];
        MS_TRY(comm_recv(pp, &x->h, sizeof x->h, COMM_U8, s, 0));
        x->h.name[sizeof x->h.name - 1] = 0;
        float *d = malloc(hdr_numel(&x->h) * sizeof(float));
        if (!d) return ms_error(MS_ERR_NOMEM, "save: out of memory for '%s'", x->h.name);
        x->data = d;
        x->key = entry_key(x->h.name, L);
        x->idx = (*n)++;
        MS_TRY(comm_recv(pp, d, hdr_numel(&x->h), COMM_F32, s, 0));
    }
    return MS_OK;
}

/* Stage 0: gather every stage's entries and write the file. */
static ms_status write_all(gpt_model *m, comm_group *pp, const float *src, const size_t *offs,
                           const char *path, ckpt_st_dtype dtype) {
    const gpt_config *c = gpt_get_config(m);
    int cap = 4 + 16 * c->n_layer, n = 0, nt = gpt_num_tensors(m), local = 0;
    hf_entry *e = calloc((size_t)cap, sizeof *e);
    if (!e) return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < nt; i++, n++, local++) {
        const gpt_param *p = gpt_tensor(m, i);
        snprintf(e[n].h.name, sizeof e[n].h.name, "%s", p->name);
        e[n].h.ndim = p->ndim;
        ckpt_hf_file_shape(m, p, e[n].h.shape);
        e[n].data = src + offs[i];
        e[n].key = entry_key(p->name, c->n_layer);
        e[n].idx = n;
    }
    ms_status st = MS_OK;
    for (int s = 1; st == MS_OK && s < comm_group_size(pp); s++)
        st = recv_stage(pp, s, e, &n, cap, c->n_layer);
    ckpt_st_writer *w = st == MS_OK ? ckpt_st_writer_create() : NULL;
    if (st == MS_OK && !w) st = ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    qsort(e, (size_t)n, sizeof *e, cmp_entry);
    ckpt_hf_conv cv = {.dtype = dtype};
    for (int i = 0; st == MS_OK && i < n; i++)
        st = ckpt_hf_add(w, &cv, e[i].h.name, (int)e[i].h.ndim, e[i].h.shape, e[i].data);
    if (st == MS_OK) st = ckpt_hf_finish(w, c, dtype, path);
    ckpt_st_writer_destroy(w);
    ckpt_hf_conv_free(&cv);
    for (int i = 0; i < n; i++) /* received data (entries past the local ones) */
        if (e[i].idx >= local) free((void *)e[i].data);
    free(e);
    return st;
}

ms_status ckpt_hf_save_pipeline(gpt_model *m, comm_group *pp, const char *path,
                                ckpt_st_dtype dtype) {
    be_backend *be = gpt_backend(m);
    size_t n = gpt_num_elements(m), *offs = malloc(sizeof(size_t) * (size_t)gpt_num_tensors(m));
    float *host = malloc(n * sizeof(float)), *full = NULL;
    ms_status st = MS_OK;
    if (!host || !offs) {
        st = ms_error(MS_ERR_NOMEM, "%s: out of memory staging weights", path);
        goto out;
    }
    be->to_host(be, host, gpt_params(m), n * sizeof(float));
    if (gpt_tp_size(m) > 1) {
        st = ckpt_hf_logical(m, host, &full, offs, path);
        if (st != MS_OK || !full) goto out; /* tp ranks other than 0 send nothing */
    } else {
        for (int i = 0; i < gpt_num_tensors(m); i++)
            offs[i] = gpt_tensor(m, i)->offset;
    }
    const float *src = full ? full : host;
    if (comm_group_rank(pp) == 0)
        st = write_all(m, pp, src, offs, path, dtype);
    else
        st = send_stage(m, pp, src, offs);
out:
    free(full);
    free(offs);
    free(host);
    return st;
}
