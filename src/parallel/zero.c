/* zero.c - bucketed reduce-scatter / all-gather around the model's hooks.
 *
 * Order of the ops on the DP group (the same on every rank, as the
 * communicator requires): the reduce-scatters in the order the grad hook
 * reports the buckets (ln_f, wte's classifier part, block L-1 .. 0, wpe),
 * then the two all-gathers of wte's lookup rows (ids, rows); after the
 * optimiser's norm sums, one all-gather per bucket in forward order.
 *
 * wte's bucket (the largest, and the one whose reduction ends the
 * backward) is reduce-scattered by an exchange instead of the MPI
 * collective when the group has no NCCL: each peer's shard sent to it,
 * the peers' partial sums of this rank's shard received into a scratch
 * buffer, and the sum formed at par_zero_reduce_wait on the caller's
 * thread, in rank order.  Open MPI's non-blocking reduce-scatter of
 * 2 x 77 MB (GPT-2's wte, dp 2) took 60-100 ms on two cores, summing on one
 * rank's communication thread while that rank's compute waited for the
 * core; the exchange moves the same bytes in 11-15 ms and the add takes
 * 5-8 ms.  With two ranks the sum a + b is the collective's bits; with
 * more it is a fixed order (both --overlap modes use it). */
#include "parallel/zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"

typedef struct {
    size_t begin, end, count; /* bucket range; count = (end-begin)/dp */
    comm_req *rs, *ag;        /* outstanding reduce-scatter / all-gather */
    /* the exchange (wte's bucket without NCCL; NULL: the collective):
     * peer p's partial sum of this rank's shard arrives in scratch slot
     * p - (p > rank); xr[p] receives it, xr[size + p] sends p its shard */
    float *scratch;
    comm_req **xr;
    int xpending; /* the exchange of this step was started: sum it */
    int started;  /* when its reduction was started this step (1, 2, ...; 0: not) */
} bucket;

#define XCHG_TAG 29

struct par_zero {
    gpt_model *m;
    be_backend *be;
    comm_group *dp;
    int size, rank;
    bucket *b; /* in forward order (gpt_grad_ranges): shard i is bucket i's */
    int nb;
    int armed;
    int n_started;   /* reductions started this step (bucket.started) */
    int overlap;     /* par_zero_set_overlap */
    double wait_sec; /* time blocked in waits since par_zero_take_wait */
    ms_status err;   /* first failure seen inside a hook */
    char errmsg[1024];
    /* wte's lookup rows (gpt_set_rows_hook; rows_max 0: the model keeps
     * one gradient and wte's bucket is reduced whole) */
    int rows_max, C;
    bucket *wte;       /* the bucket holding wte alone */
    size_t wte_off;    /* wte's element offset */
    int32_t *ids_mine; /* (rows_max) host: this rank's ids, -1 after the last */
    int32_t *ids_all;  /* (size, rows_max) host */
    float *rows_all;   /* (size, rows_max, C) f32 backend */
    comm_req *ids_ag, *rows_ag;
    int rows_pending; /* the rows of this step were exchanged: add them */
};

static void keep_error(par_zero *z, ms_status st) {
    if (st != MS_OK && z->err == MS_OK) {
        z->err = st;
        snprintf(z->errmsg, sizeof z->errmsg, "%s", ms_errmsg());
    }
}

/* The first failure inside wte's exchange says which collective it was
 * part of: its own ops are a send and a receive per peer, and "recv from
 * rank 1 tag 29" alone would not tell a user that the data parallel
 * reduce-scatter of the gradients is what stalled (err: z->err before). */
static void name_xchg_error(par_zero *z, ms_status err) {
    if (err != MS_OK || z->err == MS_OK) return;
    char m[sizeof z->errmsg];
    snprintf(m, sizeof m, "%s", z->errmsg);
    snprintf(z->errmsg, sizeof z->errmsg,
             "data parallel reduce-scatter of wte's gradient (one send and one receive per "
             "peer): %s",
             m);
}

/* Wait for *req (if any), counting the time blocked; clears *req. */
static void wait_op(par_zero *z, comm_req **req) {
    if (!*req) return;
    double t0 = ms_now();
    keep_error(z, comm_wait(*req));
    z->wait_sec += ms_now() - t0;
    *req = NULL;
}

