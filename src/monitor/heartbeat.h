/* heartbeat.h - the rank side of the supervisor's heartbeats
 * (docs/formats.md, "Heartbeats"): a background thread sends one JSON line
 * per beat over TCP to the driver (`megascale launch`), every period and
 * at once after each step, with the job's token, this rank's identity
 * (rank, world, pid, host, node, pipeline stage) and its progress (step, phase, step time,
 * its compute part, loss, grad norm, bytes communicated, how long it has
 * been blocked in communication, steps redone after a non-finite result)
 * and, at the end, the error line of a failed run.
 *
 * The beats come from their own thread, so a rank whose training thread is
 * stuck keeps beating without progress (the driver's "no progress"
 * detector), while a stopped or dead process stops beating ("no beat").
 * Sending never blocks training: the thread sends with a timeout, and a
 * driver that went away is reconnected every few seconds.
 *
 * Who calls it: the trainer (open when --heartbeat is given, a sink of the
 * step record, close at the end).  Memory: open allocates, close frees.
 * Thread-safety: the setters may be called from any thread.
 */
#ifndef MON_HEARTBEAT_H
#define MON_HEARTBEAT_H

#include "base/status.h"
#include "monitor/step.h"

#define MON_HB_LINE_MAX 4096 /* a beat's line, newline included, is at most this long */

typedef struct {
    const char *addr;  /* "HOST:PORT" of the driver (numeric IPv4 or a name) */
    const char *token; /* the job's token (printable, no quotes) */
    const char *node;  /* this rank's node name (base/node.h; NULL or "": not sent) */
    int rank, world;
    int has_stage, stage; /* has_stage: the rank's pipeline stage (pp coordinate) is sent */
    double period_s;                    /* <= 0: 1 s */
    long long (*comm_bytes)(void *ctx); /* bytes communicated so far (may be NULL) */
    /* seconds this rank has been blocked in its longest communication wait
     * now, 0 when it waits in none (may be NULL: not sent) */
    double (*comm_blocked_s)(void *ctx);
    /* hang dumps asked for by SIGUSR2 and answered so far (may be NULL): the
     * beats' "dumps", which the supervisor waits for before it stops a hung
     * job */
    int (*comm_dumps)(void *ctx);
    void *comm_ctx;
    int attempt; /* the job's attempt (megascale launch's), sent in every beat (0: not sent) */
} mon_heartbeat_config;

typedef struct mon_heartbeat mon_heartbeat;

/* Connect (within 5 s) and start beating with phase "start".  Errors:
 * MS_ERR_ARG (a malformed address or token), MS_ERR_IO (cannot connect),
 * each naming the address. */
ms_status mon_heartbeat_open(mon_heartbeat **out, const mon_heartbeat_config *c);
/* The step record's sink: each step updates the beat (step, step_ms,
 * compute_ms, loss, grad_norm; redone counts the steps redone that came
 * out finite (s->redone > 0, not s->skipped), skipped those whose update
 * was skipped and skip_step is the last of them;
 * nan_step and nan_ranks: the last step with a non-finite gradient and the
 * ranks whose own gradients it was in) and sends it now. */
mon_sink mon_sink_heartbeat(mon_heartbeat *hb);
/* The current phase: "start", "train", "val", "ckpt", "done" (--steps reached),
 * "stopped" (ended cleanly before --steps: a SIGTERM or SIGINT), "error". */
void mon_heartbeat_phase(mon_heartbeat *hb, const char *phase);
/* Entering the training loop with `step` steps already done (a resumed run:
 * the step it resumed at): phase "train", sent now.  NULL is ignored. */
void mon_heartbeat_train(mon_heartbeat *hb, int step);
/* The checkpoints: the step of this rank's last commit (-1 none), the
 * checkpoints that failed to commit since (0 normally) and the last
 * failure's message; sent with the next beat.  NULL is ignored. */
void mon_heartbeat_ckpt(mon_heartbeat *hb, int last_commit, int fail_streak, const char *msg);
/* The commits that stood with a warning (rank 0, which commits: the
 * directory's fsync or DIR/latest failed), the last one's step and its
 * message; sent with the next beat once the count changes.  NULL or a
 * count of 0 is ignored. */
void mon_heartbeat_ckpt_warned(mon_heartbeat *hb, int warned, int step, const char *msg);
/* Send the beat now and wait (up to timeout_s) until it is out: before an
 * injected fault that ends or stops the process, so the driver knows the
 * steps done and which fault fired (a beat still queued would be lost, and
 * the fault handed to the next start again).  NULL is ignored. */
void mon_heartbeat_flush(mon_heartbeat *hb, double timeout_s);
/* A failed run: send phase "error" with this message (cut to fit) now.
 * usage: the options were refused (the process exits 2), so a driver does
 * not restart a job that would be refused the same way. */
void mon_heartbeat_error(mon_heartbeat *hb, const char *msg, int usage);
/* Phase "stopped" (ended cleanly before --steps), with "stop_here": true
 * when this rank was the one asked to stop (a signal to it), not one that
 * stopped by the others' agreement.  NULL is ignored. */
void mon_heartbeat_stopped(mon_heartbeat *hb, int here);
/* Send a last beat (phase as set: "done" after a finished run), stop, free.
 * NULL is ignored. */
void mon_heartbeat_close(mon_heartbeat *hb);

#endif
