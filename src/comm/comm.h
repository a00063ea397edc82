/* comm.h - the communicator interface: a world of ranks, named groups of
 * ranks, and asynchronous collectives / point-to-point ops with handles.
 *
 * Who calls it: the trainer (through the rank grid, comm/grid.h), the
 * tensor/pipeline/data-parallel layers, checkpoint sharding, benchmarks.
 * The interface is backend-neutral (no MPI, CUDA or NCCL types here).  Two
 * implementations carry the same calls: MPI (always; host buffers, and
 * device buffers staged through pinned host memory when the backend has
 * registered a comm_device), and NCCL (built when NCCL is found; only on
 * groups that called comm_group_enable_nccl, only for ops whose buffers are
 * all device memory).  Conventions follow NCCL where MPI and NCCL differ
 * (in-place layouts of all-gather / reduce-scatter, equal blocks).
 *
 * Model.  comm_world_init() starts MPI (a single process without mpirun is
 * a world of size 1) and one communication thread per process.  Every op
 * (comm_*_start) only enqueues a request and returns a handle at once; the
 * communication thread posts the MPI non-blocking call and keeps calling
 * MPI_Testsome, so the op progresses while the caller computes.  comm_wait()
 * blocks until the op finished (or failed) and frees the handle;
 * comm_test() polls without blocking.  Ops on one group must be started in
 * the same order on every member (as in MPI and NCCL); ops on different
 * groups may interleave freely.
 *
 * Device buffers over MPI (comm_world_set_device).  The backend registers a
 * table of hooks (is_device, copies, pinned allocation).  An op whose buffer
 * is device memory is then staged: comm_*_start copies the send data into a
 * pinned staging buffer (on the caller's thread, before returning) and the
 * MPI call runs on the staging buffers; comm_wait copies the received data
 * back into the device buffer (caller's thread) before returning.  The
 * communication thread only ever sees host memory and makes no device call.
 * comm_test never copies: after it says done, the device buffer is filled
 * only by the comm_wait that follows.  Host buffers pass through unchanged.
 * Staging buffers come from a pool owned by the world: size classes of
 * 4 KiB and then four steps per power of two (a buffer is at most 25 %
 * larger than asked), each class a free list; a class grows only when every
 * buffer of it is in use, so the pool settles at the peak number of
 * concurrently staged bytes per class (+<= 25 %) and a repeating training
 * step allocates nothing once warm.  The pool is freed by
 * comm_world_finalize.
 *
 * NCCL (comm_group_enable_nccl).  After the call, an op on that group whose
 * buffers are all device memory (and count > 0) is enqueued on the group's
 * own NCCL stream, which first waits for everything already enqueued on the
 * compute stream given to enable; comm_wait makes the compute stream wait
 * for the op (the host does not block unless options.nccl_sync) and
 * comm_test asks the op's event.  Send/recv on an NCCL group are launched
 * together (one ncclGroupStart/End) at the first wait or test of one of them
 * or the next collective on the group, so a ring of recv + send started
 * back to back cannot deadlock; tags are ignored (order matches).  Deadlines
 * hold as for MPI: a watchdog thread per NCCL group watches every op in
 * flight; one that misses its deadline aborts the NCCL communicator
 * (ncclCommAbort) and breaks the world with MS_ERR_TIMEOUT naming the op
 * and the group (with nccl_sync, the waiting comm_wait reports it itself).
 * Every member must pick the same path for an op (the same buffers are
 * device memory on every rank), or the group hangs until the deadline.
 *
 * Timeouts and faults.  Every op has a deadline (options.timeout_s, default
 * 300 s; the trainer's --comm-timeout, env MS_COMM_TIMEOUT).  An op that misses it
 * fails with MS_ERR_TIMEOUT and a message naming the op, the group, the
 * elapsed time and which ranks had not arrived (from the arrival board, see
 * comm_board.c; on another host their state is "unknown").  A peer whose
 * process has exited before arriving makes the op fail early (about 1-2 s)
 * with the same kind of message.  After a timeout the world is "broken":
 * the timed-out MPI request can never be completed or cancelled, so every
 * later op fails at once, the communication thread stops calling MPI (no
 * buffer is touched afterwards; the staging buffers of the failed ops are
 * never reused), and comm_world_finalize() reports the
 * failure instead of finalizing MPI.  The process should then exit (the
 * supervisor restarts the job).  Errors reported by MPI itself are returned
 * as MS_ERR_INTERNAL with MPI's message; they do not break the world.
 *
 * Memory.  comm_world_init/comm_group_create_* allocate objects that the
 * caller frees with comm_world_finalize/comm_group_destroy.  Buffers passed
 * to an op belong to the caller and must stay valid and untouched until
 * comm_wait() returns (for an NCCL op: until the compute stream has passed
 * the point where comm_wait was called; the host must synchronise with that
 * stream before reading the result).  Handles are freed by comm_wait() (or
 * comm_wait_all).
 *
 * Thread-safety: every function may be called from any thread, but the ops
 * of one group must be started in one agreed order (one thread per group,
 * or the caller serialises).  Making a group (comm_group_create_split) is an
 * op of its parent, and a blocking one: groups are made in one agreed order
 * on every rank, by one thread at a time (two threads making groups of one
 * world at once can block each rank in another's MPI_Comm_split for ever;
 * the trainer makes them all on its main thread, before the step loop).
 * A handle may be waited on by one thread.
 * comm_world_init/finalize are called once per process by the main thread
 * (MPI cannot be initialised twice).  While the world is up, no other code
 * may call MPI directly: MPI runs at MPI_THREAD_SERIALIZED, and every call
 * is made under the world's MPI lock, by the communication thread or by a
 * thread starting an op that posts it at once (comm_thread.c).
 */
