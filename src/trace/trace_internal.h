/* trace_internal.h - what the files of src/trace/ share: the in-memory form
 * of a run's event logs (trace_set), the clock alignment, the thread
 * layout of a lane (nesting clamp and interval partitioning), rank-file
 * listing and small JSON / formatting helpers.
 * Callers: the files of src/trace and tests/unit/test_trace.c only.
 * Memory: a trace_set owns every string and array inside it
 * (trace_set_free).  Thread-safety: none needed (no shared state).
 */
#ifndef MS_TRACE_INTERNAL_H
#define MS_TRACE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "trace/trace.h"

/* The largest world the tools accept (as `megascale launch --np`): a bigger
 * one in a file is damage, and would cost memory and output per rank. */
#define TRACE_MAX_WORLD (1 << 20)
/* The longest line of an event log the tools read (its lines are under
 * 1 KiB; a longer one is a damaged or foreign file, not held in memory) */
#define TRACE_LINE_MAX (16 << 20)
/* The largest |time| of a span, mark or clock line, ns (146 years): a span's duration
 * and a time plus its clock offset stay within int64 (a crafted 9e18 overflowed them). */
#define TRACE_T_MAX (((int64_t)1 << 62) - 1)

/* From local monotonic time `mono` on, global = local + offset (+- err). */
typedef struct {
    int64_t mono, offset, err;
} trace_clock;

enum {
    TRACE_HAS_STEP = 1u << 0,
    TRACE_HAS_PEER = 1u << 1,
    TRACE_HAS_TAG = 1u << 2,
    TRACE_IS_MARK = 1u << 3, /* an instant: t1 == t0 */
};

/* One span or mark line.  Times are local monotonic ns. */
typedef struct {
    int64_t t0, t1;
    char *args;                /* JSON text of the line's other keys; NULL if none or not loaded */
    int32_t name, lane, group; /* string-table indexes; group -1 when absent */
    int32_t step, peer, tag;   /* valid when the matching TRACE_HAS_* flag is set */
    uint32_t flags;
} trace_span;

typedef struct {
    char *path;
    int rank, world, pid;
    char host[256];
    trace_coord coord, shape;
    int64_t mono_ns, wall_ns; /* one instant on both clocks (the header's) */
    int64_t wall0_ns;         /* the header's of the log's .1, read before it; 0: none */
    int64_t opened_ns;        /* when its process opened the log (wall): the header's
                                 opened_wall_ns in a rotated file, else its wall_ns */
    uint64_t run;             /* the header's "run": one start of the job (0: not said) */
    trace_clock *clocks;
    int n_clocks, cap_clocks;
    trace_span *spans;
    int n_spans, cap_spans;
    int64_t dropped;
    int64_t base_offset; /* used when the log has no clock lines */
} trace_log;

typedef struct {
    char *dir;
    trace_log *logs; /* sorted by rank */
    int n_logs;
    char **strs; /* interned names, lanes, groups */
    int n_strs, cap_strs;
    int *str_tab; /* open addressing over strs (-1: empty), tab_cap slots, a power of 2 */
    int tab_cap;
} trace_set;

enum {
    TRACE_LOAD_ARGS = 1u << 0,    /* keep each line's extra keys (merge) */
    TRACE_LOAD_COMPUTE = 1u << 1, /* only spans on the "compute" lane */
    TRACE_LOAD_HEADERS = 1u << 2, /* only the header lines: the spans (and clocks, and the
                                   * clock alignment) one log at a time with trace_log_load,
                                   * so that memory holds one rank's spans, not the run's */
    TRACE_LOAD_QUIET = 1u << 3,   /* trace_log_load: no warnings (a log read a second time) */
};

/* Load every DIR/events_r*.jsonl (see trace.h).  A truncated last line is
 * ignored with a warning; any other malformed line fails naming file:line. */
ms_status trace_set_load(const char *dir, unsigned flags, trace_set **out);
/* Of a set loaded with TRACE_LOAD_HEADERS: read log li's spans, clocks and
 * drop counts (flags as trace_set_load's); trace_log_unload frees them
 * again.  FORMAT when the file now holds another rank's or run's log. */
