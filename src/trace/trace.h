/* trace.h - offline tools over a run's files: merged timelines, straggler
 * scores and hang analysis.
 *
 * Inputs, both in one run directory DIR:
 *  - DIR/events_rNNNNN.jsonl, one per global rank: a header line, clock
 *    lines (offset of this rank's monotonic clock to rank 0's), span and
 *    mark lines on lanes ("compute", "data", "ckpt", "comm:<group>"), and
 *    "dropped" counts (docs/formats.md, "Event logs").
 *  - DIR/hang_rNNNNN.json, written by a rank whose collective timed out:
 *    its groups with issued / completed sequence numbers and in-flight ops.
 * Outputs:
 *  - trace_merge: one Chrome Trace Event Format file (Perfetto,
 *    chrome://tracing): a process per rank, a thread per lane (comm lanes
 *    split into non-overlapping sub-threads), clocks aligned, p2p flows.
 *  - trace_strag_*: per rank and step compute time (fwd + bwd minus the
 *    waits nested in them), relative (against the ranks of the same
 *    pipeline stage, which do the same work) and individual scores, a PNG
 *    heat map.
 *  - trace_hang_*: who waits in which op, and the suspects.  Evidence, by
 *    strength: a rank wrote no dump, or other ranks' dumps saw it
 *    unresponsive / exited before it dumped itself; a member never entered
 *    a collective its group waits in (and waits in nothing); every member
 *    of a group is in a collective (or both ends of a transfer are posted)
 *    that never completed; a peer never sent what a rank waits to receive;
 *    a member never entered it while it waits in an op of its own.  The suspects are the ranks with
 * the strongest evidence present; weaker findings on other ranks are reported as notes. Callers:
 * `megascale trace` (src/cli/cmd_trace.c), the dashboard. Layering: depends only on src/base/ (and
 * cJSON, cairo). Memory: trace_*_load returns an object the caller releases with the matching
 * trace_*_free; trace_*_json returns a cJSON tree the caller deletes with cJSON_Delete.
 * Thread-safety: no global state; distinct objects may be used from
 * different threads at once.
 */
#ifndef MS_TRACE_H
#define MS_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "base/status.h"

/* A rank's place on the grid (world = dp * pp * tp, TP innermost, then DP,
 * then PP: rank = tp + TP * (dp + DP * pp)). */
typedef struct {
    int dp, pp, tp;
} trace_coord;

/* Whether a file name (no directory) is one the tools read from a run directory: an event
 * log (events_rNNNNN.jsonl), its rotated older half (.jsonl.1), a hang dump
 * (hang_rNNNNN.json) or the supervisor's hang_driver.json.  For the commands' output checks:
 * an output by such a name would be read as the run's by every later command. */
int trace_is_input_name(const char *name);

/* ---- merge -------------------------------------------------------------- */

typedef struct {
    int ranks;           /* event logs merged */
    int64_t events;      /* complete + instant events written */
    long long flows;     /* matched send -> recv pairs (one arrow each) */
    long long unmatched_sends; /* sends without their recv (and the reverse) */
    long long unmatched_recvs;
    int clamped;     /* spans cut to nest on their thread */
    int64_t dropped; /* events the ranks reported lost */
    double skew_us;  /* largest clock uncertainty of any clock line */
} trace_merge_stats;

/* Merge DIR's event logs into out_path (atomically replaced), one log at a time: memory
 * holds one rank's spans and transfers (the sends and recvs are set aside in an unlinked
 * file next to out_path and paired from it), never the run's.  Errors: DIR
 * missing or without events_r*.jsonl (NOTFOUND), a malformed line (FORMAT,
 * naming file:line), I/O. */
ms_status trace_merge(const char *dir, const char *out_path, trace_merge_stats *stats);

/* ---- stragglers ---------------------------------------------------------- */

/* The newest steps the heat map shows (and trace_strag_load keeps for it). */
#define TRACE_STRAG_HEAT_STEPS 8000
/* A rank is named a straggler only with this many scored steps: with fewer, step-to-step
 * noise alone names one (two ranks of 5 steps whose times vary by 30%: 1 run in 5). */
#define TRACE_STRAG_JUDGE_STEPS 8
/* ... and only when its lag costs the job at least this share of a step (the ranks' median
 * "step" span): a compute of 0.3 ms in a step of 8 ms that is 30% slower is no straggler. */
#define TRACE_STRAG_MIN_LAG 0.05

typedef struct {
    double threshold; /* a score below it marks a straggler (0.75) */
    int window;       /* steps per window of the individual score (5) */
    int heatmap;      /* keep what trace_strag_heatmap draws: each rank's newest
                         TRACE_STRAG_HEAT_STEPS compute times (0: only the scores) */
} trace_strag_opts;

