/* comm_world.c - the world: options, MPI initialisation and finalisation,
 * dtype/op mapping, MPI error translation and the device hooks.  See comm.h
 * for the model; comm_thread.c for the communication thread it starts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/shm_sweep.h"
#include "base/timeutil.h"
#include "comm/comm_internal.h"

#define COMM_DEFAULT_TIMEOUT_S 300.0
#define COMM_DEFAULT_POLL_US 1000

comm_options comm_options_default(void) {
    comm_options o = {.timeout_s = COMM_DEFAULT_TIMEOUT_S, .poll_max_us = COMM_DEFAULT_POLL_US};
    return o;
}

size_t comm_dtype_size(comm_dtype dt) {
    switch (dt) {
    case COMM_F32:
    case COMM_I32:
        return 4;
    case COMM_F64:
    case COMM_I64:
        return 8;
    case COMM_U8:
        return 1;
    case COMM_BF16:
        return 2;
    }
    return 0;
}

const char *comm_dtype_name(comm_dtype dt) {
    static const char *names[] = {"f32", "f64", "i32", "i64", "u8", "bf16"};
    return (unsigned)dt < sizeof names / sizeof names[0] ? names[dt] : "?";
}

MPI_Datatype comm_mpi_dtype(comm_dtype dt) {
    switch (dt) {
    case COMM_F32:
        return MPI_FLOAT;
    case COMM_F64:
        return MPI_DOUBLE;
    case COMM_I32:
        return MPI_INT32_T;
    case COMM_I64:
        return MPI_INT64_T;
    case COMM_U8:
        return MPI_UINT8_T;
    case COMM_BF16:
        return MPI_UINT16_T;
    }
    ms_panic(__FILE__, __LINE__, "comm: bad dtype %d", (int)dt);
}

MPI_Op comm_mpi_op(const comm_world *w, comm_dtype dt, comm_redop op) {
    if (dt == COMM_BF16 && (unsigned)op <= COMM_MIN) return w->bf16_op[op];
    switch (op) {
    case COMM_SUM:
        return MPI_SUM;
    case COMM_MAX:
        return MPI_MAX;
    case COMM_MIN:
        return MPI_MIN;
    }
    ms_panic(__FILE__, __LINE__, "comm: bad reduction op %d", (int)op);
}

void comm_mpi_errstr(int rc, const char *call, char *buf, size_t n) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    snprintf(buf, n, "%s failed: %s", call, s);
}

ms_status comm_mpi_error(int rc, const char *call, const char *ctx) {
    char s[MPI_MAX_ERROR_STRING + 128];
    comm_mpi_errstr(rc, call, s, sizeof s);
    return ms_error(MS_ERR_INTERNAL, "%s: %s", ctx, s);
}

/* Resolve the options: defaults for unset (non-positive) fields; nccl_sync
 * must be 0 or 1.  (The environment is the command line's business:
 * megascale reads MS_COMM_TIMEOUT / MS_COMM_NCCL_SYNC into its options.) */
static ms_status comm_resolve_options(const comm_options *opt, comm_options *o) {
    *o = opt ? *opt : comm_options_default();
    if (!(o->timeout_s > 0) || !isfinite(o->timeout_s)) o->timeout_s = COMM_DEFAULT_TIMEOUT_S;
    if (o->poll_max_us <= 0) o->poll_max_us = COMM_DEFAULT_POLL_US;
    if (o->nccl_sync != 0 && o->nccl_sync != 1)
        return ms_error(MS_ERR_ARG,
                        "comm_world_init: nccl_sync (--comm-nccl-sync) %d is not 0 or 1",
                        o->nccl_sync);
    return MS_OK;
}