ms_status trace_log_load(trace_set *s, int li, unsigned flags);
void trace_log_unload(trace_log *l);
/* The same, keeping the clock lines (trace_set_align needs every log's). */
void trace_log_unload_spans(trace_log *l);
/* Align the logs without clock lines by their headers' wall clocks (the
 * set's clock lines read): what trace_set_load does unless
 * TRACE_LOAD_HEADERS. */
void trace_set_align(trace_set *s);
void trace_set_free(trace_set *s);
/* Index of an interned string, or -1. */
int trace_str_find(const trace_set *s, const char *str);
/* Global - local for local time t on this rank. */
int64_t trace_log_offset(const trace_log *l, int64_t t);
/* Read only the header line of an events file into *l (host, coord). */
ms_status trace_log_read_header(const char *path, trace_log *l);

/* The files DIR/<prefix>NNNNN<suffix>, sorted by rank: malloc'd arrays
 * (trace_rank_files_free).  DIR missing: NOTFOUND; no such file: *n = 0. */
ms_status trace_rank_files(const char *dir, const char *prefix, const char *suffix, int **ranks,
                           char ***paths, int *n);
void trace_rank_files_free(int *ranks, char **paths, int n);
/* The event logs of DIR's ranks, as trace_rank_files: events_rNNNNN.jsonl, and for a rank
 * without one the file that stands in for it, events_rNNNNN.jsonl.new (the rank ended while
 * it rotated its log), else its older half events_rNNNNN.jsonl.1 (warn: say so, once per
 * file).  Errors: as trace_rank_files, NOMEM. */
ms_status trace_log_files(const char *dir, int warn, int **ranks, char ***paths, int *n);
/* The path of RANK's event log in DIR (or of the file standing in for it, as
 * trace_log_files) into buf: 1, or 0 when it has none. */
int trace_log_path(const char *dir, int rank, char *buf, size_t size);

/* Open a run's file for reading (*f; fclose it), refusing anything but a regular file
 * (FORMAT, naming it): a FIFO named like a log would block the open, and the tool, for
 * ever.  Errors: IO (open), FORMAT. */
ms_status trace_fopen(const char *path, FILE **f);
/* A regular file's whole content, NUL-terminated, into *data (free it); as trace_fopen. */
ms_status trace_read_file(const char *path, char **data, size_t *len);

/* Grid coordinates of a rank for a shape (dp, pp, tp). */
trace_coord trace_coord_of(int rank, trace_coord shape);
/* Order by (pp, dp, tp). */
int trace_coord_cmp(trace_coord a, trace_coord b);
/* "(dp 1, pp 0, tp 1)" into buf. */
const char *trace_coord_str(char *buf, size_t n, trace_coord c);
cJSON *trace_coord_json(trace_coord c);
/* Parse {"dp":..,"pp":..,"tp":..} (all three must be non-negative ints). */
int trace_coord_parse(const cJSON *o, trace_coord *c);
/* Add s to object o as a string under key, its invalid UTF-8 bytes as '?' (a path: any bytes);
 * NULL on OOM. */
cJSON *trace_json_add_text(cJSON *o, const char *key, const char *s);
/* An integer-valued JSON number in [lo, hi]: 1 and *v set, else 0. */
int trace_json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *v);
/* Write a cJSON tree to f (unformatted) with a newline; MS_ERR_NOMEM. */
ms_status trace_json_print(const cJSON *j, FILE *f);

/* Thread layout of one lane.  Spans idx[0..n) of `spans` (any order).
 * trace_nest: a lane whose spans must nest (compute, data, ckpt): sorts idx
 * by (t0, longest first) and cuts any span that partially overlaps the one
 * enclosing its start so that it ends with it; returns the number cut.
 * trace_partition: a comm lane: greedy interval partitioning (by start,
 * first sub-thread free) so that no two spans on one sub-thread overlap;
 * sets track[i] for idx[i] and returns the number of sub-threads. */
int trace_nest(trace_span *spans, int *idx, int n);
int trace_partition(const trace_span *spans, int *idx, int n, int *track);

#endif
