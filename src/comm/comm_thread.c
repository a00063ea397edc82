/* comm_thread.c - the communication thread: takes submitted requests in
 * order, posts the MPI non-blocking calls, drives MPI_Testsome so that ops
 * progress while the caller computes, finishes requests (waking waiters),
 * and enforces deadlines: an op past its deadline, or one waiting for a
 * peer whose process exited (seen on the arrival board), fails with
 * MS_ERR_TIMEOUT and breaks the world (comm_poison_locked).
 *
 * Started by comm_world_init, stopped by comm_world_finalize.  After init,
 * MPI is called under w->mpi_mu only (hence MPI_THREAD_SERIALIZED): by this
 * thread, and by a caller that posts its own request when the thread is
 * not in MPI and nothing is queued ahead of it (comm_enqueue): a send then
 * leaves when it is submitted, not when this thread next gets a core.
 * Idle, the thread sleeps on w->submit_cv (waking every 200 ms for the
 * heartbeat); with ops in flight it polls with a short exponential
 * back-off (<= poll_max_us).
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/timeutil.h"
#include "comm/comm_internal.h"

#define COMM_IDLE_WAKE_S 0.2
#define COMM_DEAD_CHECK_S 0.2 /* how often to look for exited peers */
#define COMM_DEAD_MIN_AGE_S 0.5

/* Wait on cv (w->mu held) for at most `seconds` (CLOCK_MONOTONIC cv). */
static void comm_cv_wait_s(pthread_cond_t *cv, pthread_mutex_t *mu, double seconds) {
    struct timespec ts = ms_deadline(CLOCK_MONOTONIC, seconds);
    pthread_cond_timedwait(cv, mu, &ts);
}

void comm_poison_locked(comm_world *w, ms_status code, const char *msg) {
    if (!w->poisoned) {
        w->poisoned = 1;
        w->t_poisoned = ms_now();
        w->poison_code = code;
        snprintf(w->poison_msg, sizeof w->poison_msg, "%s", msg);
        ms_errorf("%s", msg);
    }
    pthread_cond_broadcast(&w->done_cv);
    pthread_cond_broadcast(&w->submit_cv);
}

/* Mark r finished (status/msg already set) and wake its waiter. */
static void comm_finish(comm_world *w, comm_req *r) {
    r->t_done = ms_now();
    comm_events_finish(w, r); /* its span, before the waiter may recycle r */
    pthread_mutex_lock(&w->mu);
    r->state = COMM_REQ_DONE;
    if (r->abandoned) {
        r->next = w->free_list;
        w->free_list = r;
    }
    pthread_cond_broadcast(&w->done_cv);
    pthread_mutex_unlock(&w->mu);
}

/* Finish r (status and msg set); a collective breaks the world with its message: the op's
 * peers wait for this rank in it, and the group's collectives would pair off one apart from
 * here on.  (A point-to-point op's failure is its own: a receive too small for its message,
 * MPI_ERR_TRUNCATE, took the message; a send not posted leaves its peer to time out.) */
static void comm_finish_failed(comm_world *w, comm_req *r) {
    pthread_mutex_lock(&w->mu);
    if (r->kind != COMM_K_SEND && r->kind != COMM_K_RECV) comm_poison_locked(w, r->status, r->msg);
    pthread_mutex_unlock(&w->mu);
    comm_finish(w, r);
}

/* Fail r with an MPI error from `call` (posting it, or as it completed). */
static void comm_finish_mpi_error(comm_world *w, comm_req *r, int rc, const char *call) {
    char d[256], e[MPI_MAX_ERROR_STRING + 64];
    comm_req_describe(r, d, sizeof d);
    comm_mpi_errstr(rc, call, e, sizeof e);
    r->status = MS_ERR_INTERNAL;
    snprintf(r->msg, sizeof r->msg, "comm: %s: %s", d, e);
    comm_finish_failed(w, r);
}

static int comm_active_reserve(comm_world *w) {
    if (w->nactive < w->cap) return 0;
    int cap = w->cap ? 2 * w->cap : 64;
    comm_req **a = realloc(w->active, (size_t)cap * sizeof *a);
    if (a) w->active = a;
    MPI_Request *m = realloc(w->mreqs, (size_t)cap * sizeof *m);
    if (m) w->mreqs = m;
    int *ix = realloc(w->idx, (size_t)cap * sizeof *ix);
    if (ix) w->idx = ix;
    MPI_Status *s = realloc(w->sts, (size_t)cap * sizeof *s);
    if (s) w->sts = s;
    if (!a || !m || !ix || !s) return -1;
    w->cap = cap;
    return 0;
}