#ifndef MS_COMM_H
#define MS_COMM_H

#include <stddef.h>

#include "base/status.h"

typedef struct comm_world comm_world;
typedef struct comm_group comm_group;
typedef struct comm_req comm_req;

typedef enum {
    COMM_F32 = 0,
    COMM_F64,
    COMM_I32,
    COMM_I64,
    COMM_U8,
    COMM_BF16, /* bfloat16; reductions convert to fp32, combine, round to nearest even */
} comm_dtype;

typedef enum { COMM_SUM = 0, COMM_MAX, COMM_MIN } comm_redop;

typedef struct {
    double timeout_s; /* per-op deadline; <= 0: default 300 s (megascale: --comm-timeout) */
    int poll_max_us;  /* comm thread's longest sleep between MPI_Testsome calls; <= 0: 1000 */
    int no_board;     /* 1: do not create the arrival board (missing ranks then "unknown") */
    int nccl_sync;    /* 1: comm_wait on an NCCL op blocks the host until it finished or
                         missed its deadline; 0: the compute stream waits, the group's
                         watchdog enforces the deadline (megascale: --comm-nccl-sync) */
} comm_options;

/* Defaults: timeout 300 s, poll 1000 us, board on, nccl_sync off. */
comm_options comm_options_default(void);

/* Size in bytes of one element of dt. */
size_t comm_dtype_size(comm_dtype dt);
/* "f32", "f64", ... */
const char *comm_dtype_name(comm_dtype dt);

/* ---- world --------------------------------------------------------------- */

/* Initialise MPI (MPI_THREAD_SERIALIZED: all MPI calls after init are made
 * by the communication thread), the arrival board and the communication
 * thread.  argc/argv may be NULL.  opt may be NULL (defaults).  If MPI was
 * already initialised by someone else, it is used and not finalised here.
 * Errors: MS_ERR_ARG (nccl_sync not 0 or 1), MS_ERR_INTERNAL (MPI, threads). */
ms_status comm_world_init(comm_world **w, int *argc, char ***argv, const comm_options *opt);

/* Barrier on the world (with the timeout), stop the communication thread,
 * free the world group and MPI_Finalize.  Groups created from the world
 * should be destroyed first.  If the world is broken (a timeout happened),
 * MPI is not finalised (it would hang on the missing rank) and the original
 * failure is returned: the caller should report it and exit.  Always frees
 * what it safely can; w may be NULL. */
ms_status comm_world_finalize(comm_world *w);

int comm_world_rank(const comm_world *w);
int comm_world_size(const comm_world *w);
/* The world as a group named "world" (owned by the world). */
comm_group *comm_world_group(comm_world *w);
/* Current per-op timeout in seconds; the setter applies to ops started later. */
double comm_world_timeout(const comm_world *w);
void comm_world_set_timeout(comm_world *w, double seconds);
/* 1 after a timeout broke the world (see above). */
int comm_world_broken(const comm_world *w);
/* Break the world for a failure outside the communicator (a wait for a rank,
 * comm_world_wait_begin, that timed out), as a timeout of its own breaks it: later ops are
 * refused at once with msg (before, a follower of a hung batch-ring leader then waited out a
 * gate's collective for the same rank: twice the time to report), and MPI is not finalised.
 * The first failure wins; w NULL: nothing. */
