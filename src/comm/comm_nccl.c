/* comm_nccl.c - the NCCL implementation of the comm ops, for groups that
 * called comm_group_enable_nccl (see "NCCL" in comm.h).  Compiled only with
 * MS_HAVE_NCCL (comm_nccl_stub.c stands in otherwise); needs cudart and
 * nccl at link time.  This file: the ops and the watchdog's pass;
 * comm_nccl_group.c: enabling a group, freeing it, the watchdog thread.
 *
 * Per group: a non-blocking NCCL communicator (ncclConfig_t.blocking = 0,
 * so that no NCCL call can hang the host past a deadline: a call that
 * answers ncclInProgress is polled with ncclCommGetAsyncError until the op's
 * deadline), a dedicated NCCL stream, a "ready" event and a table of slots,
 * one per op in flight, each with a completion event.
 *
 * Starting a collective records "ready" on the caller's compute stream,
 * makes the NCCL stream wait for it, enqueues the NCCL call and records the
 * op's completion event.  Send/recv are only queued at start and launched
 * together in one ncclGroupStart/End at the first wait/test of one of them
 * or before the next collective (then "ready" covers the compute enqueued
 * up to the launch, a superset of what the op needs; it cannot deadlock,
 * since the compute stream only ever waits for NCCL ops launched earlier).
 * comm_wait makes the compute stream wait for the completion event
 * (cudaStreamWaitEvent), or with nccl_sync polls it on the host until the
 * deadline.  A slot is recycled once its op has been waited and its event
 * has been seen complete.
 *
 * Deadlines: a watchdog thread per group wakes every 50 ms, queries the
 * completion events of the ops in flight and the communicator's
 * asynchronous error, and looks on the arrival board for members that
 * exited before arriving (NCCL ops publish their sequence number there at
 * start, like MPI ops).  An op past its deadline, a dead member (for 1 s)
 * or an NCCL error aborts the communicator (ncclCommAbort: NCCL's kernels
 * return, so the streams drain) and breaks the world (comm_poison_locked):
 * every later op on any group fails with the message naming the op and the
 * group.  The watchdog is the only other thread making CUDA calls (it sets
 * the group's device); the communication thread makes none.
 *
 * Locking: n->mu guards the slots, the pending send/recv, the aborted
 * state, and every call on the communicator, the NCCL stream and the
 * events (w->mu may be taken inside it, never the other way).
 */
#ifdef MS_HAVE_NCCL

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/timeutil.h"
#include "comm/comm_nccl_internal.h"

#define COMM_NCCL_DEAD_AGE_S 0.5 /* look for dead members of ops older than this */

/* ---- checking wrappers --------------------------------------------------- */

/* The function name of a call expression ("cudaEventRecord(ev, s)"). */
static int comm_call_len(const char *call) {
    return (int)strcspn(call, "(");
}

ms_status comm_cu(cudaError_t e, const char *call, const char *what) {
    if (e == cudaSuccess) return MS_OK;
    return ms_error(MS_ERR_INTERNAL, "comm: %s: %.*s failed: %s (%s)", what, comm_call_len(call),
                    call, cudaGetErrorString(e), cudaGetErrorName(e));
}