/* MPI_Init_thread (or reuse an initialised MPI) with at least SERIALIZED. */
static ms_status comm_mpi_start(comm_world *w, int *argc, char ***argv) {
    int inited = 0, provided = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) return comm_mpi_error(rc, "MPI_Init_thread", "comm_world_init");
        w->own_mpi = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return ms_error(MS_ERR_INTERNAL,
                        "comm_world_init: MPI provides thread level %d, the communication "
                        "thread needs MPI_THREAD_SERIALIZED (%d)",
                        provided, MPI_THREAD_SERIALIZED);
    rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) return comm_mpi_error(rc, "MPI_Comm_set_errhandler", "comm_world_init");
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    return MS_OK;
}

/* The world group over a duplicate of MPI_COMM_WORLD (our traffic never
 * mixes with other users of COMM_WORLD); board slot 0. */
static ms_status comm_world_group_init(comm_world *w) {
    MPI_Comm dup;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rc != MPI_SUCCESS) return comm_mpi_error(rc, "MPI_Comm_dup", "comm_world_init");
    char err[256];
    w->world_group = comm_group_wrap(w, dup, "world", err, sizeof err);
    if (!w->world_group) {
        MPI_Comm_free(&dup);
        return ms_error(MS_ERR_INTERNAL, "comm_world_init: %s", err);
    }
    w->world_group->gid = 0;
    w->next_gid = 1;
    return MS_OK;
}

static ms_status comm_sync_init(comm_world *w) {
    pthread_condattr_t ca;
    if (pthread_mutex_init(&w->mu, NULL) || pthread_mutex_init(&w->stage_mu, NULL) ||
        pthread_mutex_init(&w->mpi_mu, NULL) ||
        pthread_condattr_init(&ca) || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) ||
        pthread_cond_init(&w->submit_cv, &ca) || pthread_cond_init(&w->done_cv, &ca))
        return ms_error(MS_ERR_INTERNAL, "comm_world_init: pthread mutex/cond init failed");
    pthread_condattr_destroy(&ca);
    return MS_OK;
}

/* The first rank of each host removes the Open MPI shared-memory segments
 * that killed jobs left in its /dev/shm (base/shm_sweep.h): one restart
 * after a killed mpirun must not leak a segment a rank for good.  Its own
 * job's segments are mapped by then (MPI_Init made them before its fence). */
static void comm_sweep_host(const comm_world *w) {
#ifdef OPEN_MPI
    for (int q = 0; q < w->rank; q++)
        if (w->host_of[q] == w->host_of[w->rank]) return;
    ms_sweep_result r;
    double t0 = ms_now();
    if (ms_sweep_mpi_shm(1, &r) != MS_OK) return;
    if (r.removed)
        ms_info("comm: removed %d Open MPI shared-memory segment(s) of killed jobs from "
                "/dev/shm (%.1f MB, %.0f ms)",
                r.removed, (double)r.bytes / 1e6, 1e3 * (ms_now() - t0));
#else
    (void)w;
#endif
}

ms_status comm_world_init(comm_world **out, int *argc, char ***argv, const comm_options *opt) {
    comm_options o;
    *out = NULL;
    MS_TRY(comm_resolve_options(opt, &o));
    comm_world *w = calloc(1, sizeof *w);
    if (!w) return ms_error(MS_ERR_NOMEM, "comm_world_init: out of memory");
    w->timeout_s = o.timeout_s;
    w->poll_max_us = o.poll_max_us;
    w->nccl_sync = o.nccl_sync;
    w->board.local_idx = -1;
    for (int i = 0; i < 3; i++)
        w->bf16_op[i] = MPI_OP_NULL;
    comm_events_init(w);
    ms_status st = comm_mpi_start(w, argc, argv);
    if (st != MS_OK) goto out;
    if ((st = comm_bf16_ops_create(w)) != MS_OK) goto out;
    if ((st = comm_world_group_init(w)) != MS_OK) goto out;
    if ((st = comm_hosts_init(w)) != MS_OK) goto out;
    comm_sweep_host(w);
    if ((st = comm_board_init(w, !o.no_board)) != MS_OK) goto out;
    if ((st = comm_sync_init(w)) != MS_OK) goto out;
    if ((st = comm_thread_start(w)) != MS_OK) goto out;
    ms_debug("comm: world of %d ranks, timeout %.1f s, arrival board %s", w->size, w->timeout_s,
             w->board.shm ? "on" : w->board.why_off);
    *out = w;
out:
    if (st != MS_OK) {
        /* MPI stays initialised: it cannot be initialised twice anyway. */
        comm_bf16_ops_free(w);
        comm_board_free(w);
        comm_hosts_free(w);
        if (w->world_group) comm_group_free_struct(w->world_group);
        free(w->groups);
        free(w);
    }
    return st;
}