void comm_world_fail(comm_world *w, ms_status code, const char *msg);
/* comm_world_fail for a wait outside the communicator for world rank `peer` (rank `member`
 * of the group it was waited for in: the batch ring's) that gave up with msg, and the failure
 * returned as this thread's error, msg followed by the peer's state on the arrival board in
 * the form a point-to-point op's timeout gives it ("; peer rank M (global G): pid P not
 * responding for 2.1 s (stopped?)").  The board is let settle first (at most 2.5 s), as for
 * an op's timeout: before, a ring leader stopped a moment before its follower's
 * --comm-timeout of 1 s was not told from a live one, and the supervisor booked the hang on
 * the follower that reported it.  A world broken during the settle (a collective that
 * timed out meanwhile) returns that failure, as comm_world_check does.  peer < 0: msg alone. */
ms_status comm_world_fail_wait(comm_world *w, int peer, int member, ms_status code,
                               const char *msg);
/* MS_OK, or once the world is broken its failure as this thread's error ("comm: WHAT: world
 * broken by an earlier failure: ...", the code the failure had): for a wait outside the
 * communicator (comm_world_wait_begin) that a broken world will never end.  w NULL: MS_OK. */
ms_status comm_world_check(const comm_world *w, const char *what);
/* Hosts (comm_hosts.c): the host name of world rank `rank` (its
 * gethostname(), at most 63 bytes; "?" for a rank outside the world), its
 * host's index (hosts numbered 0.. in the order of their lowest world
 * rank), and the number of hosts.  Gathered once by comm_world_init;
 * read-only afterwards, so thread-safe. */
const char *comm_world_host(const comm_world *w, int rank);
int comm_world_host_index(const comm_world *w, int rank);
int comm_world_n_hosts(const comm_world *w);

/* Device memory hooks, given by the backend (comm includes no CUDA header).
 * Every hook is called only on threads that call comm_*_start, comm_wait or
 * comm_wait_all (never on the communication thread), so a per-thread device
 * context set by the backend on those threads is in effect.  to_host must
 * see every write already enqueued to src (e.g. copy on the compute stream,
 * then synchronise it: a plain cudaMemcpy does not wait for a non-blocking
 * stream); to_device must finish before returning (the staging buffer is
 * reused at once). */
typedef struct {
    void *ctx;                                  /* passed back to every hook */
    int (*is_device)(void *ctx, const void *p); /* 1 if p is device memory */
    void (*to_host)(void *ctx, void *dst, const void *src, size_t n);   /* returns when done */
    void (*to_device)(void *ctx, void *dst, const void *src, size_t n); /* returns when done */
    void *(*host_alloc)(void *ctx, size_t n); /* pinned host memory; NULL on failure */
    void (*host_free)(void *ctx, void *p);
} comm_device;

/* Register the device hooks (copied; every pointer must be set) so that
 * MPI ops on device buffers are staged through pinned host memory (see
 * "Device buffers over MPI" above).  dev NULL: host only again (device
 * pointers are then handed to MPI as they are).  Call with no op in flight;
 * frees the staging pool allocated through the previous hooks.
 * Errors: MS_ERR_ARG (a NULL hook). */
ms_status comm_world_set_device(comm_world *w, const comm_device *dev);

/* Hang dumps (docs/formats.md, "Hang dump"): when an op of this rank
 * times out or cannot finish (a peer exited), the communication thread
 * writes a JSON dump of every group's in-flight and last completed ops to
 * `path` (atomically), and asks the other ranks of this host to write
 * theirs (each to its own path), which they do within 0.2 s.  path NULL or
 * "": no dumps (the default).  Errors: MS_ERR_ARG (path too long). */
ms_status comm_world_set_dump_path(comm_world *w, const char *path);
/* After this rank's op failed with MS_ERR_TIMEOUT: wait (at most max_s)
 * until every live, responsive rank of the host has written its dump, so
 * that exiting (which makes mpirun end the job) does not cut them off.
 * Returns how many are still missing (a stopped rank never answers). */
int comm_world_dump_grace(comm_world *w, double max_s);
/* SIGUSR2 dump requests this rank's communication thread has answered so
 * far (a dump written, or kept: the one of its own timeout); the beats
 * carry it, so the supervisor knows when the dumps it asked for are
 * there.  NULL: 0.  Thread-safe. */
int comm_world_dumps(comm_world *w);

/* Bytes moved by this rank's completed ops so far (the MPI path; for the
 * heartbeats).  Thread-safe. */
