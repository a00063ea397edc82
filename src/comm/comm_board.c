/* comm_board.c - the arrival board: who has reached which collective, and
 * which peer processes are still alive, readable without the cooperation of
 * the missing rank.
 *
 * One POSIX shared-memory segment per host, created at comm_world_init by
 * the host's first rank (MPI_Comm_split_type SHARED), mapped by every rank
 * of the host and unlinked at once (so nothing is left behind when a
 * process dies).  Each rank owns one slot: its pid, world rank, a heartbeat
 * (CLOCK_MONOTONIC ns, refreshed by the communication thread at least every
 * 200 ms) and, per group slot (gid), the sequence number of the last
 * collective it posted on that group.  Before posting collective #n on a
 * group, the communication thread stores n; a rank whose counter is < n has
 * not arrived.  Its pid tells whether the process still exists (kill(pid,
 * 0), zombies count as exited), its heartbeat whether it is stopped.
 *
 * Limits: the board spans one host.  Ranks on other hosts are reported as
 * "unknown (other host)" with their host's name (comm_hosts.c), and are
 * only caught by the timeout (a network outage, a remote host gone); a multi-host
 * version would publish the same counters through MPI one-sided windows or
 * the supervisor's heartbeats.  Groups past COMM_BOARD_MAX_GROUPS slots and
 * point-to-point ops get liveness only, not arrival.  If /dev/shm is not
 * usable the board is off and messages say so.  If the ranks of a host do
 * not share a pid namespace (one container per rank), arrival still works
 * but "exited" cannot be told: no early failure, only the timeout.
 *
 * Writers: the owning rank's communication thread (seq, heartbeat), the
 * threads starting NCCL ops (seq, as a running maximum) and init (pid,
 * rank).  Readers: any thread of any rank (lock-free atomics).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "comm/comm_internal.h"

#define COMM_BOARD_MAGIC 0x4452414f424d4d43ULL /* "CMMBOARD" */
#define COMM_LIST_MAX 16                       /* ranks listed per category in a message */
#define COMM_STALE_S                                                                               \
    2.0 /* heartbeat older than this (refreshed every <= 0.2 s): "not responding" */

#define COMM_FRESH_S 0.5 /* a heartbeat this young: the peer is alive */

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the board needs lock-free 64-bit atomics");

typedef struct {
    _Atomic long long pid;
    _Atomic long long world_rank;
    _Atomic unsigned long long heartbeat_ns;
    _Atomic unsigned long long dump_ack; /* the last dump request this rank answered */
    _Atomic unsigned long long seq[COMM_BOARD_MAX_GROUPS];
} comm_board_slot;

struct comm_board_shm {
    unsigned long long magic;
    int nlocal, max_groups;
    _Atomic unsigned long long dump_req; /* hang-dump requests made on this host */
    comm_board_slot slot[];
};

static unsigned long long comm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* Leader: create and map the segment; others: map it.  0 on success. */
static int comm_board_map(comm_board *b, const char *name, int create, int nlocal, char *why,
                          size_t n) {
    size_t len = sizeof(comm_board_shm) + (size_t)nlocal * sizeof(comm_board_slot);
    int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    if (fd < 0) {
        snprintf(why, n, "shm_open %s: %s", name, strerror(errno));
        return -1;
    }
    if (create && ftruncate(fd, (off_t)len) != 0) {
        snprintf(why, n, "ftruncate %s: %s", name, strerror(errno));
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, n, "mmap %s: %s", name, strerror(errno));
        return -1;
    }
    b->shm = p;
    b->len = len;
    if (create) {
        b->shm->nlocal = nlocal;
        b->shm->max_groups = COMM_BOARD_MAX_GROUPS;
        b->shm->magic = COMM_BOARD_MAGIC;
    }
    return 0;
}

/* Which world ranks share this host, and at which slot (world allgather). */
static ms_status comm_board_map_world(comm_world *w, int leader, int node_rank) {
    int mine[2] = {leader, node_rank}, *all = malloc((size_t)w->size * 2 * sizeof(int));
    w->board.world_to_local = malloc((size_t)w->size * sizeof(int));
    if (!all || !w->board.world_to_local) {
        free(all);
        return ms_error(MS_ERR_NOMEM, "comm_world_init: out of memory for the board map");
    }
    int rc = MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(all);
        return comm_mpi_error(rc, "MPI_Allgather", "comm_world_init (arrival board)");
    }
    for (int r = 0; r < w->size; r++)
        w->board.world_to_local[r] = all[2 * r] == leader ? all[2 * r + 1] : -1;
    free(all);
    return MS_OK;
}