/* Free the world's memory (thread stopped). */
static void comm_world_free_struct(comm_world *w) {
    comm_req *r = w->free_list;
    while (r) {
        comm_req *n = r->next;
        free(r);
        r = n;
    }
    free(w->active);
    free(w->mreqs);
    free(w->idx);
    free(w->sts);
    free(w->groups);
    comm_hosts_free(w);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->stage_mu);
    pthread_mutex_destroy(&w->mpi_mu);
    pthread_cond_destroy(&w->submit_cv);
    pthread_cond_destroy(&w->done_cv);
    free(w);
}

/* Free the staging pool, with a debug line on what it held. */
static void comm_world_free_stage(comm_world *w) {
    if (!w->has_dev) return;
    pthread_mutex_lock(&w->stage_mu);
    size_t pinned = w->stage_pinned;
    int lost = w->stage_lost;
    pthread_mutex_unlock(&w->stage_mu);
    int n = comm_stage_pool_free(w);
    if (n || lost)
        ms_debug("comm: staging pool freed: %d buffers, %.1f MiB pinned%s", n,
                 (double)pinned / (1 << 20), lost ? " (some left to a failed MPI op)" : "");
}

ms_status comm_world_set_device(comm_world *w, const comm_device *dev) {
    if (!w) return ms_error(MS_ERR_ARG, "comm_world_set_device: NULL world");
    if (dev && (!dev->is_device || !dev->to_host || !dev->to_device || !dev->host_alloc ||
                !dev->host_free))
        return ms_error(MS_ERR_ARG, "comm_world_set_device: every hook must be set");
    comm_world_free_stage(w);
    w->has_dev = dev != NULL;
    if (dev) w->dev = *dev;
    pthread_mutex_lock(&w->mpi_mu);
    w->dev_compute = dev != NULL;
    pthread_mutex_unlock(&w->mpi_mu);
    return MS_OK;
}