/* Post r's non-blocking MPI call; returns the MPI return code. */
static int comm_post_one(comm_req *r, const char **call) {
    MPI_Datatype t = comm_mpi_dtype(r->dt);
    MPI_Comm c = r->g->comm;
    int n = (int)r->count;
    switch (r->kind) {
    case COMM_K_ALLREDUCE:
        *call = "MPI_Iallreduce";
        return MPI_Iallreduce(r->inplace ? MPI_IN_PLACE : r->send, r->recv, n, t,
                              comm_mpi_op(r->w, r->dt, r->op), c, &r->mreq);
    case COMM_K_REDUCE_SCATTER:
        /* In place, MPI reads the whole buffer and leaves the result at its
         * start; comm_complete moves it to this rank's block. */
        *call = "MPI_Ireduce_scatter_block";
        if (r->inplace)
            return MPI_Ireduce_scatter_block(MPI_IN_PLACE, (void *)r->send, n, t,
                                             comm_mpi_op(r->w, r->dt, r->op), c, &r->mreq);
        return MPI_Ireduce_scatter_block(r->send, r->recv, n, t, comm_mpi_op(r->w, r->dt, r->op), c,
                                         &r->mreq);
    case COMM_K_ALLGATHER:
        *call = "MPI_Iallgather";
        if (r->inplace)
            return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, r->recv, n, t, c, &r->mreq);
        return MPI_Iallgather(r->send, n, t, r->recv, n, t, c, &r->mreq);
    case COMM_K_BCAST:
        *call = "MPI_Ibcast";
        return MPI_Ibcast(r->recv, n, t, r->root, c, &r->mreq);
    case COMM_K_SEND:
        *call = "MPI_Isend";
        return MPI_Isend(r->send, n, t, r->peer, r->tag, c, &r->mreq);
    case COMM_K_RECV:
        *call = "MPI_Irecv";
        return MPI_Irecv(r->recv, n, t, r->peer, r->tag, c, &r->mreq);
    case COMM_K_BARRIER:
        *call = "MPI_Ibarrier";
        return MPI_Ibarrier(c, &r->mreq);
    case COMM_K_SPLIT:
        /* Phase 1 of a split: a non-blocking barrier on the parent, under
         * the deadline and the dead-peer checks like any op; the blocking
         * MPI_Comm_split runs when every member has arrived. */
        *call = "MPI_Ibarrier (before MPI_Comm_split)";
        return MPI_Ibarrier(c, &r->mreq);
    default:
        break;
    }
    ms_panic(__FILE__, __LINE__, "comm: kind %d is not a non-blocking op", (int)r->kind);
}

/* Bytes of the op's largest buffer: what MPI moves, to within a factor of
 * the group size. */
static size_t comm_req_bytes(const comm_req *r) {
    size_t n = r->count * comm_dtype_size(r->dt);
    if (r->kind == COMM_K_REDUCE_SCATTER || r->kind == COMM_K_ALLGATHER) n *= (size_t)r->g->size;
    return n;
}

/* Extend w->stream_until by r, just posted or still active: ops move one
 * after another, so a large op's time adds to what is still streaming. */
static void comm_stream_add(comm_world *w, const comm_req *r) {
    size_t n = comm_req_bytes(r);
    if (n < COMM_STREAM_MIN_BYTES) return;
    double from = r->t_posted + COMM_HARD_POLL_S;
    if (w->stream_until > from) from = w->stream_until;
    w->stream_until = from + (double)n / COMM_STREAM_MIN_RATE;
}

static void comm_fail_all(comm_world *w, comm_req *batch);

/* Post every request of the batch, in submission order (w->mpi_mu held).  A collective that
 * cannot be posted breaks the world: it fails, and the rest of the batch and what is in flight
 * with it. */