/* Fill this rank's slot. */
static void comm_board_publish(comm_world *w, int nr) {
    comm_board_slot *s = &w->board.shm->slot[nr];
    atomic_store(&s->pid, (long long)getpid());
    atomic_store(&s->world_rank, (long long)w->rank);
    atomic_store(&s->heartbeat_ns, comm_now_ns());
}

/* 1 if every slot's pid is visible from here (same pid namespace); if not,
 * "process exited" cannot be told and liveness checks are off. */
static int comm_board_pids_visible(const comm_board *b, int ns) {
    for (int i = 0; i < ns; i++) {
        long long pid = atomic_load(&b->shm->slot[i].pid);
        if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno != EPERM)) return 0;
    }
    return 1;
}

/* Collective over the host's ranks: map the segment everywhere or nowhere,
 * publish every slot, then check that peers' pids are visible. */
static ms_status comm_board_setup(comm_world *w, MPI_Comm node, int enable) {
    comm_board *b = &w->board;
    int nr, ns, rc;
    MPI_Comm_rank(node, &nr);
    MPI_Comm_size(node, &ns);
    struct {
        int ok, leader;
        char name[56];
        char why[sizeof b->why_off]; /* the leader's failure, for every rank's messages */
    } msg = {0, w->rank, "", ""};
    if (nr == 0 && enable) {
        snprintf(msg.name, sizeof msg.name, "/megascale-comm-%d-%llx", (int)getpid(),
                 comm_now_ns() & 0xffffffffffULL);
        msg.ok = comm_board_map(b, msg.name, 1, ns, b->why_off, sizeof b->why_off) == 0;
        snprintf(msg.why, sizeof msg.why, "%s", b->why_off);
    }
    rc = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, node);
    /* the other ranks say why the leader failed (they said only "board
     * disabled": taken for the option, where /dev/shm was full) */
    if (rc == MPI_SUCCESS && nr != 0 && enable && !msg.ok && msg.why[0])
        snprintf(b->why_off, sizeof b->why_off, "the host's first rank: %.100s", msg.why);
    int ok = rc == MPI_SUCCESS && msg.ok && enable, all_ok = 0, vis = 0, all_vis = 0;
    if (ok && nr != 0) ok = comm_board_map(b, msg.name, 0, ns, b->why_off, sizeof b->why_off) == 0;
    if (ok) comm_board_publish(w, nr);
    if (rc == MPI_SUCCESS) rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node);
    if (nr == 0 && msg.ok) shm_unlink(msg.name); /* everyone has mapped it (or given up) */
    if (rc != MPI_SUCCESS)
        return comm_mpi_error(rc, "MPI_Bcast/Allreduce", "comm_world_init (board)");
    if (all_ok) {
        vis = comm_board_pids_visible(b, ns);
        rc = MPI_Allreduce(&vis, &all_vis, 1, MPI_INT, MPI_MIN, node);
        if (rc != MPI_SUCCESS)
            return comm_mpi_error(rc, "MPI_Allreduce", "comm_world_init (board)");
        b->local_idx = nr;
        b->pids_ok = all_vis;
    } else {
        if (!b->why_off[0]) snprintf(b->why_off, sizeof b->why_off, "board disabled");
        if (b->shm) munmap(b->shm, b->len);
        b->shm = NULL;
    }
    return comm_board_map_world(w, msg.leader, nr);
}

ms_status comm_board_init(comm_world *w, int enable) {
    MPI_Comm node;
    int rc =
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w->rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS)
        return comm_mpi_error(rc, "MPI_Comm_split_type", "comm_world_init (arrival board)");
    if (!enable) snprintf(w->board.why_off, sizeof w->board.why_off, "board disabled by option");
    ms_status st = comm_board_setup(w, node, enable);
    MPI_Comm_free(&node);
    return st;
}

void comm_board_free(comm_world *w) {
    if (w->board.shm) munmap(w->board.shm, w->board.len);
    w->board.shm = NULL;
    free(w->board.world_to_local);
    w->board.world_to_local = NULL;
}

void comm_board_arrive(comm_world *w, const comm_group *g, uint64_t seq) {
    if (!w->board.shm || g->gid < 0) return;
    /* Two writers per rank (the comm thread for MPI ops, the caller for NCCL
     * ops on the same group): keep the largest, so the count never goes back. */
    _Atomic unsigned long long *p = &w->board.shm->slot[w->board.local_idx].seq[g->gid];
    unsigned long long cur = atomic_load_explicit(p, memory_order_relaxed);
    while (cur < seq && !atomic_compare_exchange_weak_explicit(p, &cur, seq, memory_order_release,
                                                               memory_order_relaxed)) {
    }
}

