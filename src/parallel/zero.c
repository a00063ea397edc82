/* zero.c - bucketed reduce-scatter / all-gather around the model's hooks. */
#include "parallel/zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"

typedef struct {
    size_t begin, end, count; /* bucket range; count = (end-begin)/dp */
    comm_req *rs, *ag;        /* outstanding reduce-scatter / all-gather */
} bucket;

struct par_zero {
    gpt_model *m;
    comm_group *dp;
    int size, rank;
    bucket *b;
    int nb;
    int armed;
    int overlap; /* par_zero_set_overlap */
    double wait_sec; /* time blocked in waits since par_zero_take_wait */
    ms_status err;   /* first failure seen inside a hook */
    char errmsg[1024];
};

static void keep_error(par_zero *z, ms_status st) {
    if (st != MS_OK && z->err == MS_OK) {
        z->err = st;
        snprintf(z->errmsg, sizeof z->errmsg, "%s", ms_errmsg());
    }
}

static bucket *find(par_zero *z, size_t begin) {
    for (int i = 0; i < z->nb; i++)
        if (z->b[i].begin == begin) return &z->b[i];
    MS_CHECKF(0, "no bucket starts at %zu", begin);
    return NULL;
}

/* Grad hook: this bucket's gradients are final on this rank. */
static void on_grads(void *ctx, size_t begin, size_t end) {
    par_zero *z = ctx;
    if (!z->armed || z->err) return;
    bucket *b = find(z, begin);
    float *g = gpt_grads(z->m) + b->begin;
    keep_error(z, comm_reduce_scatter_start(z->dp, g, g + (size_t)z->rank * b->count, b->count,
                                            COMM_F32, COMM_SUM, &b->rs));
    (void)end;
}

/* Param hook: the forward pass is about to read this bucket's weights. */
static void on_params(void *ctx, size_t begin, size_t end) {
    par_zero *z = ctx;
    bucket *b = find(z, begin);
    if (b->ag) {
        double t0 = ms_now();
        keep_error(z, comm_wait(b->ag));
        z->wait_sec += ms_now() - t0;
        b->ag = NULL;
        /* the act-dtype copy of these weights (a no-op on fp32 backends) */
        if (z->err == MS_OK) gpt_params_range_updated(z->m, b->begin, b->end);
    }
    (void)end;
}

ms_status par_zero_create(par_zero **out, gpt_model *m, comm_group *dp) {
    *out = NULL;
    par_zero *z = calloc(1, sizeof *z);
    int L = gpt_get_config(m)->n_layer;
    size_t *bounds = malloc(sizeof(size_t) * 2 * (size_t)(L + 2));
    if (!z || !bounds) {
        free(z);
        free(bounds);
        return ms_error(MS_ERR_NOMEM, "zero: out of memory");
    }
    z->m = m;
    z->dp = dp;
    z->overlap = 1;
    z->size = comm_group_size(dp);
    z->rank = comm_group_rank(dp);
    z->nb = gpt_grad_ranges(m, bounds, L + 2);
    z->b = calloc((size_t)z->nb, sizeof *z->b);
    ms_status st = z->b ? MS_OK : ms_error(MS_ERR_NOMEM, "zero: out of memory");
    for (int i = 0; st == MS_OK && i < z->nb; i++) {
        bucket *b = &z->b[i];
        b->begin = bounds[2 * i];
        b->end = bounds[2 * i + 1];
        if ((b->end - b->begin) % ((size_t)z->size * 16) != 0)
            st = ms_error(MS_ERR_ARG,
                          "zero: bucket [%zu, %zu) does not split into %d aligned shards "
                          "(create the model with gpt_create_aligned)",
                          b->begin, b->end, z->size);
        b->count = (b->end - b->begin) / (size_t)z->size;
    }
    free(bounds);
    if (st != MS_OK) {
        par_zero_destroy(z);
        return st;
    }
    gpt_set_grad_hook(m, on_grads, z);
    gpt_set_param_hook(m, on_params, z);
    *out = z;
    return MS_OK;
}

void par_zero_destroy(par_zero *z) {
    if (!z) return;
    for (int i = 0; z->b && i < z->nb; i++) { /* drain, ignoring errors */
        if (z->b[i].rs) comm_wait(z->b[i].rs);
        if (z->b[i].ag) comm_wait(z->b[i].ag);
    }
    gpt_set_grad_hook(z->m, NULL, NULL);
    gpt_set_param_hook(z->m, NULL, NULL);
    free(z->b);
    free(z);
}

comm_group *par_zero_group(const par_zero *z) {
    return z->dp;
}
int par_zero_num_shards(const par_zero *z) {
    return z->nb;
}

void par_zero_shard(const par_zero *z, int i, size_t *begin, size_t *end) {
    const bucket *b = &z->b[i];
    *begin = b->begin + (size_t)z->rank * b->count;
    *end = *begin + b->count;
}

void par_zero_set_overlap(par_zero *z, int on) {
    z->overlap = on;
}

void par_zero_arm(par_zero *z) {
    z->armed = 1;
}

static ms_status take_error(par_zero *z) {
    if (z->err == MS_OK) return MS_OK;
    ms_status st = z->err;
    z->err = MS_OK;
    return ms_error(st, "%s", z->errmsg);
}

ms_status par_zero_reduce_wait(par_zero *z) {
    double t0 = ms_now();
    z->armed = 0;
    for (int i = 0; i < z->nb; i++) {
        if (!z->b[i].rs) continue;
        keep_error(z, comm_wait(z->b[i].rs));
        z->b[i].rs = NULL;
    }
    z->wait_sec += ms_now() - t0;
    return take_error(z);
}

ms_status par_zero_gather_start(par_zero *z) {
    float *w = gpt_params(z->m);
    for (int i = 0; i < z->nb && z->err == MS_OK; i++) {
        bucket *b = &z->b[i];
        keep_error(z, comm_allgather_start(z->dp, w + b->begin + (size_t)z->rank * b->count,
                                           w + b->begin, b->count, COMM_F32, &b->ag));
    }
    return take_error(z);
}

double par_zero_take_wait(par_zero *z) {
    double w = z->wait_sec;
    z->wait_sec = 0;
    return w;
}

ms_status par_zero_gather_wait_all(par_zero *z) {
    for (int i = 0; i < z->nb; i++) {
        if (!z->b[i].ag) continue;
        keep_error(z, comm_wait(z->b[i].ag));
        z->b[i].ag = NULL;
    }
    if (z->err == MS_OK) gpt_params_updated(z->m);
    return take_error(z);
}
