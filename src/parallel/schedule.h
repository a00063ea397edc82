/* schedule.h - pipeline-parallel schedules as pure functions.
 *
 * par_schedule() turns (kind, pp, vpp, n_micro, stage) into the instruction
 * list one pipeline rank executes for one optimizer step: FWD/BWD of a
 * (micro-batch, model chunk) pair and the point-to-point traffic between
 * stages.  Two kinds, both following Megatron-LM:
 *  - PAR_SCHED_1F1B: non-interleaved 1F1B (PipeDream-Flush); vpp must be 1.
 *  - PAR_SCHED_INTERLEAVED: interleaved 1F1B with vpp model chunks per rank;
 *    needs pp >= 2 and n_micro % pp == 0.
 * Chunk c on stage s holds global model chunk g = c*pp + s, so activations
 * flow g -> g+1 (stage s -> s+1, wrapping from stage pp-1 to stage 0 and the
 * next chunk) and gradients g -> g-1.  Global chunk 0 receives no
 * activation and global chunk pp*vpp-1 receives no gradient (it owns the
 * loss).
 *
 * Communication is non-blocking: SEND_* / RECV_* post an operation and a
 * later WAIT completes it.  A posted operation completes once its peer has
 * posted the matching one (rendezvous, like NCCL and MPI's large
 * messages).  Where the posts and WAITs go is the list's communication
 * mode (par_comm); the FWD/BWD order is the same in both, so both compute
 * the same bits:
 *  - PAR_COMM_OVERLAP (the default; MegaScale section 3.2): sends and
 *    receives are decoupled, each posted as early and waited as late as
 *    its data allows.  A receive is posted one compute instruction ahead
 *    of its use and waited right before the FWD/BWD that consumes it; a
 *    send is posted right after the compute that produced its data and
 *    waited only before a later compute rewrites the same send buffer, or
 *    at the end of the list.  Each (local chunk, direction) has
 *    PAR_SEND_BUFS send buffers, micro-batch mb writing buffer
 *    mb % PAR_SEND_BUFS, so consecutive computes of one chunk never wait
 *    for each other's sends: in warm-up a FWD depends only on its
 *    activation's receive, not on the send of the FWD before it (which
 *    may still be in flight), in cool-down a BWD only on its gradient's
 *    receive, and in the steady 1F1B phase the receive posted before a BWD
 *    feeds the next FWD while the BWD's send overlaps that FWD.  With free
 *    communication this is the bubble of the compute order; with a
 *    transfer time, the only stall is each message's own latency on the
 *    dependency chain (tests/unit/test_schedule.c checks this against a
 *    dependency-only lower bound).
 *  - PAR_COMM_BLOCKING (--overlap without pp): at every compute boundary
 *    the send of the compute before and the receive of the compute after
 *    are posted together and both waited at once (Megatron's
 *    send_forward_recv_backward and its siblings: coupled, blocking on the
 *    slower one), so no transfer overlaps a compute.  Posting both before
 *    waiting either keeps it deadlock-free.
 *
 * par_schedule_validate() simulates all ranks' lists together (message
 * matching, deadlock and protocol checks, timing with a cost per FWD/BWD);
 * par_schedule_bubble_fraction() uses it to measure the pipeline bubble.
 *
 * Memory: lists returned by par_schedule / par_plan_build are malloc'ed and
 * owned by the caller (free() / par_plan_free()).  All functions are pure
 * and thread-safe; errors are recorded with ms_error() (thread-local).
 */
#ifndef PAR_SCHEDULE_H
#define PAR_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#include "base/status.h"

typedef enum { PAR_SCHED_1F1B = 0, PAR_SCHED_INTERLEAVED = 1 } par_sched_kind;

/* Where a list's communication waits (see the top of this file). */
typedef enum { PAR_COMM_OVERLAP = 0, PAR_COMM_BLOCKING = 1 } par_comm;