long long comm_world_bytes(comm_world *w);
/* Nanoseconds the threads of this process have spent blocked in comm_wait
 * (and the blocking conveniences built on it) so far, all threads together
 * (the trainer's, and a checkpoint's stage-2 thread while it persists); a
 * step's delta overcounts while another thread waits too: the trainer
 * uses comm_thread_wait_ns.  NULL: 0.  Thread-safe. */
long long comm_world_wait_ns(const comm_world *w);
/* Nanoseconds the calling thread has spent blocked in comm_wait so far,
 * over every world: the trainer's own waits, the exposed communication of
 * its step (a checkpoint thread persisting meanwhile is not in it). */
long long comm_thread_wait_ns(void);
/* Seconds the longest of this process's comm_wait calls in progress has
 * blocked so far, 0 when no thread waits (the heartbeats: a rank whose
 * training thread is stuck elsewhere waits in nothing, while its peers
 * block in communication waiting for it).  A background thread's waits
 * (comm_thread_set_background) are not counted.  NULL: 0.  Thread-safe. */
double comm_world_blocked_s(comm_world *w);
/* This thread's waits from now on are a background thread's (on != 0): a
 * checkpoint's persist thread, whose collectives wait for the slowest
 * writer.  comm_world_blocked_s leaves them out (before, the persist
 * thread of a rank stuck in its training thread, waiting for a slow
 * writer, made that rank look like one blocked in communication, and the
 * supervisor named a rank waiting for it); the hang dumps still list them. */
void comm_thread_set_background(int on);
/* A wait on another rank outside the communicator (a follower of the tp
 * group's shared-memory batch ring waiting for its leader, the leader for
 * a follower): comm_world_blocked_s counts it from this call until
 * comm_world_wait_end, as it counts a comm_wait, so that the heartbeats of
 * the ranks waiting there do not make them look like the stuck one, and a
 * hang dump written meanwhile lists it (a group named `where`, a static
 * string such as "batch_ring", with an op "wait_for" on global rank peer,
 * -1 if unknown).  Not added to the wait counters.  Returns the token for
 * comm_world_wait_peer and comm_world_wait_end (-1 when no slot was free or
 * w is NULL: then it is not counted).  Thread-safe. */
int comm_world_wait_begin(comm_world *w, const char *where, int peer);
/* The rank the wait `token` waits for from now on (a ring's leader waits
 * for one follower, then another). */
void comm_world_wait_peer(comm_world *w, int token, int peer);
void comm_world_wait_end(comm_world *w, int token);
/* The same for the ops of group g alone (a parallel dimension's exposed
 * communication: the trainer reads the tp, dp and pp groups'; a group
 * split later, such as pp's "embedding", counts on its own).  NULL: 0.
 * Thread-safe. */
long long comm_group_wait_ns(const comm_group *g);

/* ---- groups -------------------------------------------------------------- */

/* Collective over every member of parent: members passing the same color
 * form a new group named `name`, ordered by key (ties by parent rank).
 * color < 0: this rank joins no group and *out is NULL.  Costs O(1)
 * collectives however many groups are formed: a barrier on the parent
 * (non-blocking, so a missing rank is reported like in any op), one
 * MPI_Comm_split, and one small all-reduce on the new group (to agree on
 * its arrival-board slot). */
ms_status comm_group_create_split(comm_group *parent, int color, int key, const char *name,
                                  comm_group **out);

/* Collective over the listed members of parent only (MPI_Comm_create_group):
 * ranks[0..n) are parent ranks, in the order of the new group.  Ranks not in
 * the list must not call it. */
ms_status comm_group_create_ranks(comm_group *parent, const int *ranks, int n, const char *name,
                                  comm_group **out);

/* Free a group created above (not the world group).  Local; NULL is ignored.
 * No op may be outstanding on it. */
void comm_group_destroy(comm_group *g);

/* Collective over g: give g an NCCL communicator, so that its ops on device
 * buffers run as NCCL calls (see "NCCL" above).  cuda_stream (a
 * cudaStream_t; NULL is the legacy default stream) is the caller's compute
 * stream: NCCL ops wait for the work enqueued on it, and comm_wait makes it
 * wait for them.  The CUDA device must already be set on this thread; the
 * group's ops must then be started and waited on threads using that device.
 * Rank 0 of g makes the NCCL id and broadcasts it over MPI; all members then
 * create the communicator (under the op timeout).  Errors (the same on every
 * member): MS_ERR_INTERNAL when NCCL is not built in, when two members use
 * the same GPU (NCCL cannot do that: use the MPI staging path for such a
 * group), or when a CUDA/NCCL call fails; MS_ERR_TIMEOUT if a member never
 * comes; MS_ERR_ARG if g already has NCCL.  On failure g stays usable over
 * MPI.  comm_group_destroy / comm_world_finalize free the communicator. */