ms_status comm_world_finalize(comm_world *w) {
    if (!w) return MS_OK;
    ms_status st = MS_OK;
    int was_broken = comm_world_broken(w);
    if (w->world_group->nccl) comm_nccl_group_free(w->world_group, was_broken);
    if (!was_broken) st = comm_barrier(w->world_group);
    int joined = comm_thread_stop(w, COMM_WAIT_GRACE_S) == 0;
    pthread_mutex_lock(&w->mu);
    int broken = w->poisoned;
    ms_status pcode = w->poison_code;
    char pmsg[COMM_MSG_MAX];
    snprintf(pmsg, sizeof pmsg, "%s", w->poison_msg);
    pthread_mutex_unlock(&w->mu);
    char busy[256] = "communication thread did not stop";
    /* the op it is still in (one started and never waited), named if the
     * thread is not inside a call holding the lock (a dump to a stalled
     * disk: then the plain message, never a wait) */
    if (!joined && pthread_mutex_trylock(&w->mpi_mu) == 0) {
        if (w->nactive > 0 && w->active[0])
            snprintf(busy, sizeof busy,
                     "communication thread did not stop: %d op(s) still in flight, the first "
                     "%s on group '%s', started %.1f s ago (an op started and never waited?)",
                     w->nactive, comm_kind_name(w->active[0]->kind),
                     w->active[0]->g ? w->active[0]->g->name : "?",
                     ms_now() - w->active[0]->t_start);
        pthread_mutex_unlock(&w->mpi_mu);
    }
    if (broken || !joined) {
        /* A timed-out request is still inside MPI: MPI_Finalize would wait
         * for the missing rank forever.  Leave MPI alone; the caller exits.
         * (The staging buffers still in the pool are safe to free.)  A
         * thread that did not stop still beats on the board: it stays
         * mapped (unmapped under it, its next beat was a SIGSEGV). */
        if (joined) {
            comm_board_free(w);
            comm_world_free_stage(w);
            comm_group_free_struct(w->world_group);
            comm_world_free_struct(w);
        }
        return ms_error(broken ? pcode : MS_ERR_INTERNAL,
                        "comm_world_finalize: world is broken, MPI not finalized (exit the "
                        "process): %s",
                        broken ? pmsg : busy);
    }
    MPI_Comm_free(&w->world_group->comm);
    comm_group_free_struct(w->world_group);
    comm_board_free(w);
    comm_bf16_ops_free(w);
    comm_world_free_stage(w);
    if (w->own_mpi) {
        int rc = MPI_Finalize();
        if (rc != MPI_SUCCESS && st == MS_OK)
            st = comm_mpi_error(rc, "MPI_Finalize", "comm_world_finalize");
    }
    comm_world_free_struct(w);
    return st;
}

int comm_world_rank(const comm_world *w) {
    return w->rank;
}

int comm_world_size(const comm_world *w) {
    return w->size;
}

comm_group *comm_world_group(comm_world *w) {
    return w->world_group;
}

double comm_world_timeout(const comm_world *w) {
    comm_world *m = (comm_world *)w; /* the lock is not part of the logical state */
    pthread_mutex_lock(&m->mu);
    double t = m->timeout_s;
    pthread_mutex_unlock(&m->mu);
    return t;
}

void comm_world_set_timeout(comm_world *w, double seconds) {
    MS_CHECK(seconds > 0);
    pthread_mutex_lock(&w->mu);
    w->timeout_s = seconds;
    pthread_mutex_unlock(&w->mu);
}

int comm_world_broken(const comm_world *w) {
    comm_world *m = (comm_world *)w;
    pthread_mutex_lock(&m->mu);
    int b = m->poisoned;
    pthread_mutex_unlock(&m->mu);
    return b;
}

void comm_world_fail(comm_world *w, ms_status code, const char *msg) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    comm_poison_locked(w, code, msg);
    pthread_mutex_unlock(&w->mu);
}

ms_status comm_world_fail_wait(comm_world *w, int peer, int member, ms_status code,
                               const char *msg) {
    char text[COMM_MSG_MAX], state[200];
    snprintf(text, sizeof text, "%s", msg);
    if (w && peer >= 0 && peer < w->size) {
        comm_board_settle(w, 2.5);
        /* a collective that timed out meanwhile broke the world first: its report is the
         * root cause (its "not arrived" names the rank), as it is before the settle */
        if (comm_world_broken(w)) return comm_world_check(w, msg);
        comm_board_peer_state(w, peer, state, sizeof state);
        size_t len = strlen(text);
        snprintf(text + len, sizeof text - len, "; peer rank %d (global %d): %s", member, peer,
                 state);
    }
    comm_world_fail(w, code, text);
    return ms_error(code, "%s", text);
}

ms_status comm_world_check(const comm_world *w, const char *what) {
    if (!w) return MS_OK;
    comm_world *m = (comm_world *)w;
    pthread_mutex_lock(&m->mu);
    ms_status st = MS_OK;
    if (m->poisoned)
        st = ms_error(m->poison_code, "comm: %s: world broken by an earlier failure: %s", what,
                      m->poison_msg);
    pthread_mutex_unlock(&m->mu);
    return st;
}
