/* comm_internal.h - the implementation's private structures, shared by
 * comm_world.c (init/finalize, options), comm_thread.c (the communication
 * thread: posting, progress, deadlines), comm_ops.c (the public op calls,
 * wait/test), comm_group.c (groups), comm_board.c (the arrival board),
 * comm_stage.c (device buffers staged through pinned host memory),
 * comm_bf16.c (bf16 reductions over MPI) and comm_nccl*.c (NCCL groups,
 * with their own comm_nccl_internal.h).
 * Not for use outside src/comm/.
 *
 * Locking: w->mu guards the submission queue, every request's state /
 * status / abandoned fields, the free list, the poison fields, the timeout
 * and each group's next_seq.  w->stage_mu guards the staging pool (taken
 * after w->mu when both are held).  Fields marked "comm thread" are touched
 * only by the communication thread (or by init/finalize while it is not
 * running); fields marked "caller" only by the thread that started / waits
 * on the request.
 */
#ifndef MS_COMM_INTERNAL_H
#define MS_COMM_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "comm/comm.h"

#define COMM_NAME_MAX 32
#define COMM_MSG_MAX 1536
#define COMM_HARD_POLL_S 0.005 /* a wait's first 5 ms: the comm thread polls without sleeping */
/* A message that MPI moves in many fragments (shared memory without a
 * single-copy mechanism, TCP) advances by about one fragment per progress
 * call, so each poll the back-off skips costs a fragment's worth of time.
 * From the post of an op of at least COMM_STREAM_MIN_BYTES the comm thread
 * polls without sleeping until the large ops still in flight could have
 * moved one after another at COMM_STREAM_MIN_RATE bytes/s, each from its
 * post plus COMM_HARD_POLL_S (w->stream_until, counted again whenever an
 * op finishes); longer, an op waits for a peer, and the back-off resumes. */
#define COMM_STREAM_MIN_BYTES (256 << 10)
#define COMM_STREAM_MIN_RATE 0.25e9
#define COMM_BOARD_MAX_GROUPS 256 /* board slots per rank (group ids 0..255) */
#define COMM_DEAD_GRACE_S 1.0     /* keep progressing this long after a peer is seen dead */
#define COMM_WAIT_GRACE_S 2.0     /* waiter's backstop beyond the deadline (stuck comm thread) */
/* The most a timeout's report may take (two settles of the board of 2.5 s each, the dump
 * written): how long past it a waiter still waits for the comm thread */
#define COMM_REPORT_S 10.0
#define COMM_STAGE_CLASSES 256    /* staging pool size classes (see comm_stage.c) */
#define COMM_WAIT_SLOTS 8         /* callers blocked at once that comm_world_blocked_s sees */

typedef enum {
    COMM_K_ALLREDUCE = 0,
    COMM_K_REDUCE_SCATTER,
    COMM_K_ALLGATHER,
    COMM_K_BCAST,
    COMM_K_SEND,
    COMM_K_RECV,
    COMM_K_BARRIER,
    COMM_K_SPLIT,  /* an MPI_Ibarrier, then MPI_Comm_split on the comm thread */
    COMM_K_CREATE, /* executed synchronously (blocking) by the comm thread */
    COMM_K_FREE,   /* idem (local) */
} comm_kind;

enum { COMM_REQ_QUEUED = 0, COMM_REQ_ACTIVE, COMM_REQ_DONE };

/* A pinned staging buffer of the pool (comm_stage.c). */
typedef struct comm_stage_buf {
    void *p;
    size_t cap; /* bytes; fixed by the size class */
    int cls;
    struct comm_stage_buf *next;
} comm_stage_buf;

/* An NCCL group's state (comm_nccl.c). */
typedef struct comm_nccl comm_nccl;

#define COMM_HOST_MAX 64 /* bytes of a host name, NUL included (longer ones are cut) */
/* comm_hosts.c: gather the host names (collective over MPI_COMM_WORLD,
 * before the communication thread starts); free them. */
ms_status comm_hosts_init(comm_world *w);
void comm_hosts_free(comm_world *w);