void comm_post_batch(comm_world *w, comm_req *r) {
    while (r) {
        comm_req *next = r->next;
        r->next = NULL;
        if (r->kind == COMM_K_CREATE || r->kind == COMM_K_FREE) {
            if (r->seq) comm_board_arrive(w, r->g, r->seq);
            comm_group_exec(w, r);
            comm_finish(w, r);
            r = next;
            continue;
        }
        const char *call = "?";
        int rc = MPI_SUCCESS;
        if (comm_active_reserve(w) != 0) {
            r->status = ms_error(MS_ERR_NOMEM, "comm: out of memory for active requests");
            snprintf(r->msg, sizeof r->msg, "%s", ms_errmsg());
            comm_finish_failed(w, r);
        } else if (r->t_posted = ms_now(), (rc = comm_post_one(r, &call)) != MPI_SUCCESS) {
            comm_finish_mpi_error(w, r, rc, call);
        } else {
            /* in the op: arrived.  One that failed to post never was, and its peers say so;
             * the price: a post that blocks inside MPI (an MPI that sets a communicator up on
             * its first collective) shows as not arrived meanwhile */
            if (r->seq) comm_board_arrive(w, r->g, r->seq);
            w->active[w->nactive] = r;
            w->mreqs[w->nactive] = r->mreq;
            w->nactive++;
            comm_stream_add(w, r);
            r = next;
            continue;
        }
        if (comm_world_broken(w)) {
            comm_fail_all(w, next);
            return;
        }
        r = next;
    }
}

/* A request completed inside MPI with code err: check, post-process, finish. */
static void comm_complete(comm_world *w, comm_req *r, int err, MPI_Status *st) {
    if (err != MPI_SUCCESS) {
        comm_finish_mpi_error(w, r, err, comm_kind_name(r->kind));
        return;
    }
    r->status = MS_OK;
    if (r->kind == COMM_K_SPLIT) {
        comm_group_exec(w, r); /* everyone arrived: the blocking split is short */
    } else if (r->kind == COMM_K_RECV) {
        int got = 0;
        MPI_Get_count(st, comm_mpi_dtype(r->dt), &got);
        r->got = got > 0 ? (size_t)got : 0;
        if ((size_t)got != r->count) {
            char d[256];
            comm_req_describe(r, d, sizeof d);
            r->status = MS_ERR_RANGE;
            snprintf(r->msg, sizeof r->msg, "comm: %s: received %d elements, expected %zu", d, got,
                     r->count);
        }
    } else if (r->kind == COMM_K_REDUCE_SCATTER && r->inplace && r->g->rank != 0) {
        memcpy(r->recv, r->send, r->count * comm_dtype_size(r->dt));
    }
    comm_finish(w, r);
}

/* Remove finished entries (active[i] == NULL) keeping the order.  The
 * streaming window is counted again over the ops left: an op that finished
 * before its time at COMM_STREAM_MIN_RATE leaves it, else the window would
 * run ahead without bound while ops move faster than that rate, and a
 * later op waiting for a dead or late peer would be polled hard till its
 * deadline. */
static void comm_compact(comm_world *w) {
    int j = 0;
    w->stream_until = 0;
    for (int i = 0; i < w->nactive; i++) {
        if (!w->active[i]) continue;
        w->active[j] = w->active[i];
        w->mreqs[j] = w->mreqs[i];
        comm_stream_add(w, w->active[j]);
        j++;
    }
    w->nactive = j;
}

/* Fail r because the world is broken (the cause is pmsg). */
static void comm_fail_one(comm_world *w, comm_req *r, ms_status code, const char *pmsg) {
    char d[256];
    comm_req_describe(r, d, sizeof d);
    r->status = code;
    snprintf(r->msg, sizeof r->msg, "comm: %s aborted: world broken by an earlier failure: %s", d,
             pmsg);
    comm_finish(w, r);
}

/* Fail every active request and every request of `batch` because the world
 * is broken.  The MPI requests are dropped, never touched again. */
static void comm_fail_all(comm_world *w, comm_req *batch) {
    char pmsg[COMM_MSG_MAX];
    pthread_mutex_lock(&w->mu);
    ms_status code = w->poison_code;
    snprintf(pmsg, sizeof pmsg, "%s", w->poison_msg);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->nactive; i++)
        if (w->active[i]) comm_fail_one(w, w->active[i], code, pmsg);
    w->nactive = 0;
    w->stream_until = 0;
    while (batch) {
        comm_req *next = batch->next; /* comm_finish may recycle batch */
        comm_fail_one(w, batch, code, pmsg);
        batch = next;
    }
}

