/* comm_stage.c - MPI ops on device buffers, staged through pinned host
 * memory (see "Device buffers over MPI" in comm.h).
 *
 * comm_stage_prepare runs in comm_*_start on the caller's thread: for each
 * buffer of the op that the backend's is_device hook calls device memory it
 * takes a pinned buffer from the pool, copies in what MPI will read
 * (to_host), and points the request at the pinned buffer, so the
 * communication thread sees host memory only.  comm_stage_finish runs in
 * comm_wait on the caller's thread: it copies what MPI wrote back to the
 * device (to_device) and returns the buffers to the pool.  Per op, for each
 * of its buffers that is device memory (n = count * element size):
 *
 *   op              pinned buffers         copied in (start)   copied back (wait)
 *   all_reduce      send n, recv n         send                recv
 *     in place      one of n               the buffer          the buffer
 *   reduce_scatter  send size*n, recv n    send                recv
 *     in place      one of size*n          all of it           the rank's block
 *   all_gather      send n, recv size*n    send                recv
 *     in place      one of size*n          the rank's block    all of it
 *   broadcast       one of n               on the root         on the others
 *   send            one of n               the buffer          -
 *   recv            one of n               -                   what arrived (also
 *                                                              for a short message)
 *
 * Mixed ops (a host send and a device recv, or the reverse) stage only the
 * device side.
 *
 * The pool: size class 0 holds 4 KiB buffers; above that a class holds
 * buffers of m * 2^(k-2) bytes for m = 5..8 (four steps per power of two,
 * so a buffer is at most 25 % larger than asked).  Each class is a free
 * list; a request that finds its class empty allocates one more buffer of
 * exactly the class size (outside the lock), so the pool grows only to the
 * peak number of buffers of each class in use at once and then stays put.
 * Buffers go back at comm_wait, and are freed by comm_world_finalize (or
 * comm_world_set_device).  A buffer of an op that failed in a broken world
 * may still be inside MPI: it is dropped (counted in stage_lost), never
 * reused or freed.  Thread-safe (w->stage_mu).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "comm/comm_internal.h"

#define COMM_STAGE_MIN_LOG2 12 /* class 0: 4 KiB */

/* Size class of an n-byte request and its buffer size. */
static int comm_stage_class(size_t n, size_t *cap) {
    if (n <= ((size_t)1 << COMM_STAGE_MIN_LOG2)) {
        *cap = (size_t)1 << COMM_STAGE_MIN_LOG2;
        return 0;
    }
    int k = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n <= 2^(k+1) */
    size_t step = (size_t)1 << (k - 2);
    size_t m = (n + step - 1) / step; /* 5..8 */
    *cap = m * step;
    return 4 * (k - COMM_STAGE_MIN_LOG2) + (int)(m - 5) + 1;
}

/* A pinned buffer of at least n bytes, from the pool or new; NULL (with the
 * message set) if the allocation fails. */
static comm_stage_buf *comm_stage_get(comm_world *w, size_t n, const comm_req *r) {
    size_t cap = 0;
    int cls = comm_stage_class(n, &cap);
    MS_CHECK(cls < COMM_STAGE_CLASSES);
    pthread_mutex_lock(&w->stage_mu);
    comm_stage_buf *b = w->stage_free[cls];
    if (b) w->stage_free[cls] = b->next;
    pthread_mutex_unlock(&w->stage_mu);
    if (b) return b;
    b = calloc(1, sizeof *b);
    void *p = b ? w->dev.host_alloc(w->dev.ctx, cap) : NULL;
    if (!p) {
        char d[256];
        free(b);
        comm_req_describe(r, d, sizeof d);
        ms_error(MS_ERR_NOMEM, "comm: %s: cannot allocate %zu bytes of pinned staging memory", d,
                 cap);
        return NULL;
    }
    b->p = p;
    b->cap = cap;
    b->cls = cls;
    pthread_mutex_lock(&w->stage_mu);
    w->stage_pinned += cap;
    w->stage_nbuf++;
    pthread_mutex_unlock(&w->stage_mu);
    return b;
}

static void comm_stage_put(comm_world *w, comm_stage_buf *b) {
    if (!b) return;
    pthread_mutex_lock(&w->stage_mu);
    b->next = w->stage_free[b->cls];
    w->stage_free[b->cls] = b;
    pthread_mutex_unlock(&w->stage_mu);
}

void comm_stage_release(comm_world *w, comm_req *r) {
    for (int i = 0; i < 2; i++) {
        comm_stage_put(w, r->stage[i]);
        r->stage[i] = NULL;
    }
    r->stage_out = NULL;
}

static int comm_is_dev(comm_world *w, const void *p) {
    return p && w->dev.is_device(w->dev.ctx, p);
}

/* Take buffer slot i of r with n bytes; NULL on failure. */
static char *comm_stage_take_buf(comm_req *r, int i, size_t n) {
    comm_stage_buf *b = comm_stage_get(r->w, n, r);
    r->stage[i] = b;
    return b ? b->p : NULL;
}

/* Stage an out-of-place pair: send (sn bytes) and recv (rn bytes), each
 * only if it is device memory. */
static ms_status comm_stage_pair(comm_req *r, size_t sn, size_t rn) {
    comm_world *w = r->w;
    if (comm_is_dev(w, r->send)) {
        char *s = comm_stage_take_buf(r, 0, sn);
        if (!s) return MS_ERR_NOMEM;
        w->dev.to_host(w->dev.ctx, s, r->send, sn);
        r->send = s;
    }
    if (comm_is_dev(w, r->recv)) {
        char *d = comm_stage_take_buf(r, 1, rn);
        if (!d) return MS_ERR_NOMEM;
        r->stage_out = r->recv;
        r->stage_bytes = rn;
        r->recv = d;
    }
    return MS_OK;
}