/* The arrival board, see comm_board.c. */
typedef struct comm_board_shm comm_board_shm;
typedef struct {
    comm_board_shm *shm; /* NULL: no board (disabled or failed) */
    size_t len;
    int local_idx;       /* this rank's slot */
    int pids_ok;         /* peers' pids are visible (same pid namespace): liveness known */
    int *world_to_local; /* [world size]: slot of a world rank, -1 on another host */
    char why_off[128];   /* why there is no board, for messages */
} comm_board;

struct comm_req {
    comm_world *w;
    comm_group *g;
    comm_kind kind;
    const void *send;
    void *recv;
    size_t count;
    comm_dtype dt;
    comm_redop op;
    int peer, tag, root; /* group ranks */
    int inplace;
    uint64_t seq; /* collective sequence number on g (1-based), 0 for p2p */
    double t_start, t_done, deadline, t_dead_seen;
    double t_posted; /* comm thread: when the MPI call was posted (timers) */
    /* under w->mu */
    int state;
    int abandoned; /* the waiter gave up (stuck comm thread): comm thread frees it */
    ms_status status;
    char msg[COMM_MSG_MAX];
    /* comm thread */
    MPI_Request mreq;
    size_t got; /* comm thread: elements a recv received */
    /* device staging (caller): pinned buffers held, and the copy back at
     * wait: stage_bytes from stage_src (= recv after staging) to stage_out */
    comm_stage_buf *stage[2];
    void *stage_out;
    size_t stage_bytes;
    /* NCCL (caller): the op runs on g->nccl; slot index of its completion
     * event, -1 while a send/recv waits to be launched */
    int on_nccl;
    int nccl_slot;
    /* group creation: arguments and result */
    int color, key, nranks;
    const int *ranks;
    char name[COMM_NAME_MAX];
    comm_group *out;
    comm_req *next;
};

struct comm_group {
    comm_world *w;
    MPI_Comm comm; /* comm thread (and init/finalize) */
    char name[COMM_NAME_MAX];
    int size, rank;
    int *global;       /* [size] world rank of each member */
    int gid;           /* arrival-board slot, agreed by all members; -1: none */
    comm_nccl *nccl;   /* NULL unless comm_group_enable_nccl succeeded */
    uint64_t next_seq; /* under w->mu: last collective sequence number handed out */
    /* comm thread: the last op that completed, for hang dumps (comm_dump.c) */
    int last_kind; /* -1: none yet */
    uint64_t last_seq;
    size_t last_bytes;
    int last_peer, last_tag; /* global peer of a p2p op, else -1 */
    double last_done;
    uint64_t done_seq;         /* the highest collective sequence number completed */
    uint16_t ev_lane, ev_name; /* event recorder ids: lane "comm:<name>", name */
    _Atomic long long wait_ns; /* callers' time in comm_wait on this group's ops */
};

struct comm_world {
    int rank, size;
    int own_mpi; /* we called MPI_Init, so we finalize */
    int poll_max_us;
    int nccl_sync; /* options.nccl_sync */
    comm_group *world_group;
    MPI_Op bf16_op[3]; /* MPI_Op for COMM_BF16 by comm_redop; MPI_OP_NULL: not created */

    /* device staging: hooks (set with no op in flight) and the pool */
    int has_dev;
    comm_device dev;
    pthread_mutex_t stage_mu;
    /* under stage_mu */
    comm_stage_buf *stage_free[COMM_STAGE_CLASSES];
    size_t stage_pinned; /* bytes allocated through dev.host_alloc */
    int stage_nbuf;      /* buffers allocated */
    int stage_lost;      /* buffers left to MPI by failed ops (never reused) */
    int next_gid;        /* comm thread: lowest board slot this rank has not used */
    comm_board board;
    /* hosts (comm_hosts.c): every rank's gethostname(), set at init */
    char (*host_name)[COMM_HOST_MAX]; /* [size] */
    int *host_of;                     /* [size]: host index, in order of the lowest rank */
    int n_hosts;

