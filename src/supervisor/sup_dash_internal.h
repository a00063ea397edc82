/* sup_dash_internal.h - the dashboard's parts: the model of a run built
 * from its files' lines (sup_dash_model.c), the incremental reader of a
 * growing file (sup_dash_tail.c), the embedded pages (sup_dash_assets.c).
 * For src/supervisor/ and its unit tests only. */
#ifndef SUP_DASH_INTERNAL_H
#define SUP_DASH_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "supervisor/sup_dash.h"

struct cJSON;

/* ---- the model ------------------------------------------------------------ */

#define DASH_MAX_RANKS 65536
#define DASH_MAX_POINTS 100000 /* step points kept; past it every other one is dropped */
#define DASH_MAX_VAL 20000
#define DASH_MAX_EVENTS 20000 /* the newest are kept */
/* ... and at most this many bytes of their text (the newest event always): 20000 lines of up to
 * DASH_LINE_MAX each let a hostile or corrupt events file hold about 20 GiB */
#define DASH_EVENTS_BYTES (64u << 20)
#define DASH_MAX_CKPTS 4096
#define DASH_HEAT_KEEP 1024 /* steps of compute rows kept */
#define DASH_HEAT_COLS 200  /* steps the heat map shows (the newest) */
#define DASH_HEAT_CELLS 400000
#define DASH_METRICS_REPLY 5000 /* step points per /api/metrics reply */
#define DASH_EVENTS_REPLY 500
/* ... and at most this many bytes of event text a reply (the first event always): 500
 * events of up to DASH_LINE_MAX each passed the server's 64 MiB reply limit, and the
 * page got "reply too large" for ever from that point of the log on */
#define DASH_EVENTS_REPLY_BYTES (8u << 20)

typedef struct dash_model dash_model;

dash_model *dash_model_new(void);
void dash_model_free(dash_model *m);
/* One line of each file (without its newline).  A line that is not a JSON
 * object of the expected shape is counted and skipped.  An event line
 * returns its work: 1, plus the ranks an event of the whole job touched. */
void dash_model_metrics_line(dash_model *m, const char *line, size_t len);
long dash_model_event_line(dash_model *m, const char *line, size_t len);
void dash_model_compute_line(dash_model *m, const char *line, size_t len);
/* The metrics file was replaced (a restart rewrote it): forget its lines;
 * the epoch the clients see changes. */
void dash_model_metrics_reset(dash_model *m);
/* 1 if the metrics file the events name is the driver's own RUN_DIR/metrics.jsonl. */
int dash_model_own_metrics(const dash_model *m);
/* The newest time (seconds since the epoch) an event or a step says; NAN if none. */
double dash_model_last_time(const dash_model *m);
/* The metrics file the events name ("" if none yet); valid until the next call. */
const char *dash_model_metrics_path(const dash_model *m);
/* Lines skipped as malformed, over all files. */
long dash_model_bad_lines(const dash_model *m);

/* The replies (docs/formats.md, "Dashboard API"); the caller deletes them.
 * live: the driver's view, or NULL. */
struct cJSON *dash_model_status(const dash_model *m, const sup_dash_live *live, const char *run_dir,
                                double now);
/* since: the step points after it; val_since: the validation points after it (their own
 * cursor: the trainer writes step N's validation point after its step point, so a page
 * that polled between the two and asked from N on would never see it). */
struct cJSON *dash_model_metrics(const dash_model *m, long since, long val_since, int max);
struct cJSON *dash_model_events(const dash_model *m, long since, int max);
struct cJSON *dash_model_heatmap(const dash_model *m, int cols);
struct cJSON *dash_model_checkpoints(const dash_model *m);

/* ---- a growing file, read incrementally ------------------------------------ */

#define DASH_LINE_MAX (1 << 20) /* longer lines are skipped */

typedef struct {
    char path[4200];
    dev_t dev;
    ino_t ino;
    off_t off;     /* bytes consumed */
    char *partial; /* an unterminated last line, kept until its newline */
    size_t plen, pcap;
    int skipping; /* inside an over-long line */
    off_t size;   /* the file's size at the last read: off < size, lines not read yet (the
                     read's bound, or its budget of work, ended it) */
} dash_tail;

void dash_tail_init(dash_tail *t, const char *path);
void dash_tail_free(dash_tail *t);
/* Read what was appended since the last call (at most max_bytes), calling
 * line(arg, text, len) for each complete line; a line function that
 * returns nonzero ends the read after that line (the next read goes on
 * from there: a budget of work per call).  Returns 1 if the file was
 * replaced or truncated since (then reading starts over at its beginning:
 * *replaced is set before the first line is handed out), 0 otherwise,
 * -1 if it cannot be read (missing: not an error, nothing happens). */
typedef int (*dash_line_fn)(void *arg, const char *line, size_t len);
int dash_tail_read(dash_tail *t, size_t max_bytes, dash_line_fn line, void *arg,
                   void (*replaced)(void *arg));

/* ---- the pages --------------------------------------------------------------- */

typedef struct {
    const char *path; /* "/", "/static/dash.js", ... */
    const char *type; /* Content-Type */
    const unsigned char *data;
    size_t len;
    int templated; /* "{{token}}" is replaced by the token */
} dash_asset;

/* The asset served at path, or NULL. */
const dash_asset *dash_asset_find(const char *path);

#endif