void comm_board_heartbeat(comm_world *w) {
    if (!w->board.shm) return;
    atomic_store_explicit(&w->board.shm->slot[w->board.local_idx].heartbeat_ns, comm_now_ns(),
                          memory_order_relaxed);
}

/* Has process pid exited?  Zombies (exited, not yet reaped) count. */
static int comm_pid_exited(long long pid) {
    if (pid <= 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* The slot of world rank gr on this host, or NULL. */
static comm_board_slot *comm_board_slot_of(comm_world *w, int gr) {
    if (!w->board.shm) return NULL;
    int l = w->board.world_to_local[gr];
    return l < 0 ? NULL : &w->board.shm->slot[l];
}

static int comm_is_collective(const comm_req *r) {
    return r->seq > 0 && r->g->gid >= 0;
}

int comm_board_dead_missing(comm_world *w, const comm_req *r) {
    const comm_group *g = r->g;
    if (r->kind == COMM_K_SEND || r->kind == COMM_K_RECV) {
        comm_board_slot *s = comm_board_slot_of(w, g->global[r->peer]);
        return s && w->board.pids_ok && comm_pid_exited(atomic_load(&s->pid));
    }
    if (!comm_is_collective(r) || !w->board.pids_ok) return 0;
    int n = 0;
    for (int i = 0; i < g->size; i++) {
        comm_board_slot *s = i == g->rank ? NULL : comm_board_slot_of(w, g->global[i]);
        if (s) n += comm_pid_exited(atomic_load(&s->pid));
    }
    return n;
}

void comm_board_request_dump(comm_world *w) {
    if (w->board.shm) atomic_fetch_add(&w->board.shm->dump_req, 1);
}

unsigned long long comm_board_dump_requests(comm_world *w) {
    return w->board.shm ? atomic_load(&w->board.shm->dump_req) : 0;
}

void comm_board_ack_dump(comm_world *w, unsigned long long gen) {
    if (w->board.shm) atomic_store(&w->board.shm->slot[w->board.local_idx].dump_ack, gen);
}

int comm_board_dump_pending(comm_world *w, unsigned long long gen) {
    if (!w->board.shm) return 0;
    int n = 0;
    unsigned long long now = comm_now_ns();
    for (int i = 0; i < w->board.shm->nlocal; i++) {
        comm_board_slot *s = &w->board.shm->slot[i];
        if (i == w->board.local_idx || atomic_load(&s->dump_ack) >= gen) continue;
        if (w->board.pids_ok && comm_pid_exited(atomic_load(&s->pid))) continue;
        unsigned long long hb = atomic_load(&s->heartbeat_ns);
        if (hb < now && now - hb > (unsigned long long)(COMM_STALE_S * 1e9))
            continue; /* stopped or stuck: it will not answer */
        n++;
    }
    return n;
}

/* 1 if a live peer's heartbeat is neither fresh nor stale. */
static int comm_board_ambiguous(comm_world *w) {
    unsigned long long now = comm_now_ns();
    for (int i = 0; i < w->board.shm->nlocal; i++) {
        comm_board_slot *s = &w->board.shm->slot[i];
        if (i == w->board.local_idx) continue;
        if (w->board.pids_ok && comm_pid_exited(atomic_load(&s->pid))) continue;
        unsigned long long hb = atomic_load(&s->heartbeat_ns);
        double age = hb < now ? (double)(now - hb) / 1e9 : 0;
        if (age > COMM_FRESH_S && age <= COMM_STALE_S) return 1;
    }
    return 0;
}

void comm_board_settle(comm_world *w, double max_s) {
    if (!w->board.shm) return;
    double t0 = ms_now();
    while (comm_board_ambiguous(w) && ms_now() - t0 < max_s) {
        comm_board_heartbeat(w);
        usleep(20000);
    }
}

void comm_host_states_format(const comm_host_peer *p, int np, char *buf, size_t n) {
    /* the exited ranks first (their list ends the text); then as many
     * unresponsive ranks as fit before it.  What does not fit is counted
     * ("..._omitted"): the text is always whole JSON (before, a host of ~45
     * stopped ranks filled the buffer and the closing "],\"exited\"..."
     * was left out: a dump no JSON reader could load) */
    char ex[2048] = "";
    size_t elen = 0;
    int omit_u = 0, omit_e = 0;
    for (int i = 0; i < np; i++) {
        if (!p[i].exited) continue;
        char one[32];
        int k = snprintf(one, sizeof one, "%s%lld", elen ? "," : "", p[i].rank);
        if (elen + (size_t)k < sizeof ex)
            memcpy(ex + elen, one, (size_t)k + 1), elen += (size_t)k;
        else
            omit_e++;
    }
    char tail[sizeof ex + 32];
    size_t tl = (size_t)snprintf(tail, sizeof tail, "],\"exited\":[%s]", ex);
    const size_t counts = 80; /* ",\"unresponsive_omitted\":N,\"exited_omitted\":M" */
    if (n < 64 + counts) {
        if (n) buf[0] = 0;
        return;
    }
    if (16 + tl + counts >= n) { /* no room for the exited list: counted */
        omit_e = 0;
        for (int i = 0; i < np; i++)
            omit_e += p[i].exited;
        tl = (size_t)snprintf(tail, sizeof tail, "],\"exited\":[]");
    }
    size_t len = (size_t)snprintf(buf, n, "\"unresponsive\":[");
    int first = 1;
    for (int i = 0; i < np; i++) {
        if (p[i].exited || !(p[i].age_s > COMM_STALE_S)) continue;
        char one[96];
        int k = snprintf(one, sizeof one, "%s{\"rank\":%lld,\"heartbeat_age_s\":%.3f}",
                         first ? "" : ",", p[i].rank, p[i].age_s);
        if (len + (size_t)k + tl + counts < n)
            memcpy(buf + len, one, (size_t)k + 1), len += (size_t)k, first = 0;
        else
            omit_u++;
    }
    len += (size_t)snprintf(buf + len, n - len, "%s", tail);
    if (omit_u || omit_e)
        snprintf(buf + len, n - len, ",\"unresponsive_omitted\":%d,\"exited_omitted\":%d", omit_u,
                 omit_e);
}

void comm_board_host_states(comm_world *w, char *buf, size_t n) {
    const comm_board *b = &w->board;
    int nl = b->shm ? b->shm->nlocal : 0, np = 0;
    comm_host_peer *p = nl ? calloc((size_t)nl, sizeof *p) : NULL;
    unsigned long long now = comm_now_ns();
    for (int i = 0; p && i < nl; i++) {
        comm_board_slot *s = &b->shm->slot[i];
        if (i == b->local_idx) continue;
        unsigned long long hb = atomic_load(&s->heartbeat_ns);
        p[np].rank = atomic_load(&s->world_rank);
        p[np].exited = b->pids_ok && comm_pid_exited(atomic_load(&s->pid));
        p[np].age_s = hb < now ? (double)(now - hb) / 1e9 : 0; /* it may beat after `now` */
        np++;
    }
    comm_host_states_format(p, np, buf, n);
    free(p);
}

/* Bounded append to buf (len tracks the used length). */
static void comm_app(char *buf, size_t n, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void comm_app(char *buf, size_t n, size_t *len, const char *fmt, ...) {
    if (*len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, n - *len, fmt, ap);
    va_end(ap);
    if (k > 0) *len += (size_t)k < n - *len ? (size_t)k : n - *len - 1;
}

/* "process 123 exited" / "alive, heartbeat 0.1 s ago" / "... not responding". */
static void comm_peer_state(const comm_board *b, comm_board_slot *s, char *buf, size_t n) {
    long long pid = atomic_load(&s->pid);
    unsigned long long now = comm_now_ns(), hb = atomic_load(&s->heartbeat_ns);
    double age = hb < now ? (double)(now - hb) * 1e-9 : 0; /* it may beat after `now` */
    if (!b->pids_ok)
        snprintf(buf, n, "pid %lld in another pid namespace, heartbeat %.1f s ago", pid, age);
    else if (comm_pid_exited(pid))
        snprintf(buf, n, "process %lld exited", pid);
    else if (age > COMM_STALE_S)
        snprintf(buf, n, "pid %lld not responding for %.1f s (stopped?)", pid, age);
    else
        snprintf(buf, n, "pid %lld alive, heartbeat %.1f s ago", pid, age);
}

/* Arrival report for a collective: not arrived / other host / arrived. */
static void comm_describe_collective(comm_world *w, const comm_req *r, char *buf, size_t n) {
    const comm_group *g = r->g;
    size_t len = 0;
    int counts[3] = {0, 0, 0}, exited_after = 0;
    char st[160];
    for (int pass = 0; pass < 3; pass++) {
        int shown = 0, total = 0;
        for (int i = 0; i < g->size; i++) {
            comm_board_slot *s = i == g->rank ? NULL : comm_board_slot_of(w, g->global[i]);
            unsigned long long seq =
                s ? atomic_load_explicit(&s->seq[g->gid], memory_order_acquire) : 0;
            int cat = i == g->rank || (s && seq >= r->seq) ? 2 : s ? 0 : 1;
            if (cat != pass) continue;
            if (total++ == 0)
                comm_app(buf, n, &len, "%s%s", len ? "; " : "",
                         pass == 0   ? "not arrived: "
                         : pass == 1 ? "unknown (other host): "
                                     : "arrived: ranks ");
            if (shown++ >= COMM_LIST_MAX) continue;
            if (pass == 0) {
                comm_peer_state(&w->board, s, st, sizeof st);
                comm_app(buf, n, &len, "%srank %d (global %d, %s, at #%llu of this group)",
                         shown > 1 ? ", " : "", i, g->global[i], st, seq);
            } else if (pass == 1) { /* a network or a remote host: name it */
                comm_app(buf, n, &len, "%srank %d (global %d on host %s)", shown > 1 ? ", " : "",
                         i, g->global[i], comm_world_host(w, g->global[i]));
            } else {
                comm_app(buf, n, &len, "%s%d", shown > 1 ? "," : "", i);
                exited_after +=
                    pass == 2 && s && w->board.pids_ok && comm_pid_exited(atomic_load(&s->pid));
            }
        }
        if (total > COMM_LIST_MAX) comm_app(buf, n, &len, " ... (%d in all)", total);
        counts[pass] = total;
    }
    /* arrived, then died: named only when no rank is missing (otherwise a
     * survivor that already failed and exited would be named too) */
    if (counts[0] > 0) exited_after = 0;
    for (int i = 0, shown = 0; exited_after && i < g->size; i++) {
        comm_board_slot *s = i == g->rank ? NULL : comm_board_slot_of(w, g->global[i]);
        if (!s || atomic_load_explicit(&s->seq[g->gid], memory_order_acquire) < r->seq ||
            !comm_pid_exited(atomic_load(&s->pid)) || shown++ >= COMM_LIST_MAX)
            continue;
        comm_peer_state(&w->board, s, st, sizeof st);
        comm_app(buf, n, &len, "%srank %d (global %d, %s)",
                 shown > 1 ? ", " : "; exited inside the op: ", i, g->global[i], st);
    }
    if (counts[0] == 0 && counts[1] == 0 && !exited_after)
        comm_app(buf, n, &len,
                 " (every rank arrived: a peer failed inside the op, or MPI is stuck)");
}

void comm_board_peer_state(comm_world *w, int gr, char *buf, size_t n) {
    comm_board_slot *s = comm_board_slot_of(w, gr);
    if (s)
        comm_peer_state(&w->board, s, buf, n);
    else if (!w->board.shm)
        snprintf(buf, n, "state unknown (no arrival board: %s)", w->board.why_off);
    else
        snprintf(buf, n, "on host %s (another host), state unknown", comm_world_host(w, gr));
}

void comm_board_describe(comm_world *w, const comm_req *r, char *buf, size_t n) {
    const comm_group *g = r->g;
    char st[160];
    buf[0] = 0;
    if (!w->board.shm) {
        snprintf(buf, n, "which ranks did not arrive is unknown (no arrival board: %s)",
                 w->board.why_off);
    } else if (r->kind == COMM_K_SEND || r->kind == COMM_K_RECV) {
        comm_board_slot *s = comm_board_slot_of(w, g->global[r->peer]);
        if (s) comm_peer_state(&w->board, s, st, sizeof st);
        if (s)
            snprintf(buf, n, "peer rank %d (global %d): %s", r->peer, g->global[r->peer], st);
        else
            snprintf(buf, n, "peer rank %d (global %d) on host %s (another host), state unknown",
                     r->peer, g->global[r->peer], comm_world_host(w, g->global[r->peer]));
    } else if (comm_is_collective(r)) {
        comm_describe_collective(w, r, buf, n);
    } else {
        size_t len = 0;
        for (int i = 0; i < g->size; i++) {
            comm_board_slot *s = comm_board_slot_of(w, g->global[i]);
            if (s && w->board.pids_ok && comm_pid_exited(atomic_load(&s->pid)))
                comm_app(buf, n, &len, "%srank %d (global %d) exited", len ? ", " : "", i,
                         g->global[i]);
        }
        if (!len)
            snprintf(buf, n,
                     "arrival not tracked for this op (group '%s' board slot %d); no member "
                     "on this host has exited",
                     g->name, g->gid);
    }
}