    /* timers and hang dumps (comm_dump.c) */
    uint16_t ev_kind[COMM_K_BARRIER + 1]; /* event names of the ops */
    uint16_t ev_wait;                     /* "wait": a caller blocked in comm_wait */
    int has_coord;                        /* set by comm_grid_create */
    int coord[3], shape[3];               /* (dp, pp, tp) */
    char dump_path[4096];                 /* "": no hang dumps; set with the world idle */
    unsigned long long dump_seen;         /* comm thread: board dump requests handled */
    int dumped; /* comm thread: this rank asked the host's others, or answered one that did */
    int signal_seen;                      /* comm thread: ms_ctx dump_requests handled */
    double signal_dump_t;                 /* comm thread: when its last SIGUSR2 dump ended */
    _Atomic int dump_answers;             /* SIGUSR2 requests answered (comm_world_dumps) */
    int dump_final; /* comm thread: the dump of this rank's own timeout is written; every op
                       failed right after, so a later one would show nothing in flight */
    _Atomic long long bytes_done;         /* bytes of the ops completed (comm_world_bytes) */
    _Atomic long long wait_ns;            /* callers' time in comm_wait (comm_world_wait_ns) */
    /* when each caller now blocked in comm_wait began (ms_ev_now, negated for
     * a background thread's wait; 0: a free slot; a caller past the slots
     * goes unseen): comm_world_blocked_s */
    _Atomic long long wait_since[COMM_WAIT_SLOTS];
    /* a wait outside the communicator (comm_world_wait_begin): where (NULL:
     * a comm_wait, whose op the dump lists with its group) and for whom */
    _Atomic(const char *) wait_where[COMM_WAIT_SLOTS];
    _Atomic int wait_peer[COMM_WAIT_SLOTS];
    comm_group **groups;                  /* comm thread (and init/finalize): live groups */
    int ngroups, cap_groups;

    pthread_t thread;
    int thread_started;
    /* Held by whichever thread calls MPI once the comm thread runs (MPI is
     * initialised SERIALIZED): the comm thread while it takes the queue,
     * posts, progresses and checks deadlines, or a caller posting its own
     * request (comm_enqueue).  Taken before mu, never while holding it
     * (callers only try it). Guards the "posted requests" below. */
    pthread_mutex_t mpi_mu;
    pthread_mutex_t mu;
    pthread_cond_t submit_cv; /* comm thread waits here when idle */
    pthread_cond_t done_cv;   /* waiters wait here */
    /* under mu */
    double timeout_s;
    comm_req *q_head, *q_tail;
    comm_req *free_list;
    int kicked;             /* a caller posted a request itself: the comm thread must poll */
    int n_waiting;          /* callers blocked in comm_wait on a host op */
    double hard_poll_until; /* until then, with n_waiting > 0, the comm thread polls hard */
    int stop;
    int poisoned;
    double t_poisoned;
    /* until then the comm thread writes a timeout's report (comm_timeout: the board settles,
     * the hang dump is written): a waiter past its deadline's grace waits for it, never
     * abandons its op as "communication thread blocked" meanwhile; 0: none */
    double reporting_until;
    ms_status poison_code;
    char poison_msg[COMM_MSG_MAX];

    /* under mpi_mu: posted requests */
    double stream_until; /* until then the comm thread polls hard (COMM_STREAM_MIN_BYTES) */
    int dev_compute;     /* the ranks compute on a device (has_dev): their cores are free */
    comm_req **active;
    MPI_Request *mreqs;
    int *idx;
    MPI_Status *sts;
    int nactive, cap;
    double last_dead_check;
};

/* comm_world.c */
/* MPI datatype / op for our enums (bf16 reductions use w's own ops). */
MPI_Datatype comm_mpi_dtype(comm_dtype dt);
MPI_Op comm_mpi_op(const comm_world *w, comm_dtype dt, comm_redop op);
/* "MPI_Xxx failed: <MPI_Error_string>" into buf. */
void comm_mpi_errstr(int rc, const char *call, char *buf, size_t n);
/* Record an MPI failure as the thread's message (MS_ERR_INTERNAL). */
ms_status comm_mpi_error(int rc, const char *call, const char *ctx);

