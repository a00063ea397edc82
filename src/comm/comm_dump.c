/* comm_dump.c - the communicator's timers and hang dumps.
 *
 * Timers: when an op finishes, the communication thread records one span
 * on its group's lane ("comm:<group>") from the moment the caller started
 * it to the moment it completed, with the time it was posted to MPI, its
 * sequence number, bytes, and for point-to-point ops the peer's global rank
 * and the tag.  A caller that blocks in comm_wait records a "wait" span on
 * its own lane (comm_ops.c), so the trace shows compute waiting for
 * communication.  NCCL ops record their span at comm_wait.
 *
 * Hang dumps (docs/formats.md, "Hang dump").  When this rank's op misses
 * its deadline (or a peer it waits for exited), the communication thread
 * writes w->dump_path: for every live group, the sequence numbers issued
 * and completed, the last completed op, and every op in flight (queued or
 * posted) with its age.  It then asks the other ranks of the host, through
 * the arrival board, to write theirs (their ops have not timed out yet, or
 * time out later); each answers within one board poll (<= 0.2 s) with
 * reason "peer_request".  The dump of a rank's own timeout is its last: the
 * timeout fails all its ops, so a request answered after it would replace
 * the ops it waited in with none.  A rank that is stopped (SIGSTOP), hung in
 * compute with its communication thread stuck, or dead writes nothing:
 * `megascale trace hang` names the silent ranks as the suspects.  Writing
 * is atomic (temp file, rename), so a dump is whole or absent.
 * A SIGUSR2 to the process asks for a dump too (reason "signal"): the
 * supervisor sends it to every rank of a job it found hung before it stops
 * the job, since its heartbeats find a hang long before a collective's
 * deadline; `kill -USR2 PID` does the same by hand.
 * All of it runs on the communication thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/events.h"
#include "base/ctx.h"
#include "base/fileio.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "comm/comm_internal.h"

void comm_events_init(comm_world *w) {
    for (int k = 0; k <= COMM_K_BARRIER; k++)
        w->ev_kind[k] = ms_ev_intern(comm_kind_name((comm_kind)k));
    w->ev_wait = ms_ev_intern("wait");
}

static int64_t comm_ns(double t) {
    return (int64_t)(t * 1e9);
}

static int comm_is_p2p(comm_kind k) {
    return k == COMM_K_SEND || k == COMM_K_RECV;
}

void comm_events_finish(comm_world *w, comm_req *r) {
    if (r->kind > COMM_K_BARRIER) return; /* group creation: not an op */
    comm_group *g = r->g;
    size_t bytes = r->count * comm_dtype_size(r->dt);
    int p2p = comm_is_p2p(r->kind);
    g->last_kind = (int)r->kind;
    g->last_seq = r->seq;
    g->last_bytes = bytes;
    g->last_peer = p2p ? g->global[r->peer] : -1;
    g->last_tag = p2p ? r->tag : -1;
    g->last_done = r->t_done;
    if (r->seq > g->done_seq && r->status == MS_OK) g->done_seq = r->seq;
    if (r->status == MS_OK)
        atomic_fetch_add_explicit(&w->bytes_done, (long long)bytes, memory_order_relaxed);
    if (!ms_ev_on()) return;
    ms_ev_args a = {.has = MS_EV_GROUP | MS_EV_BYTES, .group = g->ev_name, .bytes = (int64_t)bytes};
    if (r->seq) a.has |= MS_EV_SEQ, a.seq = (int64_t)r->seq;
    if (p2p) a.has |= MS_EV_PEER | MS_EV_TAG, a.peer = g->global[r->peer], a.tag = r->tag;
    if (r->t_posted > 0) a.has |= MS_EV_POSTED, a.posted = comm_ns(r->t_posted);
    ms_ev_span(w->ev_kind[r->kind], g->ev_lane, comm_ns(r->t_start), comm_ns(r->t_done), &a);
}

/* One op as a JSON object. */
static void comm_dump_op(ms_atomic_file *af, const comm_req *r, const char *state, double now) {
    int p2p = comm_is_p2p(r->kind);
    ms_atomic_printf(af,
                     "{\"op\":\"%s\",\"seq\":%llu,\"peer\":%d,\"tag\":%d,\"bytes\":%zu,"
                     "\"age_s\":%.3f,\"state\":\"%s\"}",
                     comm_kind_name(r->kind), (unsigned long long)r->seq,
                     p2p ? r->g->global[r->peer] : -1, p2p ? r->tag : -1,
                     r->count * comm_dtype_size(r->dt), now - r->t_start, state);
}

/* The ops of g in flight: posted (w->active) and queued (w->q_head). */
static void comm_dump_in_flight(ms_atomic_file *af, comm_world *w, const comm_group *g,
                                double now) {
    int first = 1;
    for (int i = 0; i < w->nactive; i++) {
        const comm_req *r = w->active[i];
        if (!r || r->g != g) continue;
        ms_atomic_printf(af, first ? "" : ",");
        comm_dump_op(af, r, "posted", now);
        first = 0;
    }
    pthread_mutex_lock(&w->mu);
    for (const comm_req *r = w->q_head; r; r = r->next) {
        if (r->g != g || r->kind > COMM_K_BARRIER) continue;
        ms_atomic_printf(af, first ? "" : ",");
        comm_dump_op(af, r, "queued", now);
        first = 0;
    }
    pthread_mutex_unlock(&w->mu);
}