/* MPI_Testsome over the active requests; returns 1 if any finished. */
static int comm_progress(comm_world *w) {
    int outcount = 0;
    int rc = MPI_Testsome(w->nactive, w->mreqs, &outcount, w->idx, w->sts);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        char e[MPI_MAX_ERROR_STRING + 64];
        comm_mpi_errstr(rc, "MPI_Testsome", e, sizeof e);
        pthread_mutex_lock(&w->mu);
        comm_poison_locked(w, MS_ERR_INTERNAL, e);
        pthread_mutex_unlock(&w->mu);
        comm_fail_all(w, NULL);
        return 1;
    }
    if (outcount == MPI_UNDEFINED || outcount == 0) return 0;
    for (int k = 0; k < outcount; k++) {
        int i = w->idx[k];
        comm_req *r = w->active[i];
        w->active[i] = NULL;
        comm_complete(w, r, rc == MPI_ERR_IN_STATUS ? w->sts[k].MPI_ERROR : MPI_SUCCESS,
                      &w->sts[k]);
    }
    comm_compact(w);
    return 1;
}

/* r cannot finish (deadline passed, or a peer it waits for exited): fail it
 * with the arrival report and break the world. */
static void comm_timeout(comm_world *w, comm_req *r, double now, int dead) {
    pthread_mutex_lock(&w->mu);
    w->reporting_until = ms_now() + COMM_REPORT_S; /* its waiter waits for the report */
    pthread_mutex_unlock(&w->mu);
    comm_board_settle(w, 2.5); /* the report below names a peer stopped a moment ago */
    comm_dump_write(w, dead ? "peer_exited" : "timeout", 1); /* r still in flight */
    char d[256], b[COMM_MSG_MAX];
    comm_req_describe(r, d, sizeof d);
    comm_board_describe(w, r, b, sizeof b);
    pthread_mutex_lock(&w->mu);
    double limit = r->deadline - r->t_start;
    pthread_mutex_unlock(&w->mu);
    r->status = MS_ERR_TIMEOUT;
    if (dead)
        snprintf(r->msg, sizeof r->msg,
                 "comm: %s cannot complete, a peer process exited (after %.1f s, timeout %.1f s): "
                 "%s",
                 d, now - r->t_start, limit, b);
    else
        snprintf(r->msg, sizeof r->msg, "comm: %s timed out after %.1f s (limit %.1f s): %s", d,
                 now - r->t_start, limit, b);
    for (int i = 0; i < w->nactive; i++)
        if (w->active[i] == r) w->active[i] = NULL;
    comm_compact(w);
    pthread_mutex_lock(&w->mu);
    comm_poison_locked(w, MS_ERR_TIMEOUT, r->msg);
    w->reporting_until = 0;
    pthread_mutex_unlock(&w->mu);
    comm_finish(w, r);
    comm_fail_all(w, NULL);
}

/* Deadlines, and (every 200 ms) peers that exited before arriving. */
static void comm_check_deadlines(comm_world *w) {
    double now = ms_now();
    for (int i = 0; i < w->nactive; i++) {
        if (now >= w->active[i]->deadline) {
            comm_timeout(w, w->active[i], now, 0);
            return;
        }
    }
    if (now - w->last_dead_check < COMM_DEAD_CHECK_S) return;
    w->last_dead_check = now;
    /* a dump asked for (SIGUSR2) is answered while ops are in flight also
     * without a board (before, a rank hung in an op, its board off, wrote
     * its dump only once the op ended or timed out) */
    comm_dump_poll(w);
    if (!w->board.shm) return;
    for (int i = 0; i < w->nactive; i++) {
        comm_req *r = w->active[i];
        if (now - r->t_start < COMM_DEAD_MIN_AGE_S) continue;
        if (comm_board_dead_missing(w, r) == 0) {
            r->t_dead_seen = 0;
        } else if (r->t_dead_seen == 0) {
            r->t_dead_seen = now; /* give in-flight data a grace period to land */
        } else if (now - r->t_dead_seen >= COMM_DEAD_GRACE_S) {
            comm_timeout(w, r, now, 1);
            return;
        }
    }
}

/* Sleep a little when polling found nothing: yield first, then back off
 * exponentially up to poll_max_us; a new submission wakes us at once.
 * While a caller is blocked in comm_wait its core is idle, so the thread
 * only yields: every protocol step of a message (a rendezvous needs
 * several on each side) then costs microseconds instead of up to
 * poll_max_us, which a pipeline pays on its critical path.  Only for the
 * first COMM_HARD_POLL_S of a wait: a longer one waits for a peer, not for
 * the protocol, and must not spin a core that a rank sharing the node may
 * need.  While the callers compute, the back-off keeps the polling off
 * their cores.  While a large op streams (w->stream_until, see
 * COMM_STREAM_MIN_BYTES) the thread polls hard for as long as a caller
 * waits, and all along where the ranks compute on a device (their cores
 * idle meanwhile): a message moved in fragments otherwise advances one
 * fragment per back-off sleep (on the H200 machine a 25 MB reduce-scatter
 * took 780 ms instead of 48). */