/* 1 if bucket b lies inside [begin, end): the model reports spans of whole
 * buckets (one, or the pipeline's embedding span: wte and wpe). */
static int in_span(const bucket *b, size_t begin, size_t end) {
    return b->begin >= begin && b->end <= end;
}

/* Where peer p's partial sum of this rank's shard of b arrives. */
static float *xchg_slot(const par_zero *z, const bucket *b, int p) {
    return b->scratch + (size_t)(p - (p > z->rank)) * b->count;
}

/* Start the exchange reduce-scatter of bucket b (gradients g). */
static void xchg_start(par_zero *z, bucket *b, float *g) {
    ms_status err = z->err;
    for (int p = 0; p < z->size && z->err == MS_OK; p++) {
        if (p == z->rank) continue;
        keep_error(z, comm_recv_start(z->dp, xchg_slot(z, b, p), b->count, COMM_F32, p, XCHG_TAG,
                                      &b->xr[p]));
        if (z->err == MS_OK)
            keep_error(z, comm_send_start(z->dp, g + (size_t)p * b->count, b->count, COMM_F32, p,
                                          XCHG_TAG, &b->xr[z->size + p]));
    }
    b->xpending = 1;
    for (int i = 0; !z->overlap && i < 2 * z->size; i++)
        wait_op(z, &b->xr[i]);
    name_xchg_error(z, err);
}

/* Finish bucket b's exchange: this rank's shard = the sum in rank order
 * of every rank's partial sum of it (its own in place). */
static void xchg_finish(par_zero *z, bucket *b) {
    ms_status err = z->err;
    for (int i = 0; i < 2 * z->size; i++)
        wait_op(z, &b->xr[i]);
    name_xchg_error(z, err);
    int pending = b->xpending;
    b->xpending = 0;
    if (!pending || z->err != MS_OK) return;
    be_backend *be = z->be;
    float *own = gpt_grads(z->m) + b->begin + (size_t)z->rank * b->count;
    /* rank 0 first: the sum accumulates in its term (own, or rank 0's slot) */
    float *acc = z->rank == 0 ? own : b->scratch;
    for (int r = 1; r < z->size; r++)
        be->add_f32(be, acc, r == z->rank ? own : xchg_slot(z, b, r), b->count);
    if (acc != own) be->copy(be, own, acc, b->count * sizeof(float));
}

/* Grad hook: the gradients of the buckets in [begin, end) are final on
 * this rank (for wte while the rows hook is set: its classifier part). */
static void on_grads(void *ctx, size_t begin, size_t end) {
    par_zero *z = ctx;
    if (!z->armed || z->err) return;
    int hit = 0;
    for (int i = 0; i < z->nb; i++) {
        bucket *b = &z->b[i];
        if (!in_span(b, begin, end)) continue;
        hit = 1;
        b->started = ++z->n_started;
        float *g = gpt_grads(z->m) + b->begin;
        if (b->xr) {
            xchg_start(z, b, g);
        } else {
            keep_error(z, comm_reduce_scatter_start(z->dp, g, g + (size_t)z->rank * b->count,
                                                    b->count, COMM_F32, COMM_SUM, &b->rs));
            if (!z->overlap) wait_op(z, &b->rs);
        }
    }
    MS_CHECKF(hit, "zero: no bucket inside the gradient span [%zu, %zu)", begin, end);
}

/* Rows hook: this micro-batch's lookup rows of wte (ids ascending, rows
 * rows_max x C with zeros past n): every rank's, to every rank. */
static void on_rows(void *ctx, const int32_t *ids, int n, const float *rows) {
    par_zero *z = ctx;
    if (!z->armed || z->err) return;
    memcpy(z->ids_mine, ids, sizeof(int32_t) * (size_t)n);
    for (int j = n; j < z->rows_max; j++)
        z->ids_mine[j] = -1;
    size_t R = (size_t)z->rows_max;
    keep_error(z, comm_allgather_start(z->dp, z->ids_mine, z->ids_all, R, COMM_I32, &z->ids_ag));
    if (z->err == MS_OK)
        keep_error(z, comm_allgather_start(z->dp, rows, z->rows_all, R * (size_t)z->C, COMM_F32,
                                           &z->rows_ag));
    if (!z->overlap) {
        wait_op(z, &z->ids_ag);
        wait_op(z, &z->rows_ag);
    }
    z->rows_pending = 1;
}

