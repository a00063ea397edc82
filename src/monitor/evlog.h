/* evlog.h - the per-rank event log: a background thread drains the event
 * recorder (base/events.h) into DIR/events_rNNNNN.jsonl (docs/formats.md,
 * "Event log"), and the clock reference that lets `megascale trace merge`
 * align the logs of different ranks and hosts.
 *
 * Who calls it: the trainer (open after the rank grid exists, close at the
 * end); the clock sync is a collective over the world, called by every rank
 * at the same step.  Memory: mon_evlog_open allocates the log, closed and
 * freed by mon_evlog_close.  Thread-safety: open/close from one thread; the
 * flusher is the recorder's only consumer while the log is open.
 */
#ifndef MON_EVLOG_H
#define MON_EVLOG_H

#include "base/status.h"
#include "comm/comm.h"

/* Who this rank is, for the log's header line. */
typedef struct {
    int rank, world;
    int has_grid;   /* 0: a single process or a job without a grid */
    int dp, pp, tp; /* coordinates */
    int DP, PP, TP; /* shape */
    unsigned long long run; /* the same on every rank of one start of the job (0: none said):
                             * the trace tools keep one run's logs */
} mon_identity;

typedef struct mon_evlog mon_evlog;

/* Create dir (mkdir -p), move this rank's files of an earlier run (its
 * log and the log's .1, its hang dump) into DIR/prev/, replacing the ones
 * there (rank 0 also those of ranks >= world), open
 * DIR/events_rNNNNN.jsonl, write its header, turn the recorder on and
 * start the flusher, which writes what was recorded every flush_s seconds
 * (<= 0: 0.2 s).  max_bytes > 0 bounds the log on disk: when the file
 * passes max_bytes / 2 at a flush, it becomes events_rNNNNN.jsonl.1
 * (replacing the older one) and a new file starts with the header and the
 * latest clock sample (<= 0: unbounded).  Errors: MS_ERR_IO naming the
 * path. */
ms_status mon_evlog_open(mon_evlog **out, const char *dir, const mon_identity *id, double flush_s,
                         long long max_bytes);
/* Turn the recorder off, stop the flusher, write what is left, close.
 * NULL is ignored. */
void mon_evlog_close(mon_evlog *l);
/* Path of the log file. */
const char *mon_evlog_path(const mon_evlog *l);

/* Collective over w's world group: estimate this rank's clock offset to
 * rank 0 (global = local + *offset_ns, +- *err_ns, from the fastest of
 * `pings` round trips with rank 0) and record it as a clock sample.  Rank
 * 0 gets offset 0, err 0.  *err_max_ns (may be NULL) = the largest error
 * over all ranks (every rank gets it).  Costs pings x (world - 1) round
 * trips on rank 0. */
ms_status mon_clock_sync(comm_world *w, int pings, long long *offset_ns, long long *err_ns,
                         long long *err_max_ns);

#endif