ms_status comm_group_enable_nccl(comm_group *g, void *cuda_stream);
/* 1 if g has an NCCL communicator (comm_group_enable_nccl succeeded). */
int comm_group_has_nccl(const comm_group *g);

const char *comm_group_name(const comm_group *g);
int comm_group_size(const comm_group *g);
int comm_group_rank(const comm_group *g); /* this process's rank in g */
/* Global (world) rank of group rank i, 0 <= i < size. */
int comm_group_global_rank(const comm_group *g, int i);
comm_world *comm_group_world(const comm_group *g);

/* ---- asynchronous ops ---------------------------------------------------- */
/* Every _start function validates its arguments (MS_ERR_ARG naming the op
 * and group), refuses if the world is broken (MS_ERR_TIMEOUT), and otherwise
 * stores a handle in *req.  count is in elements of dt. */

/* recv[i] = op over ranks of send[i], i < count.  In place: send == recv. */
ms_status comm_allreduce_start(comm_group *g, const void *send, void *recv, size_t count,
                               comm_dtype dt, comm_redop op, comm_req **req);

/* send holds size*count elements (block j goes to rank j); recv (count) gets
 * the reduction of this rank's block.  In place: recv == send + rank*count
 * (elements); the other blocks of send are then undefined. */
ms_status comm_reduce_scatter_start(comm_group *g, const void *send, void *recv, size_t count,
                                    comm_dtype dt, comm_redop op, comm_req **req);

/* recv (size*count) gets every rank's send (count), in rank order.  In
 * place: send == recv + rank*count (elements). */
ms_status comm_allgather_start(comm_group *g, const void *send, void *recv, size_t count,
                               comm_dtype dt, comm_req **req);

/* buf (count) of group rank root is copied to every member's buf. */
ms_status comm_broadcast_start(comm_group *g, void *buf, size_t count, comm_dtype dt, int root,
                               comm_req **req);

/* Point-to-point to / from group rank peer.  Messages between two ranks
 * with the same tag are matched in the order they were started (an NCCL
 * implementation ignores tags and matches by order only, so callers should
 * start sends and recvs in the same order on both sides).  A recv must get
 * exactly count elements. */
ms_status comm_send_start(comm_group *g, const void *buf, size_t count, comm_dtype dt, int peer,
                          int tag, comm_req **req);
ms_status comm_recv_start(comm_group *g, void *buf, size_t count, comm_dtype dt, int peer, int tag,
                          comm_req **req);

ms_status comm_barrier_start(comm_group *g, comm_req **req);

/* Block until req finished; free it; return its status (with the message
 * recorded on the calling thread).  req == NULL returns MS_OK. */
ms_status comm_wait(comm_req *req);
/* Wait for all n handles (NULL entries skipped), free them all, return the
 * first failure. */
ms_status comm_wait_all(comm_req **reqs, int n);
/* *done = 1 if req has finished (successfully or not); never blocks and
 * never frees: call comm_wait() afterwards. */
ms_status comm_test(comm_req *req, int *done);
/* Monotonic times (ms_now) when req was started and finished (0 if not yet
 * finished): for timers.  Valid until comm_wait().  For an NCCL op the
 * finish time is when comm_test first saw it done (0 until then). */
void comm_req_times(const comm_req *req, double *t_start, double *t_done);

/* ---- blocking conveniences (start + wait) -------------------------------- */

ms_status comm_allreduce(comm_group *g, const void *send, void *recv, size_t count, comm_dtype dt,
                         comm_redop op);
ms_status comm_reduce_scatter(comm_group *g, const void *send, void *recv, size_t count,
                              comm_dtype dt, comm_redop op);
ms_status comm_allgather(comm_group *g, const void *send, void *recv, size_t count, comm_dtype dt);
ms_status comm_broadcast(comm_group *g, void *buf, size_t count, comm_dtype dt, int root);
ms_status comm_send(comm_group *g, const void *buf, size_t count, comm_dtype dt, int peer, int tag);
ms_status comm_recv(comm_group *g, void *buf, size_t count, comm_dtype dt, int peer, int tag);
ms_status comm_barrier(comm_group *g);

#endif