static void comm_dump_group(ms_atomic_file *af, comm_world *w, const comm_group *g, double now) {
    pthread_mutex_lock(&w->mu);
    unsigned long long issued = g->next_seq;
    pthread_mutex_unlock(&w->mu);
    ms_atomic_printf(af, "{\"name\":\"%s\",\"ranks\":[", g->name);
    for (int i = 0; i < g->size; i++)
        ms_atomic_printf(af, "%s%d", i ? "," : "", g->global[i]);
    ms_atomic_printf(af, "],\"issued_seq\":%llu,\"completed_seq\":%llu,\"last_completed\":", issued,
                     (unsigned long long)g->done_seq);
    if (g->last_kind < 0)
        ms_atomic_printf(af, "null");
    else
        ms_atomic_printf(af,
                         "{\"op\":\"%s\",\"seq\":%llu,\"peer\":%d,\"tag\":%d,\"bytes\":%zu,"
                         "\"age_s\":%.3f}",
                         comm_kind_name((comm_kind)g->last_kind), (unsigned long long)g->last_seq,
                         g->last_peer, g->last_tag, g->last_bytes, now - g->last_done);
    ms_atomic_printf(af, ",\"in_flight\":[");
    comm_dump_in_flight(af, w, g, now);
    ms_atomic_printf(af, "]}");
}

/* The waits outside the communicator in progress (comm_world_wait_begin),
 * each as a group of its own named where it waits (this rank and the one
 * waited for) with one op "wait_for" in flight: `megascale trace hang`
 * reads them as it reads a receive from that rank. */
static void comm_dump_outside(ms_atomic_file *af, comm_world *w, int comma) {
    long long now = (long long)ms_ev_now();
    for (int i = 0; i < COMM_WAIT_SLOTS; i++) {
        long long t = llabs(atomic_load(&w->wait_since[i])); /* < 0: a background thread's */
        const char *where = atomic_load(&w->wait_where[i]);
        int peer = atomic_load(&w->wait_peer[i]);
        if (!t || !where) continue;
        if (peer < 0 || peer >= w->size || peer == w->rank) peer = -1;
        ms_atomic_printf(af, "%s{\"name\":\"%s\",\"ranks\":[", comma ? "," : "", where);
        if (peer >= 0 && peer < w->rank) ms_atomic_printf(af, "%d,", peer);
        ms_atomic_printf(af, "%d", w->rank);
        if (peer > w->rank) ms_atomic_printf(af, ",%d", peer);
        ms_atomic_printf(af,
                         "],\"issued_seq\":0,\"completed_seq\":0,\"last_completed\":null,"
                         "\"in_flight\":[{\"op\":\"wait_for\",\"seq\":0,\"peer\":%d,\"tag\":-1,"
                         "\"bytes\":0,\"age_s\":%.3f,\"state\":\"posted\"}]}",
                         peer, now > t ? (double)(now - t) / 1e9 : 0.0);
        comma = 1;
    }
}