/* In-place layouts and single-buffer ops. */
static ms_status comm_stage_single(comm_req *r, size_t n, size_t gs) {
    comm_world *w = r->w;
    size_t off = (size_t)r->g->rank * n;
    char *s = NULL;
    switch (r->kind) {
    case COMM_K_ALLREDUCE: /* in place: one buffer, in and out */
        if (!comm_is_dev(w, r->recv)) return MS_OK;
        if (!(s = comm_stage_take_buf(r, 0, n))) return MS_ERR_NOMEM;
        w->dev.to_host(w->dev.ctx, s, r->recv, n);
        r->stage_out = r->recv;
        r->stage_bytes = n;
        r->send = r->recv = s;
        return MS_OK;
    case COMM_K_REDUCE_SCATTER: /* in place: recv = send + rank*n */
        if (!comm_is_dev(w, r->send)) return MS_OK;
        if (!(s = comm_stage_take_buf(r, 0, gs * n))) return MS_ERR_NOMEM;
        w->dev.to_host(w->dev.ctx, s, r->send, gs * n);
        r->stage_out = r->recv;
        r->stage_bytes = n;
        r->send = s;
        r->recv = s + off;
        return MS_OK;
    case COMM_K_ALLGATHER: /* in place: send = recv + rank*n */
        if (!comm_is_dev(w, r->recv)) return MS_OK;
        if (!(s = comm_stage_take_buf(r, 0, gs * n))) return MS_ERR_NOMEM;
        w->dev.to_host(w->dev.ctx, s + off, r->send, n);
        r->stage_out = r->recv;
        r->stage_bytes = gs * n;
        r->recv = s;
        r->send = s + off;
        return MS_OK;
    case COMM_K_BCAST:
        if (!comm_is_dev(w, r->recv)) return MS_OK;
        if (!(s = comm_stage_take_buf(r, 0, n))) return MS_ERR_NOMEM;
        if (r->root == r->g->rank) {
            w->dev.to_host(w->dev.ctx, s, r->recv, n);
        } else {
            r->stage_out = r->recv;
            r->stage_bytes = n;
        }
        r->recv = s;
        return MS_OK;
    case COMM_K_SEND:
        return comm_stage_pair(r, n, 0);
    case COMM_K_RECV:
        return comm_stage_pair(r, 0, n);
    default:
        return MS_OK; /* no buffers */
    }
}

ms_status comm_stage_prepare(comm_req *r) {
    comm_world *w = r->w;
    if (!w->has_dev || r->count == 0) return MS_OK;
    size_t n = r->count * comm_dtype_size(r->dt), gs = (size_t)r->g->size;
    ms_status st;
    if (r->kind == COMM_K_ALLREDUCE && !r->inplace)
        st = comm_stage_pair(r, n, n);
    else if (r->kind == COMM_K_REDUCE_SCATTER && !r->inplace)
        st = comm_stage_pair(r, gs * n, n);
    else if (r->kind == COMM_K_ALLGATHER && !r->inplace)
        st = comm_stage_pair(r, n, gs * n);
    else
        st = comm_stage_single(r, n, gs);
    if (st != MS_OK) comm_stage_release(w, r);
    return st;
}

void comm_stage_take(comm_req *r, comm_stage_hold *h) {
    h->buf[0] = r->stage[0];
    h->buf[1] = r->stage[1];
    h->out = r->stage_out;
    h->src = r->recv;
    h->bytes = r->stage_bytes;
    if (r->kind == COMM_K_RECV && h->out) h->bytes = r->got * comm_dtype_size(r->dt);
    r->stage[0] = r->stage[1] = NULL;
    r->stage_out = NULL;
}

void comm_stage_finish(comm_world *w, comm_stage_hold *h, ms_status st) {
    if (!h->buf[0] && !h->buf[1]) return;
    if (h->out && h->bytes && (st == MS_OK || st == MS_ERR_RANGE))
        w->dev.to_device(w->dev.ctx, h->out, h->src, h->bytes);
    if (st != MS_OK && st != MS_ERR_RANGE && comm_world_broken(w)) {
        /* The MPI request may never have completed: leave it its memory. */
        pthread_mutex_lock(&w->stage_mu);
        for (int i = 0; i < 2; i++)
            if (h->buf[i]) {
                w->stage_lost++;
                free(h->buf[i]); /* the header only; the pinned memory stays */
            }
        pthread_mutex_unlock(&w->stage_mu);
        return;
    }
    comm_stage_put(w, h->buf[0]);
    comm_stage_put(w, h->buf[1]);
}

int comm_stage_pool_free(comm_world *w) {
    int n = 0;
    pthread_mutex_lock(&w->stage_mu);
    for (int c = 0; c < COMM_STAGE_CLASSES; c++) {
        comm_stage_buf *b = w->stage_free[c];
        while (b) {
            comm_stage_buf *next = b->next;
            w->dev.host_free(w->dev.ctx, b->p);
            w->stage_pinned -= b->cap;
            w->stage_nbuf--;
            free(b);
            n++;
            b = next;
        }
        w->stage_free[c] = NULL;
    }
    pthread_mutex_unlock(&w->stage_mu);
    return n;
}