ms_status comm_nc(ncclResult_t rc, const char *call, const char *what, ncclComm_t comm) {
    if (rc == ncclSuccess) return MS_OK;
    const char *last = ncclGetLastError(comm);
    return ms_error(MS_ERR_INTERNAL, "comm: %s: %.*s failed: %s%s%s", what, comm_call_len(call),
                    call, ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
}

void comm_cu_warn(cudaError_t e, const char *call, const char *what) {
    char keep[COMM_MSG_MAX];
    snprintf(keep, sizeof keep, "%s", ms_errmsg()); /* do not clobber the caller's message */
    if (comm_cu(e, call, what) != MS_OK) ms_warn("%s", ms_errmsg());
    ms_error(MS_OK, "%s", keep);
}

void comm_nc_warn(ncclResult_t rc, const char *call, const char *what) {
    char keep[COMM_MSG_MAX];
    snprintf(keep, sizeof keep, "%s", ms_errmsg());
    if (comm_nc(rc, call, what, NULL) != MS_OK) ms_warn("%s", ms_errmsg());
    ms_error(MS_OK, "%s", keep);
}

static ncclDataType_t comm_nccl_dtype(comm_dtype dt) {
    switch (dt) {
    case COMM_F32:
        return ncclFloat32;
    case COMM_F64:
        return ncclFloat64;
    case COMM_I32:
        return ncclInt32;
    case COMM_I64:
        return ncclInt64;
    case COMM_U8:
        return ncclUint8;
    case COMM_BF16:
        return ncclBfloat16;
    }
    ms_panic(__FILE__, __LINE__, "comm: bad dtype %d", (int)dt);
}

static ncclRedOp_t comm_nccl_op(comm_redop op) {
    switch (op) {
    case COMM_SUM:
        return ncclSum;
    case COMM_MAX:
        return ncclMax;
    case COMM_MIN:
        return ncclMin;
    }
    ms_panic(__FILE__, __LINE__, "comm: bad reduction op %d", (int)op);
}

static void comm_sleep_us(unsigned us) {
    struct timespec ts = {0, (long)us * 1000L};
    nanosleep(&ts, NULL);
}

/* Abort the communicator (n->mu held) and, if it is in service (not being
 * created or destroyed), break the world with msg. */
void comm_nccl_abort_locked(comm_nccl *n, ms_status code, const char *msg) {
    if (n->aborted) return;
    n->aborted = 1;
    n->err_code = code;
    snprintf(n->err_msg, sizeof n->err_msg, "%s", msg);
    if (n->comm) COMM_NC_WARN(n->g->name, ncclCommAbort(n->comm));
    n->comm = NULL;
    if (n->g->nccl != n) return;
    comm_world *w = n->g->w;
    pthread_mutex_lock(&w->mu);
    comm_poison_locked(w, code, msg);
    pthread_mutex_unlock(&w->mu);
}

/* The call `call` on the non-blocking communicator answered rc: if it is
 * ncclInProgress, poll until the communicator is ready, failed, or the
 * deadline passed.  A failure (at once or later) or a timeout aborts the
 * communicator (it can no longer be trusted) and breaks the world.  n->mu
 * held. */
ms_status comm_nccl_settle(comm_nccl *n, ncclResult_t rc, const char *call, const char *what,
                           double deadline) {
    if (rc == ncclSuccess) return MS_OK;
    if (rc != ncclInProgress) { /* the peers enqueued this op: they would wait for it */
        ms_status st = comm_nc(rc, call, what, n->comm);
        comm_nccl_abort_locked(n, st, ms_errmsg());
        return st;
    }
    unsigned us = 1;
    double t0 = ms_now();
    for (;;) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(n->comm, &a);
        if (q != ncclSuccess) a = q;
        if (a == ncclSuccess) return MS_OK;
        if (a != ncclInProgress) {
            ms_status st = comm_nc(a, call, what, n->comm);
            comm_nccl_abort_locked(n, st, ms_errmsg());
            return st;
        }
        double now = ms_now();
        if (now >= deadline) {
            char m[COMM_MSG_MAX];
            snprintf(m, sizeof m,
                     "comm: %s: %.*s still in progress after %.1f s (deadline passed); NCCL "
                     "communicator aborted",
                     what, comm_call_len(call), call, now - t0);
            comm_nccl_abort_locked(n, MS_ERR_TIMEOUT, m);
            return ms_error(MS_ERR_TIMEOUT, "%s", m);
        }
        comm_sleep_us(us);
        if (us < 1000) us *= 2;
    }
}

/* ---- device pointers, slots ---------------------------------------------- */

