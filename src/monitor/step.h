/* step.h - the public per-step record and its sinks.
 *
 * The trainer fills one mon_step per optimiser step (one mon_val per
 * validation pass, one mon_ckpt per committed checkpoint, on rank 0 as
 * soon as it learns of the commit) and hands it to mon_record, which
 * passes it to every sink in the order they were added: the progress line,
 * the metrics JSONL, the event log, and later the heartbeat.  A new consumer of per-step
 * numbers is a new sink, not an edit of the trainer.
 *
 * Who calls it: the trainer.  Memory: mon_record_create allocates the
 * record; mon_record_destroy closes every sink and frees it.  A sink's ctx
 * belongs to the sink (freed by its close).  Thread-safety: one thread.
 */
#ifndef MON_STEP_H
#define MON_STEP_H

#include <stdint.h>

#include "base/status.h"

#define MON_NAN_RANKS 8 /* non-finite source ranks a step names (mon_step.nan_ranks) */

typedef struct {
    int step, steps;              /* the step just done (1-based), of how many */
    int start;                    /* first step of this run (after a resume) */
    float loss, lr, grad_norm;    /* loss: mean over the batch (NaN if non-finite) */
    double sec;                   /* wall time of the step */
    double tok_s, mfu;            /* tokens per second; MFU as a fraction (<= 1) */
    double data_ms, comm_ms;      /* waited for data; exposed (blocked) ZeRO communication */
    double wait_ms;               /* the trainer blocked in communication (comm_thread_wait_ns) */
    double compute_ms;            /* sec - wait_ms - data_ms, at least 0 */
    double bubble_ms;             /* pipeline: waited on receives */
    double tp_ms, dp_ms, pp_ms;   /* blocked on each dimension's communication (exposed) */
    double dev_fb_ms, dev_opt_ms; /* device timers of the previous step (0: none) */
    long long tokens;             /* tokens seen so far, this step included */
    double wall_s;                /* epoch seconds at the end of the step */
    double elapsed_s;             /* since the loop started (this run) */
    double peak_rss_bytes;        /* host peak resident set so far */
    double peak_dev_bytes;        /* device memory peak so far (0: not a device backend) */
    int64_t t0_ns, t1_ns;         /* the step on the monotonic clock (ms_ev_now) */
    int skipped;                  /* the update was skipped (non-finite) */
    int redone;                   /* redos of this step after a non-finite result (0: none) */
    /* the ranks whose own gradients were not finite in the step's last
     * non-finite computation (its redo or skip): the first MON_NAN_RANKS of
     * n_nan_ranks (0: none, or a non-finite loss) */
    int nan_ranks[MON_NAN_RANKS], n_nan_ranks;
} mon_step;

typedef struct {
    int step;       /* steps done when the pass ran */
    float val_loss; /* NaN if non-finite */
    double sec;     /* time the pass took */
    double wall_s;
    int64_t t0_ns, t1_ns; /* the pass on the monotonic clock (ms_ev_now; 0: not taken) */
} mon_val;

typedef struct {
    int step;          /* the committed checkpoint's step */
    int64_t bytes;     /* its size: every rank's shard files together */
    double stall_ms;   /* its stage 1 (the snapshot that stalls training); NaN: unknown */
    double persist_ms; /* its stage 2, from the persist's start to the commit */
    double wall_s;     /* epoch seconds of the commit */
} mon_ckpt;

typedef struct {
    void *ctx;
    ms_status (*on_step)(void *ctx, const mon_step *s); /* may be NULL */
    ms_status (*on_val)(void *ctx, const mon_val *v);   /* may be NULL */
    ms_status (*on_ckpt)(void *ctx, const mon_ckpt *c); /* may be NULL */
    void (*close)(void *ctx);                           /* may be NULL */
} mon_sink;

typedef struct mon_record mon_record;

ms_status mon_record_create(mon_record **out);
/* Add a sink (copied).  At most 8. */
ms_status mon_record_add(mon_record *r, mon_sink s);
/* Hand s / v / c to every sink; the first failure is returned (the later
 * sinks still run). */
ms_status mon_record_step(mon_record *r, const mon_step *s);
ms_status mon_record_val(mon_record *r, const mon_val *v);
ms_status mon_record_ckpt(mon_record *r, const mon_ckpt *c);
/* Close every sink and free r.  NULL is ignored. */
void mon_record_destroy(mon_record *r);

/* The progress line ("step 10/300 | loss ... | ETA ..."), printed every
 * log_every steps, at the first and the last step (log_every <= 0: never),
 * and the validation line. */
mon_sink mon_sink_progress(int log_every);

/* The metrics JSONL (docs/formats.md, "Metrics"), written with cJSON and
 * flushed after each line, so a crashed run keeps every completed step.
 * path NULL or "": *out gets a sink that does nothing.  The first line of a
 * run is {"type":"config", ...} with config_json (a JSON object's text:
 * the effective options and layout; may be NULL); then a line per step,
 * per validation and per commit ({"type":"ckpt", ...}).  A run that starts
 * at step 0 truncates the file; a resumed run (resume_step > 0) keeps the
 * lines of steps <= resume_step (step, validation and ckpt lines alike) and
 * the earlier config lines (replacing the file atomically) and appends
 * after them, so the file reads as one run.
 * Errors: MS_ERR_IO naming the file. */
ms_status mon_sink_metrics(mon_sink *out, const char *path, int resume_step,
                           const char *config_json);

/* The event log: each step as a "step" span on the compute lane (with the
 * step's timers as a mark), each validation as a "val" span. */
mon_sink mon_sink_events(void);

/* Every rank's summary at the end: one stderr line with the median step
 * split over the run, the first step (warm-up) left out ("[megascale rN
 * profile] median per step over S steps: step .. ms | compute .. ms |
 * exposed comm .. ms | data wait .. ms | bubble .. ms | device: fwd+bwd ..
 * ms, optimizer .. ms | blocked on tp .. ms, dp .. ms, pp .. ms"; read by
 * bench/parallel_step).  Compute is the metrics' compute_ms (the step but
 * its waits in communication and for data); exposed comm is wait_ms but
 * the bubble (the pipeline's waits on receives), every dimension's. */
mon_sink mon_sink_summary(int rank);

#endif