static void comm_backoff(comm_world *w, unsigned *sleep_us, int streaming) {
    if (*sleep_us == 0 || streaming == 2) {
        sched_yield();
        *sleep_us = 1;
        return;
    }
    pthread_mutex_lock(&w->mu);
    if (w->n_waiting > 0 && (streaming || ms_now() < w->hard_poll_until)) {
        pthread_mutex_unlock(&w->mu);
        sched_yield();
        *sleep_us = 1;
        return;
    }
    if (!w->q_head && !w->kicked && !w->stop)
        comm_cv_wait_s(&w->submit_cv, &w->mu, *sleep_us * 1e-6);
    pthread_mutex_unlock(&w->mu);
    *sleep_us *= 2;
    if (*sleep_us > (unsigned)w->poll_max_us) *sleep_us = (unsigned)w->poll_max_us;
}

static void *comm_thread_main(void *arg) {
    comm_world *w = arg;
    unsigned sleep_us = 0;
    int nactive = 0; /* w->nactive as last seen under mpi_mu */
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->q_head && !w->kicked && nactive == 0 && !w->stop) {
            comm_board_heartbeat(w);
            pthread_mutex_unlock(&w->mu);
            pthread_mutex_lock(&w->mpi_mu);
            comm_dump_poll(w); /* another rank of the host asked for hang dumps */
            nactive = w->nactive;
            pthread_mutex_unlock(&w->mpi_mu);
            pthread_mutex_lock(&w->mu);
            if (w->q_head || w->kicked || nactive || w->stop) break;
            comm_cv_wait_s(&w->submit_cv, &w->mu, COMM_IDLE_WAKE_S);
        }
        if (w->stop && !w->q_head && !w->kicked && nactive == 0) {
            pthread_mutex_unlock(&w->mu);
            break;
        }
        pthread_mutex_unlock(&w->mu);
        /* mpi_mu before taking the queue: a caller that finds the queue
         * empty and posts its own request cannot overtake a batch taken
         * but not yet posted. */
        pthread_mutex_lock(&w->mpi_mu);
        pthread_mutex_lock(&w->mu);
        comm_req *batch = w->q_head;
        w->q_head = w->q_tail = NULL;
        int poisoned = w->poisoned, kicked = w->kicked;
        w->kicked = 0;
        pthread_mutex_unlock(&w->mu);
        int progress = batch != NULL || kicked;
        if (poisoned) {
            comm_fail_all(w, batch);
        } else {
            comm_post_batch(w, batch);
            if (w->nactive) progress |= comm_progress(w);
            /* a collective that completed with an error broke the world just now: its other
             * ops fail with that (next pass), never as a timeout with a settle and a dump */
            if (w->nactive && !comm_world_broken(w)) comm_check_deadlines(w);
            comm_board_heartbeat(w);
        }
        nactive = w->nactive;
        /* a large op streams: 1; and the ranks compute on a device: 2 */
        int streaming = nactive && ms_now() < w->stream_until ? 1 + w->dev_compute : 0;
        pthread_mutex_unlock(&w->mpi_mu);
        if (poisoned) continue;
        if (progress)
            sleep_us = 0;
        else if (nactive)
            comm_backoff(w, &sleep_us, streaming);
    }
    return NULL;
}

ms_status comm_thread_start(comm_world *w) {
    int rc = pthread_create(&w->thread, NULL, comm_thread_main, w);
    if (rc != 0)
        return ms_error(MS_ERR_INTERNAL,
                        "comm_world_init: cannot start the communication thread: "
                        "%s",
                        strerror(rc));
    w->thread_started = 1;
    return MS_OK;
}

int comm_thread_stop(comm_world *w, double wait_s) {
    if (!w->thread_started) return 0;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->submit_cv);
    pthread_mutex_unlock(&w->mu);
    struct timespec ts = ms_deadline(CLOCK_REALTIME, wait_s); /* pthread_timedjoin_np's clock */
    if (pthread_timedjoin_np(w->thread, NULL, &ts) != 0) return -1;
    w->thread_started = 0;
    return 0;
}