static int comm_nccl_is_dev(const void *p) {
    struct cudaPointerAttributes a;
    if (!p) return 0;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* not a CUDA pointer: clear the (non-sticky) error */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

int comm_nccl_wants(const comm_req *r) {
    if (!r->g->nccl || r->count == 0) return 0;
    switch (r->kind) {
    case COMM_K_ALLREDUCE:
    case COMM_K_REDUCE_SCATTER:
    case COMM_K_ALLGATHER:
        return comm_nccl_is_dev(r->send) && comm_nccl_is_dev(r->recv);
    case COMM_K_BCAST:
    case COMM_K_RECV:
        return comm_nccl_is_dev(r->recv);
    case COMM_K_SEND:
        return comm_nccl_is_dev(r->send);
    default:
        return 0;
    }
}

/* A free slot in *out (n->mu held): a free one, else one whose op was
 * waited and has completed since the watchdog last looked, else a new one
 * (the table grows by half, with its events). */
static ms_status comm_nccl_slot_get(comm_nccl *n, const char *what, int *out) {
    for (int i = 0; i < n->nslots; i++)
        if (!n->slots[i].busy) return *out = i, MS_OK;
    for (int i = 0; i < n->nslots; i++) {
        comm_nccl_slot *s = &n->slots[i];
        if (s->waited && !s->done && cudaEventQuery(s->ev) == cudaSuccess) {
            s->busy = 0;
            return *out = i, MS_OK;
        }
    }
    cudaGetLastError(); /* a failed query is the watchdog's to report */
    int grow = n->nslots >= 32 ? n->nslots / 2 : 16;
    comm_nccl_slot *s = realloc(n->slots, (size_t)(n->nslots + grow) * sizeof *s);
    if (!s) return ms_error(MS_ERR_NOMEM, "comm: %s: out of memory for NCCL op slots", what);
    n->slots = s;
    int first = n->nslots;
    for (int i = first; i < first + grow; i++) {
        memset(&s[i], 0, sizeof s[i]);
        MS_TRY(COMM_CU(what, cudaEventCreateWithFlags(&s[i].ev, cudaEventDisableTiming)));
        n->nslots = i + 1;
    }
    *out = first;
    return MS_OK;
}

/* Mark slot i in flight for r, after its event was recorded. */
static void comm_nccl_slot_fill(comm_nccl *n, int i, comm_req *r, const char *what) {
    comm_nccl_slot *s = &n->slots[i];
    s->busy = 1;
    s->waited = s->done = 0;
    s->t_start = r->t_start;
    s->deadline = r->deadline;
    s->t_dead_seen = 0;
    s->kind = r->kind;
    s->seq = r->seq;
    s->peer = r->peer;
    snprintf(s->desc, sizeof s->desc, "%s", what);
    r->nccl_slot = i;
}

/* Make the NCCL stream wait for the work enqueued on the compute stream. */
static ms_status comm_nccl_after_compute(comm_nccl *n, const char *what) {
    MS_TRY(COMM_CU(what, cudaEventRecord(n->ready, n->compute)));
    return COMM_CU(what, cudaStreamWaitEvent(n->stream, n->ready, 0));
}

static void comm_nccl_describe(const comm_req *r, char *buf, size_t len) {
    char d[224];
    comm_req_describe(r, d, sizeof d);
    snprintf(buf, len, "%s (nccl)", d);
}

/* Launch the pending send/recv in one NCCL group (n->mu held).  Their
 * slots are taken first, so that an op in flight always has one (a slot
 * that could not be had after the launch left an op on the stream whose
 * wait had returned: its buffer reused while NCCL wrote it).  A failure
 * once an op may be on the stream aborts the communicator (its ops end,
 * the world breaks); each pending op is finished with the error (its
 * comm_wait reports it). */
static ms_status comm_nccl_flush_locked(comm_nccl *n) {
    if (n->npending == 0) return MS_OK;
    char what[288];
    comm_nccl_describe(n->pending[0], what, sizeof what);
    ms_status st = MS_OK;
    int got = 0, *slot = calloc((size_t)n->npending, sizeof *slot);
    if (!slot) st = ms_error(MS_ERR_NOMEM, "comm: %s: out of memory", what);
    while (st == MS_OK && got < n->npending) {
        st = comm_nccl_slot_get(n, what, &slot[got]);
        if (st != MS_OK) break;
        comm_nccl_slot *q = &n->slots[slot[got++]]; /* reserved: filled below */
        q->busy = 1;
        q->waited = q->done = 0;
    }
    if (st == MS_OK) st = comm_nccl_after_compute(n, what);
    double deadline = n->pending[0]->deadline;
    if (st == MS_OK) {
        ncclResult_t rc = ncclGroupStart();
        for (int i = 0; i < n->npending && rc == ncclSuccess; i++) {
            comm_req *r = n->pending[i];
            ncclDataType_t t = comm_nccl_dtype(r->dt);
            if (r->kind == COMM_K_SEND)
                rc = ncclSend(r->send, r->count, t, r->peer, n->comm, n->stream);
            else
                rc = ncclRecv(r->recv, r->count, t, r->peer, n->comm, n->stream);
        }
        ncclResult_t end = ncclGroupEnd(); /* always closes the group */
        if (rc != ncclSuccess) {
            st = comm_nc(rc, "ncclSend/ncclRecv", what, n->comm);
            comm_nccl_abort_locked(n, st, ms_errmsg()); /* the group may be in progress */
        } else {
            st = comm_nccl_settle(n, end, "ncclGroupEnd", what, deadline);
        }
    }
    for (int i = 0; i < n->npending; i++) {
        comm_req *r = n->pending[i];
        char d[288];
        comm_nccl_describe(r, d, sizeof d);
        if (st == MS_OK) st = COMM_CU(d, cudaEventRecord(n->slots[slot[i]].ev, n->stream));
        if (st == MS_OK) {
            comm_nccl_slot_fill(n, slot[i], r, d);
            continue;
        }
        r->status = st;
        snprintf(r->msg, sizeof r->msg, "%s", ms_errmsg());
        r->state = COMM_REQ_DONE;
    }
    if (st != MS_OK) {
        for (int i = 0; i < got; i++) /* reserved and not filled */
            if (n->pending[i]->nccl_slot != slot[i]) n->slots[slot[i]].busy = 0;
        /* launched or not, the peers' matching ops would wait for these:
         * the world breaks, as for a failed collective */
        comm_nccl_abort_locked(n, st, ms_errmsg());
    }
    free(slot);
    n->npending = 0;
    return st;
}

/* Enqueue collective r on the NCCL stream (n->mu held). */
static ms_status comm_nccl_launch(comm_nccl *n, comm_req *r) {
    char what[288];
    comm_nccl_describe(r, what, sizeof what);
    int s = -1;
    MS_TRY(comm_nccl_slot_get(n, what, &s));
    MS_TRY(comm_nccl_after_compute(n, what));
    ncclDataType_t t = comm_nccl_dtype(r->dt);
    ncclResult_t rc = ncclSuccess;
    const char *call = "?";
    switch (r->kind) {
    case COMM_K_ALLREDUCE:
        call = "ncclAllReduce";
        rc = ncclAllReduce(r->send, r->recv, r->count, t, comm_nccl_op(r->op), n->comm, n->stream);
        break;
    case COMM_K_REDUCE_SCATTER:
        call = "ncclReduceScatter";
        rc = ncclReduceScatter(r->send, r->recv, r->count, t, comm_nccl_op(r->op), n->comm,
                               n->stream);
        break;
    case COMM_K_ALLGATHER:
        call = "ncclAllGather";
        rc = ncclAllGather(r->send, r->recv, r->count, t, n->comm, n->stream);
        break;
    case COMM_K_BCAST:
        call = "ncclBroadcast";
        rc = ncclBroadcast(r->recv, r->recv, r->count, t, r->root, n->comm, n->stream);
        break;
    default:
        ms_panic(__FILE__, __LINE__, "comm: kind %d is not an NCCL collective", (int)r->kind);
    }
    MS_TRY(comm_nccl_settle(n, rc, call, what, r->deadline));
    MS_TRY(COMM_CU(what, cudaEventRecord(n->slots[s].ev, n->stream)));
    comm_nccl_slot_fill(n, s, r, what);
    return MS_OK;
}

/* comm_nccl_launch, and on a failure the communicator aborted: r's
 * sequence number is taken and its arrival on the board, so the peers
 * enqueue the op and would wait for it (or, if this rank went on, match its
 * next op of that size with theirs: wrong data). */
static ms_status comm_nccl_launch_or_abort(comm_nccl *n, comm_req *r) {
    ms_status st = comm_nccl_launch(n, r);
    if (st != MS_OK) comm_nccl_abort_locked(n, st, ms_errmsg());
    return st;
}

ms_status comm_nccl_start(comm_req *r) {
    comm_nccl *n = r->g->nccl;
    int coll = r->kind != COMM_K_SEND && r->kind != COMM_K_RECV;
    ms_status st = comm_req_stamp(r, coll);
    if (st != MS_OK) {
        comm_req_free(r);
        return st;
    }
    r->on_nccl = 1;
    r->nccl_slot = -1;
    r->state = COMM_REQ_QUEUED;
    if (r->seq) comm_board_arrive(r->w, r->g, r->seq);
    pthread_mutex_lock(&n->mu);
    if (n->aborted) {
        char d[288];
        comm_nccl_describe(r, d, sizeof d);
        st =
            ms_error(n->err_code, "comm: %s refused: the group's NCCL communicator was aborted: %s",
                     d, n->err_msg);
    } else if (!coll) {
        if (n->npending == n->cap_pending) {
            int cap = n->cap_pending ? 2 * n->cap_pending : 16;
            comm_req **p = realloc(n->pending, (size_t)cap * sizeof *p);
            if (p) {
                n->pending = p;
                n->cap_pending = cap;
            }
        }
        if (n->npending < n->cap_pending)
            n->pending[n->npending++] = r;
        else
            st = ms_error(MS_ERR_NOMEM, "comm: out of memory for pending NCCL send/recv on '%s'",
                          r->g->name);
    } else {
        st = comm_nccl_flush_locked(n);
        if (st == MS_OK) st = comm_nccl_launch_or_abort(n, r);
    }
    pthread_mutex_unlock(&n->mu);
    if (st != MS_OK) comm_req_free(r);
    return st;
}

/* Mark r finished for comm_req_times (first time only). */
static void comm_nccl_mark_done(comm_req *r) {
    pthread_mutex_lock(&r->w->mu);
    if (r->state != COMM_REQ_DONE) {
        r->state = COMM_REQ_DONE;
        r->t_done = ms_now();
    }
    pthread_mutex_unlock(&r->w->mu);
}

/* Host-side wait for slot i until done or the deadline (n->mu held; it is
 * released while sleeping). */
static ms_status comm_nccl_poll_locked(comm_nccl *n, int i, const char *what) {
    unsigned us = 1;
    int max_us = n->g->w->poll_max_us;
    for (;;) {
        if (n->aborted)
            return ms_error(n->err_code, "comm: %s: NCCL communicator aborted: %s", what,
                            n->err_msg);
        comm_nccl_slot *s = &n->slots[i];
        cudaError_t e = cudaEventQuery(s->ev);
        if (e == cudaSuccess) {
            s->done = 1;
            return MS_OK;
        }
        if (e != cudaErrorNotReady) {
            ms_status st = comm_cu(e, "cudaEventQuery", what);
            comm_nccl_abort_locked(n, st, ms_errmsg());
            return st;
        }
        double now = ms_now();
        if (now >= s->deadline) {
            char m[COMM_MSG_MAX];
            snprintf(m, sizeof m,
                     "comm: %s timed out after %.1f s (limit %.1f s): not complete on the GPU; "
                     "NCCL communicator aborted",
                     what, now - s->t_start, s->deadline - s->t_start);
            comm_nccl_abort_locked(n, MS_ERR_TIMEOUT, m);
            return ms_error(MS_ERR_TIMEOUT, "%s", m);
        }
        pthread_mutex_unlock(&n->mu);
        comm_sleep_us(us);
        pthread_mutex_lock(&n->mu);
        if (us < (unsigned)max_us) us *= 2;
    }
}

ms_status comm_nccl_wait(comm_req *r) {
    comm_nccl *n = r->g->nccl;
    char what[288];
    comm_nccl_describe(r, what, sizeof what);
    ms_status st = MS_OK;
    pthread_mutex_lock(&n->mu);
    if (r->nccl_slot < 0 && r->state != COMM_REQ_DONE && !n->aborted)
        st = comm_nccl_flush_locked(n);
    int i = r->nccl_slot;
    if (r->state == COMM_REQ_DONE && r->status != MS_OK) {
        st = ms_error(r->status, "%s", r->msg); /* failed at launch */
    } else if (n->aborted) {
        st = ms_error(n->err_code, "comm: %s: NCCL communicator aborted: %s", what, n->err_msg);
    } else if (i < 0) {
        /* the flush failed: its message is set */
    } else if (r->w->nccl_sync) {
        st = comm_nccl_poll_locked(n, i, what);
    } else {
        st = COMM_CU(what, cudaStreamWaitEvent(n->compute, n->slots[i].ev, 0));
    }
    if (i >= 0) {
        comm_nccl_slot *s = &n->slots[i];
        s->waited = 1;
        if (s->done || n->aborted) s->busy = 0;
    }
    pthread_mutex_unlock(&n->mu);
    comm_req_free(r);
    return st;
}

ms_status comm_nccl_test(comm_req *r, int *done) {
    comm_nccl *n = r->g->nccl;
    char what[288];
    ms_status st = MS_OK;
    *done = 0;
    pthread_mutex_lock(&n->mu);
    if (r->nccl_slot < 0 && r->state != COMM_REQ_DONE && !n->aborted)
        st = comm_nccl_flush_locked(n);
    int i = r->nccl_slot;
    if (r->state == COMM_REQ_DONE || n->aborted || i < 0) {
        *done = 1; /* failed: comm_wait reports it */
        st = MS_OK;
    } else {
        cudaError_t e = cudaEventQuery(n->slots[i].ev);
        if (e == cudaSuccess) {
            n->slots[i].done = 1;
            *done = 1;
        } else if (e != cudaErrorNotReady) {
            comm_nccl_describe(r, what, sizeof what);
            st = comm_cu(e, "cudaEventQuery", what);
            comm_nccl_abort_locked(n, st, ms_errmsg());
            *done = 1;
        }
    }
    pthread_mutex_unlock(&n->mu);
    if (*done) comm_nccl_mark_done(r);
    return st;
}

/* ---- the watchdog -------------------------------------------------------- */

/* Slot i cannot finish: past its deadline or (dead) a member exited. */
static void comm_nccl_expire_locked(comm_nccl *n, int i, double now, int dead) {
    comm_nccl_slot *s = &n->slots[i];
    comm_world *w = n->g->w;
    comm_req tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.w = w;
    tmp.g = n->g;
    tmp.kind = s->kind;
    tmp.seq = s->seq;
    tmp.peer = s->peer;
    char b[COMM_MSG_MAX], m[COMM_MSG_MAX];
    comm_board_describe(w, &tmp, b, sizeof b);
    if (dead)
        snprintf(m, sizeof m,
                 "comm: %s cannot complete, a peer process exited (after %.1f s, timeout %.1f "
                 "s): %s; NCCL communicator aborted",
                 s->desc, now - s->t_start, s->deadline - s->t_start, b);
    else
        snprintf(m, sizeof m,
                 "comm: %s timed out after %.1f s (limit %.1f s; watchdog): %s; NCCL "
                 "communicator aborted",
                 s->desc, now - s->t_start, s->deadline - s->t_start, b);
    comm_nccl_abort_locked(n, MS_ERR_TIMEOUT, m);
}

/* One watchdog pass (n->mu held). */
void comm_nccl_watch_locked(comm_nccl *n) {
    if (n->aborted || !n->comm) return;
    comm_world *w = n->g->w;
    double now = ms_now();
    for (int i = 0; i < n->nslots; i++) {
        comm_nccl_slot *s = &n->slots[i];
        if (!s->busy || s->done) continue;
        cudaError_t e = cudaEventQuery(s->ev);
        if (e == cudaSuccess) {
            s->done = 1;
            if (s->waited) s->busy = 0;
            continue;
        }
        if (e != cudaErrorNotReady) {
            ms_status st = comm_cu(e, "cudaEventQuery (watchdog)", s->desc);
            comm_nccl_abort_locked(n, st, ms_errmsg());
            return;
        }
        if (now >= s->deadline) {
            comm_nccl_expire_locked(n, i, now, 0);
            return;
        }
        if (now - s->t_start < COMM_NCCL_DEAD_AGE_S) continue;
        comm_req tmp;
        memset(&tmp, 0, sizeof tmp);
        tmp.g = n->g;
        tmp.kind = s->kind;
        tmp.seq = s->seq;
        tmp.peer = s->peer;
        if (comm_board_dead_missing(w, &tmp) == 0) {
            s->t_dead_seen = 0;
        } else if (s->t_dead_seen == 0) {
            s->t_dead_seen = now;
        } else if (now - s->t_dead_seen >= COMM_DEAD_GRACE_S) {
            comm_nccl_expire_locked(n, i, now, 1);
            return;
        }
    }
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(n->comm, &a) == ncclSuccess && a != ncclSuccess &&
        a != ncclInProgress) {
        char what[96];
        snprintf(what, sizeof what, "NCCL communicator of group '%s' (watchdog)", n->g->name);
        ms_status st = comm_nc(a, "ncclCommGetAsyncError", what, n->comm);
        comm_nccl_abort_locked(n, st, ms_errmsg());
    }
}

#else
typedef int comm_nccl_not_built; /* ISO C wants something in a translation unit */
#endif