/* comm_thread.c */
ms_status comm_thread_start(comm_world *w);
/* Ask the thread to stop once idle and join it (up to `wait_s`); 0 if joined. */
int comm_thread_stop(comm_world *w, double wait_s);
/* Mark the world broken (w->mu held); the first failure wins. */
void comm_poison_locked(comm_world *w, ms_status code, const char *msg);
/* Post a chain of requests in order (w->mpi_mu held): each becomes active,
 * or finishes at once (a group request, or the MPI call failed). */
void comm_post_batch(comm_world *w, comm_req *r);

/* comm_ops.c */
/* Take a request from the free list (w->mu not held); zeroed. */
comm_req *comm_req_alloc(comm_world *w);
/* Give a request that was never submitted back to the free list. */
void comm_req_free(comm_req *r);
/* Refuse (MS_ERR_TIMEOUT with the original failure) if the world is broken;
 * otherwise stamp r: sequence number if `collective`, start time, deadline. */
ms_status comm_req_stamp(comm_req *r, int collective);
/* Queue req for the comm thread, assigning the collective sequence number
 * when `collective`; fails (and frees req) if the world is broken. */
ms_status comm_submit(comm_req *req, int collective);
/* comm_wait that also hands back the group a creation request made. */
ms_status comm_wait_result(comm_req *r, comm_group **out);
/* "all_reduce #3 (1024 x f32) on group 'tp' (2 ranks)" into buf. */
void comm_req_describe(const comm_req *r, char *buf, size_t n);
const char *comm_kind_name(comm_kind k);

/* comm_group.c */
/* Allocate a group for comm (owned); fills size, rank, global ranks.
 * Comm thread (or init) only.  NULL on failure with buf set. */
comm_group *comm_group_wrap(comm_world *w, MPI_Comm comm, const char *name, char *err, size_t n);
void comm_group_free_struct(comm_group *g);
/* Run a group-creation request on the comm thread; sets r->status/msg. */
void comm_group_exec(comm_world *w, comm_req *r);

/* comm_stage.c */
/* Stage r's device buffers (w->has_dev): take pinned buffers, copy the send
 * data to them and point r at them.  Caller's thread, before comm_submit.
 * On failure nothing is held. */
ms_status comm_stage_prepare(comm_req *r);
/* What comm_wait needs from r after r is recycled. */
typedef struct {
    comm_stage_buf *buf[2];
    void *out;
    const void *src;
    size_t bytes;
} comm_stage_hold;
/* Move r's staging state into h (w->mu held; r is recycled afterwards). */
void comm_stage_take(comm_req *r, comm_stage_hold *h);
/* At comm_wait (no lock held): copy the result back to the device when the
 * op succeeded (or a recv was short: MS_ERR_RANGE), then give the buffers
 * back to the pool, unless the op failed in a broken world (MPI may still
 * own them: they are never reused). */
void comm_stage_finish(comm_world *w, comm_stage_hold *h, ms_status st);
/* Give buffers back without copying (a request refused before posting). */
void comm_stage_release(comm_world *w, comm_req *r);
/* Free the pool (no op in flight); returns the number of buffers freed. */
int comm_stage_pool_free(comm_world *w);

/* comm_bf16.c */
/* Create / free the bf16 MPI_Ops (init / finalize, not the comm thread). */
ms_status comm_bf16_ops_create(comm_world *w);
void comm_bf16_ops_free(comm_world *w);

/* comm_nccl.c (stubs without MS_HAVE_NCCL) */
/* 1 if r (built, not yet started) should run on its group's NCCL
 * communicator: the group has one and every buffer of r is device memory. */
int comm_nccl_wants(const comm_req *r);
/* Start r on NCCL (r stamped inside); on failure r is freed. */
ms_status comm_nccl_start(comm_req *r);
/* comm_wait / comm_test / comm_req_times for an NCCL request. */
ms_status comm_nccl_wait(comm_req *r);
ms_status comm_nccl_test(comm_req *r, int *done);
/* Free g's NCCL state (g->nccl set; no op in flight); with `broken`, the
 * communicator is aborted instead of destroyed (it may be stuck). */
