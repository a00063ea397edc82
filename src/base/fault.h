/* fault.h - the fault-injection registry: one syntax for every fault a test
 * or a chaos run injects, queried by name by the layer that owns the fault
 * point (docs/operations.md, "Injected faults").
 *
 * A plan is a comma-separated list of entries
 * KIND[=ARG][@STEP[+]][:RANK | :node=NAME]: KIND names the fault point, ARG
 * a number some kinds take (slow=MS, spike=X), STEP the 1-based optimiser
 * step it fires at ("+": that step and every later one; no STEP: kinds of
 * the checkpoint fire at the first checkpoint this process takes, others at
 * step 1), RANK the global rank it fires on, NAME the node it fires on
 * ([A-Za-z0-9._-]{1,63}; base/node.h: the plan's self_node, set with
 * ms_fault_plan_set_node); no target: every rank.  "random=SEED/N/MAXSTEP/
 * WORLD" expands to N entries of mixed kinds (exit, kill, stop, hang and a
 * transient nan-grad) at distinct steps in [2, MAXSTEP] on ranks in
 * [0, WORLD), the same on every process that expands it (for chaos runs).
 *
 * Kinds: the trainer's `exit` (the process exits with code 42 at the start
 * of the step), `kill` (SIGKILL to itself), `stop` (SIGSTOP to itself: no
 * more heartbeats), `hang` (the training thread stops making progress; the
 * process lives and beats), `term` (SIGTERM to itself at the start of the
 * step, before the stop check: a stop that reaches this rank before the
 * others), `slow=MS` (MS ms more per step, 0 < MS <= 3600000, slept inside
 * the timed step before any compute: a straggler), `nan-grad` (a NaN in the
 * step's gradients: @S corrupts only the first computation of step S, so a
 * redo of the step is clean; @S+ every computation of every step >= S),
 * `spike=X` (the optimiser uses lr x X at that step, X > 0: a loss spike;
 * every rank, so it takes no target); the checkpoint's points
 * (stage1:mid, stage2:start, stage2:mid-shard, stage2:after-shard,
 * stage2:after-manifest, stage2:after-commit, stage2:flip-shm,
 * stage2:slow=MS (a slow disk: each persist MS ms longer), io:enospc-shard,
 * io:eio-fsync-shard, io:enospc-manifest, io:eio-fsync-manifest,
 * io:noexchange, signal:term; see src/ckpt/ckpt_fault.c); the self-test's diag:gemm,
 * diag:memory, diag:comm, diag:storage (that check fails as on bad
 * hardware; src/diag/diag.h).
 *
 * Who calls it: the trainer (its kinds) and the checkpoint manager (its
 * points); the supervisor, to hand each attempt the faults still ahead.
 * Memory: a plan is a value (fixed capacity).  Thread-safety: read-only
 * after parsing.
 */
#ifndef MS_FAULT_H
#define MS_FAULT_H

#include <stddef.h>

#include "base/node.h"
#include "base/status.h"

#define MS_FAULT_MAX 256
#define MS_FAULT_KIND_MAX 24
/* A plan as a spec string, with the NUL: room for MS_FAULT_MAX entries of
 * the longest form (a kind, =ARG, @STEP+ and :node=NAME: under 130 bytes),
 * so that what ms_fault_format writes of a plan ms_fault_parse reads back. */
#define MS_FAULT_SPEC_MAX 40960

typedef struct {
    char kind[MS_FAULT_KIND_MAX];
    double arg;                  /* slow=MS, stage2:slow=MS: MS; spike=X: X; else 0 */
    int step;                    /* 1-based; -1: not given */
    int from;                    /* "+": this step and later */
    int rank;                    /* -1: any rank */
    char node[MS_NODE_NAME_MAX]; /* "": any node */
} ms_fault;

typedef struct {
    ms_fault f[MS_FAULT_MAX];
    int n;
    char self_node[MS_NODE_NAME_MAX]; /* this process's node ("": none; node targets never fire) */
} ms_fault_plan;

/* Parse spec (NULL or "" is an empty plan) and append it to *p.  `what`
 * names the option in messages ("--inject-fault").  Errors: MS_ERR_ARG
 * naming the entry and what is wrong (an unknown kind, a bad step, rank or
 * node name, a target on spike, too many entries, a spec of
 * MS_FAULT_SPEC_MAX bytes or more, random=... with fewer free steps than
 * faults). */
ms_status ms_fault_parse(ms_fault_plan *p, const char *spec, const char *what);
/* This process's node name (NULL or "": none), which node-targeted entries
 * must equal to fire.  The name is cut to MS_NODE_NAME_MAX - 1 bytes. */
void ms_fault_plan_set_node(ms_fault_plan *p, const char *name);
/* The first entry of `kind` that fires at `step` on `rank` and the plan's
 * node (step -1: the kinds given without a step only), or NULL. */
const ms_fault *ms_fault_find(const ms_fault_plan *p, const char *kind, int step, int rank);
/* 1 if kind is one of the checkpoint's points (stage1:*, stage2:*, io:*,
 * signal:*). */
int ms_fault_is_ckpt(const char *kind);
/* 1 if kind is a checkpoint point that only rank 0 reaches (the manifest, the commit): an
 * entry aimed at another rank is refused. */
int ms_fault_rank0_only(const char *kind);
/* 1 if any entry of `kind` exists for `rank` and the plan's node. */
int ms_fault_any(const ms_fault_plan *p, const char *kind, int rank);
/* The plan as a spec string (entries with step > after_step only, so a
 * restarted run does not meet again the faults it already met); "" if none.
 * Whole entries only: returns how many did not fit in n bytes (none when
 * n >= MS_FAULT_SPEC_MAX). */
int ms_fault_format(const ms_fault_plan *p, int after_step, char *buf, size_t n);
/* One entry as a plan spells it (KIND[=ARG][@STEP[+]][:RANK | :node=NAME]) into buf, as
 * snprintf does; returns its length. */
int ms_fault_entry_format(const ms_fault *f, char *buf, size_t n);
/* Fire the trainer's process faults of `step` on `rank`: exit, kill, stop
 * (these end or stop the process, with a line naming the fault first), hang
 * (never returns).  Returns when none of them fires. */
void ms_fault_fire_process(const ms_fault_plan *p, int step, int rank);
/* The slow fault of `step` on `rank`: sleeps its MS milliseconds (called by
 * the trainer inside the timed step, so the time counts as compute).
 * Returns 1 if it slept (the trainer records the sleep as a compute span). */
int ms_fault_fire_slow(const ms_fault_plan *p, int step, int rank);

#endif