/* Param hook: the forward pass is about to read the buckets in [begin, end). */
static void on_params(void *ctx, size_t begin, size_t end) {
    par_zero *z = ctx;
    for (int i = 0; i < z->nb; i++) {
        bucket *b = &z->b[i];
        if (!b->ag || !in_span(b, begin, end)) continue;
        wait_op(z, &b->ag);
        /* the act-dtype copy of these weights (a no-op on fp32 backends) */
        if (z->err == MS_OK) gpt_params_range_updated(z->m, b->begin, b->end);
    }
}

/* wte's bucket reduce-scatters by exchange (see the top) when wte is alone
 * in it and the group has no NCCL. */
static ms_status setup_xchg(par_zero *z) {
    int t = gpt_find(z->m, "wte.weight");
    if (t < 0 || z->size < 2 || comm_group_has_nccl(z->dp)) return MS_OK;
    const gpt_param *p = gpt_tensor(z->m, t);
    for (int i = 0; i < z->nb; i++) {
        bucket *b = &z->b[i];
        if (b->begin != p->offset || b->end < p->offset + p->numel) continue;
        int tw = gpt_find(z->m, "wpe.weight");
        if (tw >= 0 && gpt_tensor(z->m, tw)->offset >= b->begin &&
            gpt_tensor(z->m, tw)->offset < b->end)
            return MS_OK; /* not alone: the collective */
        b->xr = calloc(2 * (size_t)z->size, sizeof *b->xr);
        b->scratch = z->be->alloc(z->be, sizeof(float) * (size_t)(z->size - 1) * b->count);
        if (!b->xr || !b->scratch)
            return ms_error(MS_ERR_NOMEM, "zero: cannot allocate %.1f MB for wte's reduce-scatter",
                            4.0 * (double)(z->size - 1) * b->count / 1e6);
    }
    return MS_OK;
}

/* The lookup-row exchange: the wte bucket holding wte alone, and buffers. */
static ms_status setup_rows(par_zero *z) {
    z->rows_max = gpt_rows_max(z->m);
    int t = gpt_find(z->m, "wte.weight");
    if (z->rows_max == 0 || t < 0) {
        z->rows_max = 0;
        return MS_OK;
    }
    const gpt_param *p = gpt_tensor(z->m, t);
    z->wte_off = p->offset;
    z->C = p->local[1];
    for (int i = 0; i < z->nb; i++)
        if (z->b[i].begin <= p->offset && p->offset < z->b[i].end) z->wte = &z->b[i];
    int tw = gpt_find(z->m, "wpe.weight"); /* the model pads wte to a range of its own */
    MS_CHECKF(z->wte && z->wte->begin == p->offset &&
                  (tw < 0 || gpt_tensor(z->m, tw)->offset >= z->wte->end),
              "zero: wte at %zu is not alone in its bucket", p->offset);
    size_t R = (size_t)z->rows_max;
    z->ids_mine = malloc(sizeof(int32_t) * R);
    z->ids_all = malloc(sizeof(int32_t) * R * (size_t)z->size);
    z->rows_all = z->be->alloc(z->be, sizeof(float) * R * (size_t)z->C * (size_t)z->size);
    if (!z->ids_mine || !z->ids_all || !z->rows_all)
        return ms_error(MS_ERR_NOMEM, "zero: cannot allocate %.1f MB for the embedding rows",
                        4.0 * (double)R * z->C * z->size / 1e6);
    return MS_OK;
}

ms_status par_zero_create(par_zero **out, gpt_model *m, comm_group *dp) {
    *out = NULL;
    par_zero *z = calloc(1, sizeof *z);
    int L = gpt_get_config(m)->n_layer;
    size_t *bounds = malloc(sizeof(size_t) * 2 * (size_t)(L + 3));
    if (!z || !bounds) {
        free(z);
        free(bounds);
        return ms_error(MS_ERR_NOMEM, "zero: out of memory");
    }
    z->m = m;
    z->be = gpt_backend(m);
    z->dp = dp;
    z->overlap = 1;
    z->size = comm_group_size(dp);
    z->rank = comm_group_rank(dp);
    z->nb = gpt_grad_ranges(m, bounds, L + 3);
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
    if (st == MS_OK) st = setup_rows(z);
    if (st == MS_OK) st = setup_xchg(z);
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
        bucket *b = &z->b[i];
        if (b->rs) comm_wait(b->rs);
        if (b->ag) comm_wait(b->ag);
        for (int k = 0; b->xr && k < 2 * z->size; k++)
            if (b->xr[k]) comm_wait(b->xr[k]);
        free(b->xr);
        if (b->scratch) z->be->free(z->be, b->scratch);
    }
    if (z->ids_ag) comm_wait(z->ids_ag);
    if (z->rows_ag) comm_wait(z->rows_ag);
    gpt_set_grad_hook(z->m, NULL, NULL);
    gpt_set_param_hook(z->m, NULL, NULL);
    gpt_set_rows_hook(z->m, NULL, NULL);
    if (z->rows_all) z->be->free(z->be, z->rows_all);
    free(z->ids_mine);
    free(z->ids_all);
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
    if (z->rows_max) gpt_set_rows_hook(z->m, on_rows, z);
}