/* Send buffers per (local chunk, direction): micro-batch mb's send uses
 * buffer mb % PAR_SEND_BUFS.  Executors allocate this many.  With one, a
 * warm-up FWD waits for the previous FWD's send; two still leave stalls in
 * interleaved cool-down with pp 8 (the receiver, one stage around the
 * ring, posts its receive a compute later than the sender's pace); three
 * is the smallest count at which the simulator finds no compute delayed by
 * a send over the unit tests' grid, for transfer times up to one FWD. */
#define PAR_SEND_BUFS 3

typedef enum {
    PAR_FWD = 0,       /* forward of (mb, chunk) */
    PAR_BWD = 1,       /* backward of (mb, chunk) */
    PAR_SEND_ACT = 2,  /* post send of (mb, chunk)'s output activation to `peer` */
    PAR_RECV_ACT = 3,  /* post receive of (mb, chunk)'s input activation from `peer` */
    PAR_SEND_GRAD = 4, /* post send of (mb, chunk)'s input gradient to `peer` */
    PAR_RECV_GRAD = 5, /* post receive of (mb, chunk)'s output gradient from `peer` */
    PAR_WAIT = 6,      /* block until the posted `waits` op on (mb, chunk) completes */
} par_op;

typedef struct {
    par_op op;
    int mb;       /* micro-batch, 0..n_micro-1 */
    int chunk;    /* local model chunk on this stage, 0..vpp-1 */
    int peer;     /* SEND_*: destination stage; RECV_*: source stage; WAIT: the
                   * waited op's peer; FWD/BWD: -1 */
    par_op waits; /* WAIT: the posted op it completes (PAR_SEND_ACT..
                   * PAR_RECV_GRAD); other ops: PAR_WAIT (unused) */
} par_instr;

/* The lists of all pp ranks for one configuration. */
typedef struct {
    par_sched_kind kind;
    par_comm comm;
    int pp, vpp, n_micro;
    par_instr **lists; /* lists[s]: stage s's instructions */
    int *lens;         /* lens[s]: their count */
} par_plan;

/* What a simulation measured.  Times are in the units of t_fwd/t_bwd. */
typedef struct {
    double makespan;        /* when the last rank finishes */
    double busy;            /* compute time of one rank: n_micro*vpp*(t_fwd+t_bwd) */
    double bubble_fraction; /* (makespan - busy) / busy */
    int max_in_flight;      /* max over stages of (mb, chunk) pairs with FWD
                             * done and BWD not yet done */
    double recv_wait;       /* all stages' clock time spent in WAITs on receives */
    double send_stall;      /* ... in WAITs on sends that a later FWD/BWD of the
                             * stage came after: compute delayed by a send (the
                             * waits after a stage's last compute not counted) */
} par_sim_stats;

/* Default cost model of par_schedule_bubble_fraction: one chunk's FWD of one
 * micro-batch costs 1 unit, its BWD 2 units. */
#define PAR_COST_FWD 1.0
#define PAR_COST_BWD 2.0

const char *par_sched_kind_name(par_sched_kind kind);

/* Check a configuration without building anything.  MS_ERR_ARG with a
 * message naming the values when it is invalid. */
ms_status par_schedule_check_args(par_sched_kind kind, int pp, int vpp, int n_micro);

/* Instruction list of pipeline rank `stage` (0..pp-1) in communication
 * mode `comm`.  On success *out is a malloc'ed array of *n instructions
 * (caller frees).  MS_ERR_ARG for an invalid configuration or mode,
 * MS_ERR_NOMEM on allocation failure. */
ms_status par_schedule_comm(par_sched_kind kind, par_comm comm, int pp, int vpp, int n_micro,
                            int stage, par_instr **out, int *n);
/* par_schedule_comm with PAR_COMM_OVERLAP. */
ms_status par_schedule(par_sched_kind kind, int pp, int vpp, int n_micro, int stage,
                       par_instr **out, int *n);

/* Number of warmup FWDs of stage `stage` (Megatron's num_warmup_microbatches):
 * FWDs run before the first BWD, not counting the steady phase's first one.
 * The stage keeps at most min(warmup + 1, n_micro*vpp) activations.  Assumes
 * valid arguments (see par_schedule_check_args). */
