/* comm_internal.h - the MPI implementation's private structures, shared by
 * comm_world.c (init/finalize, options), comm_thread.c (the communication
 * thread: posting, progress, deadlines), comm_ops.c (the public op calls,
 * wait/test), comm_group.c (groups) and comm_board.c (the arrival board).
 * Not for use outside src/comm/.
 *
 * Locking: w->mu guards the submission queue, every request's state /
 * status / abandoned fields, the free list, the poison fields, the timeout
 * and each group's next_seq.  Fields marked "comm thread" are touched only
 * by the communication thread (or by init/finalize while it is not running).
 */
#ifndef MS_COMM_INTERNAL_H
#define MS_COMM_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdint.h>

#include "comm/comm.h"

#define COMM_NAME_MAX 32
#define COMM_MSG_MAX 1536
#define COMM_BOARD_MAX_GROUPS 256 /* board slots per rank (group ids 0..255) */
#define COMM_DEAD_GRACE_S 1.0     /* keep progressing this long after a peer is seen dead */
#define COMM_WAIT_GRACE_S 2.0     /* waiter's backstop beyond the deadline (stuck comm thread) */

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
    /* under w->mu */
    int state;
    int abandoned; /* the waiter gave up (stuck comm thread): comm thread frees it */
    ms_status status;
    char msg[COMM_MSG_MAX];
    /* comm thread */
    MPI_Request mreq;
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
    uint64_t next_seq; /* under w->mu: last collective sequence number handed out */
};

struct comm_world {
    int rank, size;
    int own_mpi; /* we called MPI_Init, so we finalize */
    int poll_max_us;
    comm_group *world_group;
    int next_gid; /* comm thread: lowest board slot this rank has not used */
    comm_board board;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t submit_cv; /* comm thread waits here when idle */
    pthread_cond_t done_cv;   /* waiters wait here */
    /* under mu */
    double timeout_s;
    comm_req *q_head, *q_tail;
    comm_req *free_list;
    int stop;
    int poisoned;
    double t_poisoned;
    ms_status poison_code;
    char poison_msg[COMM_MSG_MAX];

    /* comm thread: posted requests */
    comm_req **active;
    MPI_Request *mreqs;
    int *idx;
    MPI_Status *sts;
    int nactive, cap;
    double last_dead_check;
};

/* comm_world.c */
/* MPI datatype / op for our enums. */
MPI_Datatype comm_mpi_dtype(comm_dtype dt);
MPI_Op comm_mpi_op(comm_redop op);
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

/* comm_ops.c */
/* Take a request from the free list (w->mu not held); zeroed. */
comm_req *comm_req_alloc(comm_world *w);
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

/* comm_board.c */
/* Create the board over MPI_COMM_WORLD (collective; called by init). */
ms_status comm_board_init(comm_world *w, int enable);
void comm_board_free(comm_world *w);
/* Publish this rank's arrival at collective seq on group g. */
void comm_board_arrive(comm_world *w, const comm_group *g, uint64_t seq);
void comm_board_heartbeat(comm_world *w);
/* Number of peers r waits for whose process is known to have exited before
 * arriving (collective) or the p2p peer if it exited. */
int comm_board_dead_missing(comm_world *w, const comm_req *r);
/* Append "not arrived: ...; arrived: ..." (or the p2p peer's state) to buf. */
void comm_board_describe(comm_world *w, const comm_req *r, char *buf, size_t n);

#endif