static ms_status take_error(par_zero *z) {
    if (z->err == MS_OK) return MS_OK;
    ms_status st = z->err;
    z->err = MS_OK;
    return ms_error(st, "%s", z->errmsg);
}

/* Add every rank's lookup rows (in rank order, so each element sums the
 * same terms in the same order on every run) to this rank's shard of
 * wte's reduced gradient.  A row [wte + id*C, +C) may straddle the shard's
 * ends: only its overlap is added. */
static void add_rows(par_zero *z) {
    size_t lo, hi, R = (size_t)z->rows_max, C = (size_t)z->C;
    par_zero_shard(z, (int)(z->wte - z->b), &lo, &hi);
    float *g = gpt_grads(z->m);
    for (int k = 0; k < z->size; k++)
        for (size_t j = 0; j < R; j++) {
            int32_t id = z->ids_all[(size_t)k * R + j];
            if (id < 0) break; /* ascending, then -1 */
            size_t e0 = z->wte_off + (size_t)id * C, e1 = e0 + C;
            size_t a = e0 > lo ? e0 : lo, b = e1 < hi ? e1 : hi;
            if (a < b)
                z->be->add_f32(z->be, g + a, z->rows_all + ((size_t)k * R + j) * C + (a - e0),
                               b - a);
        }
}

ms_status par_zero_reduce_wait(par_zero *z) {
    z->armed = 0;
    gpt_set_rows_hook(z->m, NULL, NULL);
    /* in the order they were started: the first to miss its deadline is
     * then the first error kept (the later ones only say the world broke) */
    for (int k = 1; k <= z->n_started; k++)
        for (int i = 0; i < z->nb; i++) {
            bucket *b = &z->b[i];
            if (b->started != k) continue;
            wait_op(z, &b->rs);
            if (b->xr) xchg_finish(z, b);
            b->started = 0;
        }
    z->n_started = 0;
    for (int i = 0; i < z->nb; i++) /* a failed hook may have started some without a mark */
        wait_op(z, &z->b[i].rs);
    wait_op(z, &z->ids_ag);
    wait_op(z, &z->rows_ag);
    if (z->rows_pending && z->err == MS_OK) add_rows(z);
    z->rows_pending = 0;
    return take_error(z);
}

ms_status par_zero_gather_shard(par_zero *z, int i) {
    MS_CHECKF(i >= 0 && i < z->nb, "zero: shard %d of %d", i, z->nb);
    bucket *b = &z->b[i];
    float *w = gpt_params(z->m);
    if (z->err == MS_OK)
        keep_error(z, comm_allgather_start(z->dp, w + b->begin + (size_t)z->rank * b->count,
                                           w + b->begin, b->count, COMM_F32, &b->ag));
    if (!z->overlap && b->ag) {
        wait_op(z, &b->ag);
        if (z->err == MS_OK) gpt_params_range_updated(z->m, b->begin, b->end);
    }
    return take_error(z);
}

ms_status par_zero_gather_start(par_zero *z) {
    for (int i = 0; i < z->nb; i++)
        MS_TRY(par_zero_gather_shard(z, i));
    return MS_OK;
}

double par_zero_take_wait(par_zero *z) {
    double w = z->wait_sec;
    z->wait_sec = 0;
    return w;
}

ms_status par_zero_gather_wait_all(par_zero *z) {
    for (int i = 0; i < z->nb; i++)
        wait_op(z, &z->b[i].ag);
    if (z->err == MS_OK) gpt_params_updated(z->m);
    return take_error(z);
}