typedef struct {
    int rank;
    trace_coord coord;
    char host[256];
    int steps;         /* steps scored (its first skipped when >= 3 steps) */
    double median_ms;  /* median compute time per step */
    double relative;   /* its stage's fastest median / this rank's (1 = fastest) */
    double individual; /* its earlier speed / its latest (trace_strag.c, rank_scores): the
                          10th percentile of its earlier windows' medians / its last window's
                          median (the faster of its last two with 3 windows or more) */
    int windows;       /* windows of the individual score (0: fewer steps than one, no score) */
    int slowed_alone;  /* individual below the threshold while the other ranks' median is not,
                          and behind_stage */
    double last_ms;    /* its latest speed: the individual score's last window median (0: no
                          window) */
    int behind_stage;  /* last_ms above the median of the last windows of its stage's other
                          ranks that kept their own speed (1 when there are none): it fell
                          behind them; a rank that slowed beside a peer slower still (noise
                          on a loaded machine) did not */
    double q25_ms, q75_ms; /* quartiles of its compute time per step */
    double slowed_ms;      /* last_ms minus its earlier speed (the individual score's) */
    double step_ms;        /* median time of its whole steps ("step" spans; 0: none logged) */
    int judged;        /* scored, with at least TRACE_STRAG_JUDGE_STEPS steps: it may be named */
    int consistent;    /* its lag is no noise: its q25 above the q75 of its stage's fastest rank */
    int lag_small;     /* what it loses against the fastest rank (or its own earlier speed) is
                          under TRACE_STRAG_MIN_LAG of a step: no cost to the job */
    int peers;         /* the other scored ranks of its pipeline stage */
    int straggler;     /* judged, and: relative below the threshold and consistent, or
                          slowed_alone; in both, a lag of at least TRACE_STRAG_MIN_LAG */
    char unscored[96]; /* why the rank has no score ("" when it has one): never healthy */
    /* with opts.heatmap: compute time (ms) of steps heat_first..heat_first + heat_n - 1, its
     * newest TRACE_STRAG_HEAT_STEPS (< 0 where no data); NULL otherwise */
    float *heat;
    int heat_first, heat_n;
} trace_strag_rank;

typedef struct {
    trace_strag_opts opts;
    char *dir;
    int n_ranks; /* ranks with an event log, sorted by rank */
    trace_strag_rank *ranks;
    int first_step, max_step; /* the steps of the logs (after a resume: from it on) */
    int n_steps;              /* max_step - first_step + 1 */
    double job_individual;    /* the median individual score of the ranks that did not slow
                                 alone (NaN: none has one); below the threshold, the job as a
                                 whole slowed: no rank's fault */
} trace_strag;

/* Score DIR's ranks, one rank's log at a time: each rank's row of step times is scored as it
 * is read and freed, so memory holds one rank's compute spans and row, the per-rank results
 * and (opts.heatmap) TRACE_STRAG_HEAT_STEPS floats a rank, never ranks x steps.  Errors: no
 * event logs, or none with fwd/bwd spans (NOTFOUND); a malformed line (FORMAT); threshold /
 * window out of range (ARG). */
ms_status trace_strag_load(const char *dir, const trace_strag_opts *o, trace_strag **out);
void trace_strag_free(trace_strag *s);
/* The table and the "stragglers: ..." line. */
void trace_strag_print(const trace_strag *s, FILE *f);
/* {"threshold","window","min_steps","min_lag","ranks":[...],"stragglers":[ranks],
 * "unscored":[ranks],"job_individual","notes":[strings]}: notes say when the run is too
 * short, or a stage too small, to judge; NULL on OOM. */
cJSON *trace_strag_json(const trace_strag *s);
/* Heat map: ranks (sorted by pp, dp, tp) x steps (the newest TRACE_STRAG_HEAT_STEPS),
 * colour = compute time / the step's median over the ranks of its stage; straggler rows
 * marked.  s must be loaded with opts.heatmap (else ARG).  Atomic write. */
ms_status trace_strag_heatmap(const trace_strag *s, const char *png_path);

/* ---- hang analysis ------------------------------------------------------- */

typedef struct trace_hang trace_hang;

/* Load DIR/hang_r*.json (and the events headers for host names) and find
 * the suspects.  Errors: DIR missing or without hang dumps (NOTFOUND), a
 * malformed dump (FORMAT, naming the file). */
ms_status trace_hang_load(const char *dir, trace_hang **out);
void trace_hang_free(trace_hang *h);
/* Shape, per-stage dp x tp state tables (up to 4096 ranks), oldest in-flight op per rank,
 * "suspects: ..." lines.  Bounded for any world: each per-rank list stops after 32 lines,
 * then counts the ranks it left out and groups all of them by what they wait in. */
void trace_hang_print(const trace_hang *h, FILE *f);
/* {"world","dir","shape","dumps","missing","suspects":[...],"notes":[...],
 * "waiting":[...],"suspects_by_op":[...],"waiting_by_op":[...],"n_dumps","n_missing",
 * "n_suspects","n_notes","n_waiting","list_max","truncated"}: each per-rank list holds its
 * first list_max (32) entries, n_<list> counts them all; the *_by_op groups ({"what","op",
 * "group","seq","n_ranks","ranks":[first 32]}, the first 32 groups) count every rank.
 * Bounded for any world.  NULL on OOM. */
cJSON *trace_hang_json(const trace_hang *h);
/* Number of suspects found (0: none). */
int trace_hang_n_suspects(const trace_hang *h);

#endif