static void comm_dump_header(ms_atomic_file *af, comm_world *w, const char *reason) {
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    for (char *p = host; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '_';
    ms_atomic_printf(af,
                     "{\"type\":\"hang_dump\",\"version\":1,\"rank\":%d,\"world\":%d,"
                     "\"host\":\"%s\",\"pid\":%d,",
                     w->rank, w->size, host, (int)getpid());
    pthread_mutex_lock(&w->mu);
    int has = w->has_coord, c[3] = {w->coord[0], w->coord[1], w->coord[2]};
    int sh[3] = {w->shape[0], w->shape[1], w->shape[2]};
    pthread_mutex_unlock(&w->mu);
    if (has)
        ms_atomic_printf(af,
                         "\"coord\":{\"dp\":%d,\"pp\":%d,\"tp\":%d},\"shape\":{\"dp\":%d,"
                         "\"pp\":%d,\"tp\":%d},",
                         c[0], c[1], c[2], sh[0], sh[1], sh[2]);
    char host_states[8192];
    comm_board_host_states(w, host_states, sizeof host_states);
    ms_atomic_printf(af, "\"reason\":\"%s\",\"wall_s\":%.3f,%s,\"groups\":[", reason, ms_wall_now(),
                     host_states);
}

/* A copy of w->dump_path (set by another thread); 0 if there is none. */
static int comm_dump_path(comm_world *w, char *buf, size_t n) {
    pthread_mutex_lock(&w->mu);
    snprintf(buf, n, "%s", w->dump_path);
    pthread_mutex_unlock(&w->mu);
    return buf[0] != 0;
}

int comm_dump_write(comm_world *w, const char *reason, int ask_peers) {
    char path[sizeof w->dump_path];
    if (!comm_dump_path(w, path, sizeof path)) return 0;
    unsigned long long gen = comm_board_dump_requests(w);
    if (w->dump_final) { /* keep the dump that shows what this rank waited in */
        w->dump_seen = gen;
        comm_board_ack_dump(w, gen);
        return 1;
    }
    /* the first rank to time out asks the host's others; one that answered such a request
     * already took part in this hang's round.  (A dump for SIGUSR2 is no such round: one
     * written hours before, `launch --ctl dump`, kept a later timeout from asking, and the
     * others' stale dumps were read as current) */
    if (ask_peers && !w->dumped) {
        comm_board_request_dump(w);
        gen++;
        w->dumped = 1;
    }
    if (!strcmp(reason, "peer_request")) w->dumped = 1;
    comm_board_settle(w, 2.5); /* a peer stopped a moment ago is named as not responding */
    double now = ms_now();
    ms_atomic_file af;
    ms_status st = ms_atomic_open(&af, path);
    if (st == MS_OK) {
        comm_dump_header(&af, w, reason);
        for (int i = 0; i < w->ngroups; i++) {
            ms_atomic_printf(&af, i ? "," : "");
            comm_dump_group(&af, w, w->groups[i], now);
        }
        comm_dump_outside(&af, w, w->ngroups > 0);
        st = ms_atomic_printf(&af, "]}\n");
    }
    if (st == MS_OK) st = ms_atomic_commit(&af);
    w->dump_seen = gen; /* handled, written or not: a full disk is not tried again each poll */
    comm_board_ack_dump(w, gen);
    if (st != MS_OK) {
        ms_atomic_abort(&af);
        ms_warn("comm: hang dump not written: %s", ms_errmsg());
        return 0;
    }
    w->dump_final = ask_peers; /* its own timeout: comm_timeout fails every op next */
    ms_warn("comm: hang dump (%s) written to %s", reason, path);
    return 1;
}

void comm_dump_poll(comm_world *w) {
    if (comm_board_dump_requests(w) > w->dump_seen) comm_dump_write(w, "peer_request", 0);
    int asked = ms_ctx_get()->dump_requests; /* SIGUSR2: the supervisor, or a person */
    if (asked != w->signal_seen) {
        w->signal_seen = asked;
        /* one request comes twice (the supervisor signals mpirun, which forwards it, and the
         * ranks it started): one within a second of the last dump is answered by it (the
         * second wrote the dump again, and a reader found its temp file beside the first) */
        if (w->signal_dump_t > 0 && ms_now() - w->signal_dump_t < 1.0) return;
        /* (after this rank's own timeout: that dump stays); counted when one is on disk */
        if (comm_dump_write(w, "signal", 0)) atomic_fetch_add(&w->dump_answers, 1);
        w->signal_dump_t = ms_now();
        w->signal_seen = ms_ctx_get()->dump_requests; /* those that came while it was written */
    }
}

int comm_world_dumps(comm_world *w) {
    return w ? atomic_load(&w->dump_answers) : 0;
}

ms_status comm_world_set_dump_path(comm_world *w, const char *path) {
    if (!w) return ms_error(MS_ERR_ARG, "comm_world_set_dump_path: NULL world");
    if (path && strlen(path) >= sizeof w->dump_path)
        return ms_error(MS_ERR_ARG, "comm_world_set_dump_path: path too long: %s", path);
    pthread_mutex_lock(&w->mu);
    snprintf(w->dump_path, sizeof w->dump_path, "%s", path ? path : "");
    pthread_mutex_unlock(&w->mu);
    return MS_OK;
}

int comm_world_dump_grace(comm_world *w, double max_s) {
    char path[sizeof w->dump_path];
    if (!w || !comm_dump_path(w, path, sizeof path)) return 0;
    unsigned long long gen = comm_board_dump_requests(w);
    double t0 = ms_now();
    int pending = comm_board_dump_pending(w, gen);
    while (pending > 0 && ms_now() - t0 < max_s) {
        usleep(20000);
        pending = comm_board_dump_pending(w, gen);
    }
    return pending;
}

long long comm_world_bytes(comm_world *w) {
    return w ? atomic_load_explicit(&w->bytes_done, memory_order_relaxed) : 0;
}

long long comm_world_wait_ns(const comm_world *w) {
    return w ? atomic_load_explicit(&w->wait_ns, memory_order_relaxed) : 0;
}

double comm_world_blocked_s(comm_world *w) {
    long long now = (long long)ms_ev_now(), oldest = 0;
    for (int i = 0; w && i < COMM_WAIT_SLOTS; i++) {
        long long t = atomic_load(&w->wait_since[i]);
        if (t > 0 && (!oldest || t < oldest)) oldest = t; /* < 0: a background thread's */
    }
    return oldest && now > oldest ? (double)(now - oldest) / 1e9 : 0;
}

long long comm_group_wait_ns(const comm_group *g) {
    return g ? atomic_load_explicit(&g->wait_ns, memory_order_relaxed) : 0;
}