int par_schedule_warmup(par_sched_kind kind, int pp, int vpp, int n_micro, int stage);

/* Build the lists of all ranks in mode `comm` into *plan (zeroed on
 * failure).  Free with par_plan_free, which accepts a zeroed plan. */
ms_status par_plan_build_comm(par_sched_kind kind, par_comm comm, int pp, int vpp, int n_micro,
                              par_plan *plan);
/* par_plan_build_comm with PAR_COMM_OVERLAP. */
ms_status par_plan_build(par_sched_kind kind, int pp, int vpp, int n_micro, par_plan *plan);
void par_plan_free(par_plan *plan);

/* Simulate all ranks' lists of `plan` together, FWD costing t_fwd and BWD
 * t_bwd (both > 0), communication free.  MS_OK when every rank runs to
 * completion and the protocol holds; otherwise MS_ERR_ARG with a message
 * starting "deadlock:" (no rank can progress; names each blocked rank and
 * what it waits for) or "protocol:" (FWD before its activation arrived,
 * BWD before its FWD or gradient, an unmatched or unwaited send/receive, a
 * send buffer rewritten before its send completed, wrong peer, a missing or
 * duplicate FWD/BWD, ...; send buffers as PAR_SEND_BUFS says).  `stats` (may be NULL) is filled on
 * success; `max_in_flight` (may be NULL) receives pp per-stage maxima. */
ms_status par_schedule_validate(const par_plan *plan, double t_fwd, double t_bwd,
                                par_sim_stats *stats, int *max_in_flight);

/* Costs of par_schedule_simulate: t_fwd[s * vpp + c] / t_bwd[...] are the
 * FWD / BWD of local chunk c on stage s (all > 0); a message completes
 * t_p2p (>= 0) after both of its sides were posted. */
typedef struct {
    const double *t_fwd, *t_bwd;
    double t_p2p;
} par_sim_costs;

/* par_schedule_validate with a cost per stage and chunk and a transfer
 * time (the planner's timing of a step, src/plan).  stats->busy is the
 * busiest stage's compute time.  Same errors as par_schedule_validate. */
ms_status par_schedule_simulate(const par_plan *plan, const par_sim_costs *costs,
                                par_sim_stats *stats, int *max_in_flight);

/* Bubble fraction (idle time / compute time per rank) of a configuration,
 * measured by simulating its lists under the default cost model
 * (PAR_COST_FWD, PAR_COST_BWD).  Textbook values: (pp-1)/n_micro for 1F1B,
 * (pp-1)/(vpp*n_micro) for interleaved. */
ms_status par_schedule_bubble_fraction(par_sched_kind kind, int pp, int vpp, int n_micro,
                                       double *frac);

/* Activation sets of one stage's list (list, n) for executing it, one pool
 * for all local chunks (each chunk has the same number of blocks):
 * slot[mb*vpp + chunk] (n_micro*vpp entries) is the set that (mb, chunk)
 * uses from its first instruction (an early RECV_ACT writes its input
 * there) until its BWD; *n_slots is how many sets the stage needs: the
 * most pairs alive at once (activations in flight plus early receives).  A
 * set is reused only after its BWD ran.  MS_ERR_ARG for a list that names
 * bad indices or misses / repeats a BWD. */
ms_status par_schedule_slots(const par_instr *list, int n, int vpp, int n_micro, int *slot,
                             int *n_slots);

/* Name of an op ("FWD", "SEND_ACT", ...). */
const char *par_op_name(par_op op);

/* Format one instruction ("FWD(mb=3,c=1)", "SEND_ACT(mb=3,c=1,to=2)",
 * "WAIT(RECV_GRAD mb=0,c=0,from=1)") into buf; returns buf. */
const char *par_instr_str(const par_instr *ins, char *buf, size_t size);

/* Debug print of a list, one instruction per line with its index. */
void par_schedule_print(FILE *f, const par_instr *list, int n);

#endif