void comm_nccl_group_free(comm_group *g, int broken);

/* comm_dump.c */
/* Intern the event names of the world (init). */
void comm_events_init(comm_world *w);
/* r finished (comm thread): record its span on its group's lane and keep
 * it as the group's last completed op. */
void comm_events_finish(comm_world *w, comm_req *r);
/* Write this rank's hang dump (comm thread; w->dump_path set): every
 * group's in-flight and last completed ops.  reason: "timeout",
 * "peer_exited", "peer_request" or "signal".  Own timeouts also ask the other
 * ranks of the host to dump (through the board), unless this rank already
 * took part in such a round (asked, or answered).  1 if a dump is on disk
 * (written now, or the own timeout's kept), 0 if it could not be written
 * (the request is acknowledged all the same: it is not tried again every
 * poll). */
int comm_dump_write(comm_world *w, const char *reason, int ask_peers);
/* Comm thread, periodically: dump if another rank of the host asked. */
void comm_dump_poll(comm_world *w);

/* comm_board.c */
/* Create the board over MPI_COMM_WORLD (collective; called by init). */
ms_status comm_board_init(comm_world *w, int enable);
void comm_board_free(comm_world *w);
/* Publish this rank's arrival at collective seq on group g. */
void comm_board_arrive(comm_world *w, const comm_group *g, uint64_t seq);
void comm_board_heartbeat(comm_world *w);
/* Number of peers of the unfinished op r whose process is known to have
 * exited: any member of a collective's group (one that exited after
 * arriving can still leave the op unfinishable: it may have had data left
 * to forward), or the p2p peer.  The caller waits a grace period first, so
 * data already in flight can land. */
int comm_board_dead_missing(comm_world *w, const comm_req *r);
/* Append "not arrived: ...; arrived: ..." (or the p2p peer's state) to buf. */
void comm_board_describe(comm_world *w, const comm_req *r, char *buf, size_t n);
/* World rank gr's state as a p2p op's report gives its peer's ("pid P alive, heartbeat 0.1 s
 * ago", "... not responding for 2.1 s (stopped?)", "process P exited"), or why it is unknown
 * (another host, no board). */
void comm_board_peer_state(comm_world *w, int gr, char *buf, size_t n);
/* Hang dumps: ask every rank of the host to dump (bumps the request
 * counter); read the counter; acknowledge request `gen` (this rank
 * dumped); count the live ranks of the host (other than this one) that
 * have not acknowledged `gen`. */
void comm_board_request_dump(comm_world *w);
unsigned long long comm_board_dump_requests(comm_world *w);
void comm_board_ack_dump(comm_world *w, unsigned long long gen);
int comm_board_dump_pending(comm_world *w, unsigned long long gen);
/* For hang dumps: '"unresponsive":[{"rank":R,"heartbeat_age_s":A},...],
 * "exited":[R,...]' about the other ranks of this host (JSON members),
 * whole JSON in any n >= 144: the ranks that do not fit are counted in
 * "unresponsive_omitted" and "exited_omitted" (present only then). */
void comm_board_host_states(comm_world *w, char *buf, size_t n);
/* One other rank of the host, as the board sees it. */
typedef struct {
    long long rank; /* world rank */
    double age_s;   /* its heartbeat's age */
    int exited;     /* its process is gone */
} comm_host_peer;
/* comm_board_host_states' text from the peers p[0..np) (unresponsive: a
 * heartbeat older than 2 s); "" if n < 144. */
void comm_host_states_format(const comm_host_peer *p, int np, char *buf, size_t n);
/* Before a hang dump or a timeout's report: wait (at most max_s, beating
 * this rank's own heartbeat meanwhile) until no other live rank of the
 * host has a heartbeat of an ambiguous age, past COMM_FRESH_S but not yet
 * COMM_STALE_S: a peer stopped a moment before this rank's op timed out
 * would otherwise be reported as alive, and the stuck rank not named. */
void comm_board_settle(comm_world *w, double max_s);

#endif
