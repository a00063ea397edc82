/* comm_ops.c - the public op calls: argument checks, building a request and
 * handing it to its path (comm_dispatch): NCCL (comm_nccl.c) when the group
 * has NCCL and the buffers are device memory, otherwise staging device
 * buffers (comm_stage.c) and queueing it for the communication thread
 * (comm_submit); and the waiting side (comm_wait / comm_wait_all /
 * comm_test) with its backstop for a communication thread stuck inside a
 * blocking MPI call and the copy back of staged results.  See comm.h.
 *
 * Requests come from a per-world free list (no allocation per op once warm)
 * and go back to it in comm_wait.  Thread-safe (w->mu).
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/events.h"
#include "base/timeutil.h"
#include "comm/comm_internal.h"

#define COMM_TAG_MAX 32767 /* the smallest MPI_TAG_UB MPI guarantees */

const char *comm_kind_name(comm_kind k) {
    static const char *names[] = {"all_reduce",   "reduce_scatter", "all_gather", "broadcast",
                                  "send",         "recv",           "barrier",    "group_split",
                                  "group_create", "group_free"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

void comm_req_describe(const comm_req *r, char *buf, size_t n) {
    const comm_group *g = r->g;
    const char *k = comm_kind_name(r->kind);
    switch (r->kind) {
    case COMM_K_SEND:
    case COMM_K_RECV:
        snprintf(buf, n, "%s %s rank %d (global %d) tag %d (%zu x %s) on group '%s' (%d ranks)", k,
                 r->kind == COMM_K_SEND ? "to" : "from", r->peer, g->global[r->peer], r->tag,
                 r->count, comm_dtype_name(r->dt), g->name, g->size);
        break;
    case COMM_K_BARRIER:
    case COMM_K_SPLIT:
    case COMM_K_CREATE:
    case COMM_K_FREE:
        snprintf(buf, n, "%s #%llu on group '%s' (%d ranks)", k, (unsigned long long)r->seq,
                 g->name, g->size);
        break;
    default:
        snprintf(buf, n, "%s #%llu (%zu x %s) on group '%s' (%d ranks)", k,
                 (unsigned long long)r->seq, r->count, comm_dtype_name(r->dt), g->name, g->size);
    }
}

comm_req *comm_req_alloc(comm_world *w) {
    pthread_mutex_lock(&w->mu);
    comm_req *r = w->free_list;
    if (r) w->free_list = r->next;
    pthread_mutex_unlock(&w->mu);
    if (!r) r = malloc(sizeof *r);
    if (!r) return NULL;
    memset(r, 0, sizeof *r);
    r->w = w;
    return r;
}

/* Return r to the free list (w->mu held). */
static void comm_req_release_locked(comm_world *w, comm_req *r) {
    r->next = w->free_list;
    w->free_list = r;
}

void comm_req_free(comm_req *r) {
    comm_world *w = r->w;
    comm_stage_release(w, r);
    pthread_mutex_lock(&w->mu);
    comm_req_release_locked(w, r);
    pthread_mutex_unlock(&w->mu);
}

/* The refusal of r in a broken world (w->mu held). */
static ms_status comm_refuse_locked(comm_world *w, const comm_req *r) {
    char d[256];
    comm_req_describe(r, d, sizeof d);
    return ms_error(w->poison_code, "comm: %s refused: world broken by an earlier failure: %s", d,
                    w->poison_msg);
}

ms_status comm_req_stamp(comm_req *r, int collective) {
    comm_world *w = r->w;
    pthread_mutex_lock(&w->mu);
    if (w->poisoned) {
        ms_status st = comm_refuse_locked(w, r);
        pthread_mutex_unlock(&w->mu);
        return st;
    }
    if (collective) r->seq = ++r->g->next_seq;
    r->t_start = ms_now();
    r->deadline = r->t_start + w->timeout_s;
    pthread_mutex_unlock(&w->mu);
    return MS_OK;
}

/* Hand a stamped request to the comm thread.  When that thread is not in
 * MPI (w->mpi_mu free) and nothing is queued ahead, post it here: the call
 * (a send's first fragment, a receive's match) happens now, on this core,
 * instead of when the comm thread is next scheduled - on cores shared with
 * other ranks that wait was up to milliseconds on a pipeline's critical
 * path.  The comm thread still drives it to completion.  Group creation
 * and splits (blocking MPI calls) always go through the queue. */
static void comm_enqueue(comm_req *r) {
    comm_world *w = r->w;
    int direct =
        w->thread_started && r->kind <= COMM_K_BARRIER && pthread_mutex_trylock(&w->mpi_mu) == 0;
    pthread_mutex_lock(&w->mu);
    r->state = COMM_REQ_QUEUED;
    r->next = NULL;
    if (direct && (w->q_head || w->poisoned || w->stop)) {
        pthread_mutex_unlock(&w->mpi_mu);
        direct = 0;
    }
    if (!direct) {
        if (w->q_tail)
            w->q_tail->next = r;
        else
            w->q_head = r;
        w->q_tail = r;
        pthread_cond_signal(&w->submit_cv);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    pthread_mutex_unlock(&w->mu);
    comm_post_batch(w, r); /* r may be finished (and recycled) once this returns */
    pthread_mutex_unlock(&w->mpi_mu);
    pthread_mutex_lock(&w->mu);
    w->kicked = 1;
    pthread_cond_signal(&w->submit_cv);
    pthread_mutex_unlock(&w->mu);
}

ms_status comm_submit(comm_req *r, int collective) {
    ms_status st = comm_req_stamp(r, collective);
    if (st != MS_OK) {
        comm_req_free(r);
        return st;
    }
    comm_enqueue(r);
    return MS_OK;
}

/* Start a built request on its path and hand it to the caller: NCCL, or
 * MPI after staging its device buffers.  A broken world is refused before
 * anything is copied.  On failure r is freed. */
static ms_status comm_dispatch(comm_req *r, int collective, comm_req **req) {
    if (r->g->nccl && comm_nccl_wants(r)) {
        MS_TRY(comm_nccl_start(r));
        *req = r;
        return MS_OK;
    }
    comm_world *w = r->w;
    ms_status st = MS_OK;
    pthread_mutex_lock(&w->mu);
    if (w->poisoned) st = comm_refuse_locked(w, r);
    pthread_mutex_unlock(&w->mu);
    if (st == MS_OK) st = comm_stage_prepare(r);
    if (st == MS_OK) st = comm_req_stamp(r, collective);
    if (st != MS_OK) {
        comm_req_free(r);
        return st;
    }
    comm_enqueue(r);
    *req = r;
    return MS_OK;
}

/* Checks shared by every op; fn names the op in messages. */
static ms_status comm_check_common(const char *fn, const comm_group *g, size_t count, comm_dtype dt,
                                   int reduce, comm_redop op, comm_req **req) {
    if (!g || !req) return ms_error(MS_ERR_ARG, "%s: NULL group or handle pointer", fn);
    *req = NULL;
    if ((unsigned)dt > COMM_BF16)
        return ms_error(MS_ERR_ARG, "%s on group '%s': bad dtype %d", fn, g->name, (int)dt);
    if (count > INT_MAX)
        return ms_error(MS_ERR_ARG, "%s on group '%s': count %zu exceeds INT_MAX elements", fn,
                        g->name, count);
    if (reduce && (unsigned)op > COMM_MIN)
        return ms_error(MS_ERR_ARG, "%s on group '%s': bad reduction op %d", fn, g->name, (int)op);
    return MS_OK;
}

/* Do [a, a+na) and [b, b+nb) overlap? */
static int comm_overlap(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* Allocate and fill the common fields of a request. */
static ms_status comm_req_new(comm_group *g, comm_kind kind, size_t count, comm_dtype dt,
                              comm_req **out) {
    comm_req *r = comm_req_alloc(g->w);
    if (!r) return ms_error(MS_ERR_NOMEM, "comm: out of memory for a request on '%s'", g->name);
    r->g = g;
    r->kind = kind;
    r->count = count;
    r->dt = dt;
    *out = r;
    return MS_OK;
}

ms_status comm_allreduce_start(comm_group *g, const void *send, void *recv, size_t count,
                               comm_dtype dt, comm_redop op, comm_req **req) {
    static const char *fn = "comm_allreduce_start";
    MS_TRY(comm_check_common(fn, g, count, dt, 1, op, req));
    size_t bytes = count * comm_dtype_size(dt);
    if (count && (!send || !recv))
        return ms_error(MS_ERR_ARG, "%s on group '%s': NULL buffer", fn, g->name);
    if (send != recv && comm_overlap(send, bytes, recv, bytes))
        return ms_error(MS_ERR_ARG, "%s on group '%s': send and recv overlap (not in place)", fn,
                        g->name);
    comm_req *r = NULL;
    MS_TRY(comm_req_new(g, COMM_K_ALLREDUCE, count, dt, &r));
    r->send = send;
    r->recv = recv;
    r->op = op;
    r->inplace = send == recv;
    return comm_dispatch(r, 1, req);
}

ms_status comm_reduce_scatter_start(comm_group *g, const void *send, void *recv, size_t count,
                                    comm_dtype dt, comm_redop op, comm_req **req) {
    static const char *fn = "comm_reduce_scatter_start";
    MS_TRY(comm_check_common(fn, g, count, dt, 1, op, req));
    size_t es = comm_dtype_size(dt), bytes = count * es;
    if (count && (!send || !recv))
        return ms_error(MS_ERR_ARG, "%s on group '%s': NULL buffer", fn, g->name);
    int inplace = count && (const char *)recv == (const char *)send + (size_t)g->rank * bytes;
    if (!inplace && comm_overlap(send, bytes * (size_t)g->size, recv, bytes))
        return ms_error(MS_ERR_ARG,
                        "%s on group '%s': recv overlaps send but is not send + rank*count "
                        "(rank %d)",
                        fn, g->name, g->rank);
    comm_req *r = NULL;
    MS_TRY(comm_req_new(g, COMM_K_REDUCE_SCATTER, count, dt, &r));
    r->send = send;
    r->recv = recv;
    r->op = op;
    r->inplace = inplace;
    return comm_dispatch(r, 1, req);
}

ms_status comm_allgather_start(comm_group *g, const void *send, void *recv, size_t count,
                               comm_dtype dt, comm_req **req) {
    static const char *fn = "comm_allgather_start";
    MS_TRY(comm_check_common(fn, g, count, dt, 0, COMM_SUM, req));
    size_t bytes = count * comm_dtype_size(dt);
    if (count && (!send || !recv))
        return ms_error(MS_ERR_ARG, "%s on group '%s': NULL buffer", fn, g->name);
    int inplace = count && (const char *)send == (const char *)recv + (size_t)g->rank * bytes;
    if (!inplace && comm_overlap(send, bytes, recv, bytes * (size_t)g->size))
        return ms_error(MS_ERR_ARG,
                        "%s on group '%s': send overlaps recv but is not recv + rank*count "
                        "(rank %d)",
                        fn, g->name, g->rank);
    comm_req *r = NULL;
    MS_TRY(comm_req_new(g, COMM_K_ALLGATHER, count, dt, &r));
    r->send = send;
    r->recv = recv;
    r->inplace = inplace;
    return comm_dispatch(r, 1, req);
}

ms_status comm_broadcast_start(comm_group *g, void *buf, size_t count, comm_dtype dt, int root,
                               comm_req **req) {
    static const char *fn = "comm_broadcast_start";
    MS_TRY(comm_check_common(fn, g, count, dt, 0, COMM_SUM, req));
    if (root < 0 || root >= g->size)
        return ms_error(MS_ERR_ARG, "%s on group '%s': root %d not in [0, %d)", fn, g->name, root,
                        g->size);
    if (count && !buf) return ms_error(MS_ERR_ARG, "%s on group '%s': NULL buffer", fn, g->name);
    comm_req *r = NULL;
    MS_TRY(comm_req_new(g, COMM_K_BCAST, count, dt, &r));
    r->recv = buf;
    r->root = root;
    return comm_dispatch(r, 1, req);
}

/* Shared by send and recv. */
static ms_status comm_p2p_start(const char *fn, comm_kind kind, comm_group *g, const void *sbuf,
                                void *rbuf, size_t count, comm_dtype dt, int peer, int tag,
                                comm_req **req) {
    MS_TRY(comm_check_common(fn, g, count, dt, 0, COMM_SUM, req));
    if (peer < 0 || peer >= g->size)
        return ms_error(MS_ERR_ARG, "%s on group '%s': peer %d not in [0, %d)", fn, g->name, peer,
                        g->size);
    if (tag < 0 || tag > COMM_TAG_MAX)
        return ms_error(MS_ERR_ARG, "%s on group '%s': tag %d not in [0, %d]", fn, g->name, tag,
                        COMM_TAG_MAX);
    if (count && !sbuf && !rbuf)
        return ms_error(MS_ERR_ARG, "%s on group '%s': NULL buffer", fn, g->name);
    comm_req *r = NULL;
    MS_TRY(comm_req_new(g, kind, count, dt, &r));
    r->send = sbuf;
    r->recv = rbuf;
    r->peer = peer;
    r->tag = tag;
    return comm_dispatch(r, 0, req);
}

ms_status comm_send_start(comm_group *g, const void *buf, size_t count, comm_dtype dt, int peer,
                          int tag, comm_req **req) {
    return comm_p2p_start("comm_send_start", COMM_K_SEND, g, buf, NULL, count, dt, peer, tag, req);
}

ms_status comm_recv_start(comm_group *g, void *buf, size_t count, comm_dtype dt, int peer, int tag,
                          comm_req **req) {
    return comm_p2p_start("comm_recv_start", COMM_K_RECV, g, NULL, buf, count, dt, peer, tag, req);
}

ms_status comm_barrier_start(comm_group *g, comm_req **req) {
    MS_TRY(comm_check_common("comm_barrier_start", g, 0, COMM_U8, 0, COMM_SUM, req));
    comm_req *r = NULL;
    MS_TRY(comm_req_new(g, COMM_K_BARRIER, 0, COMM_U8, &r));
    return comm_dispatch(r, 1, req);
}

/* pthread_cond_timedwait on the monotonic clock for `seconds`. */
static void comm_wait_cv(comm_world *w, double seconds) {
    struct timespec ts = ms_deadline(CLOCK_MONOTONIC, seconds);
    pthread_cond_timedwait(&w->done_cv, &w->mu, &ts);
}

/* The comm thread did not answer by the deadline (+ grace): it is stuck
 * in a blocking MPI call.  Give r up (w->mu held) and break the world. */
static ms_status comm_abandon_locked(comm_world *w, comm_req *r, double now) {
    char d[256], b[COMM_MSG_MAX], msg[COMM_MSG_MAX];
    comm_req_describe(r, d, sizeof d);
    comm_board_describe(w, r, b, sizeof b);
    snprintf(msg, sizeof msg,
             "comm: %s timed out after %.1f s (limit %.1f s; communication thread blocked): %s", d,
             now - r->t_start, r->deadline - r->t_start, b);
    r->abandoned = 1; /* the comm thread frees it if it ever finishes */
    comm_poison_locked(w, MS_ERR_TIMEOUT, msg);
    return ms_error(MS_ERR_TIMEOUT, "%s", msg);
}

/* The caller blocked in comm_wait on r from t0 until now: a "wait" span on
 * the caller's lane naming the op (w->mu held; r not yet recycled). */
static void comm_wait_event(const comm_req *r, int64_t t0) {
    const comm_group *g = r->g;
    if (r->kind > COMM_K_BARRIER) return;
    ms_ev_args a = {.has = MS_EV_OP | MS_EV_GROUP | MS_EV_BYTES,
                    .op = r->w->ev_kind[r->kind],
                    .group = g->ev_name,
                    .bytes = (int64_t)(r->count * comm_dtype_size(r->dt))};
    if (r->seq) a.has |= MS_EV_SEQ, a.seq = (int64_t)r->seq;
    if (r->kind == COMM_K_SEND || r->kind == COMM_K_RECV)
        a.has |= MS_EV_PEER | MS_EV_TAG, a.peer = g->global[r->peer], a.tag = r->tag;
    ms_ev_span(r->w->ev_wait, 0, t0, ms_ev_now(), &a);
}

ms_status comm_wait(comm_req *r) {
    return comm_wait_result(r, NULL);
}

/* comm_wait_result of a host (MPI) op. */
static ms_status comm_wait_host(comm_req *r, comm_group **out) {
    comm_world *w = r->w;
    pthread_mutex_lock(&w->mu);
    int64_t t_wait = r->state != COMM_REQ_DONE && ms_ev_on() ? ms_ev_now() : 0;
    int waiting = r->state != COMM_REQ_DONE;
    if (waiting) { /* wake a backed-off comm thread: this caller's core is idle now */
        w->n_waiting++;
        w->hard_poll_until = ms_now() + COMM_HARD_POLL_S;
        pthread_cond_signal(&w->submit_cv);
    }
    while (r->state != COMM_REQ_DONE) {
        double now = ms_now(), limit = r->deadline + COMM_WAIT_GRACE_S;
        if (w->poisoned && w->t_poisoned + COMM_WAIT_GRACE_S < limit)
            limit = w->t_poisoned + COMM_WAIT_GRACE_S;
        /* the comm thread is not stuck: it writes the timeout's report (comm_timeout) */
        if (w->reporting_until > limit) limit = w->reporting_until;
        if (now >= limit) {
            if (waiting) w->n_waiting--;
            ms_status st = comm_abandon_locked(w, r, now);
            pthread_mutex_unlock(&w->mu);
            return st;
        }
        comm_wait_cv(w, limit - now);
    }
    if (waiting) w->n_waiting--;
    ms_status st = r->status;
    if (out) *out = r->out;
    if (t_wait) comm_wait_event(r, t_wait);
    char msg[COMM_MSG_MAX];
    if (st != MS_OK) snprintf(msg, sizeof msg, "%s", r->msg);
    comm_stage_hold h;
    comm_stage_take(r, &h);
    comm_req_release_locked(w, r);
    pthread_mutex_unlock(&w->mu);
    comm_stage_finish(w, &h, st); /* the copy back to the device, on this thread */
    return st == MS_OK ? MS_OK : ms_error(st, "%s", msg);
}

static _Thread_local long long thread_wait_ns; /* comm_thread_wait_ns */

long long comm_thread_wait_ns(void) {
    return thread_wait_ns;
}

static _Thread_local int thread_background; /* comm_thread_set_background */

void comm_thread_set_background(int on) {
    thread_background = on != 0;
}

/* A free slot of w->wait_since, now holding t0, negated for a background thread's wait
 * (-1: none free). */
static int wait_slot_take(comm_world *w, int64_t t0) {
    long long v = t0 > 0 ? t0 : 1;
    for (int i = 0; w && i < COMM_WAIT_SLOTS; i++) {
        long long free_slot = 0;
        if (atomic_compare_exchange_strong(&w->wait_since[i], &free_slot,
                                           thread_background ? -v : v))
            return i;
    }
    return -1;
}

int comm_world_wait_begin(comm_world *w, const char *where, int peer) {
    int slot = wait_slot_take(w, ms_ev_now());
    if (slot >= 0) {
        atomic_store(&w->wait_peer[slot], peer);
        atomic_store(&w->wait_where[slot], where);
    }
    return slot;
}

void comm_world_wait_peer(comm_world *w, int token, int peer) {
    if (w && token >= 0 && token < COMM_WAIT_SLOTS) atomic_store(&w->wait_peer[token], peer);
}

void comm_world_wait_end(comm_world *w, int token) {
    if (!w || token < 0 || token >= COMM_WAIT_SLOTS) return;
    atomic_store(&w->wait_where[token], NULL); /* before the slot is free for another */
    atomic_store(&w->wait_since[token], 0);
}

ms_status comm_wait_result(comm_req *r, comm_group **out) {
    if (!r) return MS_OK;
    comm_world *w = r->w; /* r is freed by the wait */
    /* a group op's group may be gone after the wait (COMM_K_FREE frees it) */
    comm_group *g = r->kind == COMM_K_FREE || r->kind == COMM_K_CREATE || r->kind == COMM_K_SPLIT
                        ? NULL
                        : r->g;
    int64_t t0 = ms_ev_now();
    int slot = wait_slot_take(w, t0); /* this wait is seen by comm_world_blocked_s */
    ms_status st = r->on_nccl ? comm_nccl_wait(r) : comm_wait_host(r, out);
    comm_world_wait_end(w, slot);
    long long dt = (long long)(ms_ev_now() - t0);
    atomic_fetch_add_explicit(&w->wait_ns, dt, memory_order_relaxed);
    if (g) atomic_fetch_add_explicit(&g->wait_ns, dt, memory_order_relaxed);
    thread_wait_ns += dt;
    return st;
}

ms_status comm_wait_all(comm_req **reqs, int n) {
    ms_status first = MS_OK;
    char msg[COMM_MSG_MAX] = "";
    for (int i = 0; i < n; i++) {
        ms_status st = comm_wait(reqs[i]);
        reqs[i] = NULL;
        if (st != MS_OK && first == MS_OK) {
            first = st;
            snprintf(msg, sizeof msg, "%s", ms_errmsg());
        }
    }
    return first == MS_OK ? MS_OK : ms_error(first, "%s", msg);
}

ms_status comm_test(comm_req *r, int *done) {
    if (!r) {
        *done = 1;
        return MS_OK;
    }
    if (r->on_nccl) return comm_nccl_test(r, done);
    pthread_mutex_lock(&r->w->mu);
    *done = r->state == COMM_REQ_DONE;
    pthread_mutex_unlock(&r->w->mu);
    return MS_OK;
}

void comm_req_times(const comm_req *r, double *t_start, double *t_done) {
    pthread_mutex_lock(&r->w->mu);
    if (t_start) *t_start = r->t_start;
    if (t_done) *t_done = r->state == COMM_REQ_DONE ? r->t_done : 0;
    pthread_mutex_unlock(&r->w->mu);
}

ms_status comm_allreduce(comm_group *g, const void *send, void *recv, size_t count, comm_dtype dt,
                         comm_redop op) {
    comm_req *r = NULL;
    MS_TRY(comm_allreduce_start(g, send, recv, count, dt, op, &r));
    return comm_wait(r);
}

ms_status comm_reduce_scatter(comm_group *g, const void *send, void *recv, size_t count,
                              comm_dtype dt, comm_redop op) {
    comm_req *r = NULL;
    MS_TRY(comm_reduce_scatter_start(g, send, recv, count, dt, op, &r));
    return comm_wait(r);
}

ms_status comm_allgather(comm_group *g, const void *send, void *recv, size_t count, comm_dtype dt) {
    comm_req *r = NULL;
    MS_TRY(comm_allgather_start(g, send, recv, count, dt, &r));
    return comm_wait(r);
}

ms_status comm_broadcast(comm_group *g, void *buf, size_t count, comm_dtype dt, int root) {
    comm_req *r = NULL;
    MS_TRY(comm_broadcast_start(g, buf, count, dt, root, &r));
    return comm_wait(r);
}

ms_status comm_send(comm_group *g, const void *buf, size_t count, comm_dtype dt, int peer,
                    int tag) {
    comm_req *r = NULL;
    MS_TRY(comm_send_start(g, buf, count, dt, peer, tag, &r));
    return comm_wait(r);
}

ms_status comm_recv(comm_group *g, void *buf, size_t count, comm_dtype dt, int peer, int tag) {
    comm_req *r = NULL;
    MS_TRY(comm_recv_start(g, buf, count, dt, peer, tag, &r));
    return comm_wait(r);
}

ms_status comm_barrier(comm_group *g) {
    comm_req *r = NULL;
    MS_TRY(comm_barrier_start(g, &r));
    return comm_wait(r);
}
