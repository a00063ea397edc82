/* sup_dash.h - the job's dashboard: an HTTP server (libmicrohttpd, its own
 * thread) with the pages (web/dashboard/, embedded in the binary) and a
 * JSON API over the run directory's files: the supervisor's events
 * (events.jsonl), the metrics of rank 0 (metrics.jsonl: loss, learning
 * rate, throughput, checkpoints), the per-rank compute times the driver
 * heard in the heartbeats (compute.jsonl, the heat map), and, while the
 * driver runs, its live view of the ranks (beat ages, stragglers).
 * docs/formats.md, "Dashboard API".
 *
 * Security: bound to loopback unless asked otherwise; every request must
 * carry the dashboard's token (?token=T or "Authorization: Bearer T"), else
 * 401 with an empty body; only GET and HEAD; a fixed table of paths (no
 * part of a request is ever used as a file name); every reply is bounded;
 * at most 64 connections, a 65th closes the quietest (no slowloris).
 *
 * Who calls it: the driver (`megascale launch --dashboard PORT`) and
 * `megascale dashboard RUN_DIR`.  Memory: start allocates, stop frees.
 * Thread-safety: sup_dash_push may be called from any one thread while the
 * server runs, and never waits for the server's reading of the files; the
 * server thread only reads files and the pushed copy.
 */
#ifndef SUP_DASH_H
#define SUP_DASH_H

#include <stddef.h>

typedef struct sup_dash sup_dash;

typedef struct {
    const char *run_dir; /* compute.jsonl; metrics as job_start names it */
    const char *bind;    /* NULL: 127.0.0.1 */
    int port;            /* 0: any free port */
    int live;            /* 1: a driver pushes its view (sup_dash_push) */
    const char *events;  /* the events JSONL (NULL: RUN_DIR/events.jsonl), as `launch --events` */
} sup_dash_config;

/* Start serving.  0, or -1 with why set (bad address, port taken, no
 * libmicrohttpd thread). */
int sup_dash_start(sup_dash **out, const sup_dash_config *c, char *why, size_t n);
/* "http://127.0.0.1:PORT/?token=T": what to open in a browser. */
const char *sup_dash_url(const sup_dash *d);
const char *sup_dash_token(const sup_dash *d);
const char *sup_dash_addr(const sup_dash *d); /* "127.0.0.1:PORT" */
void sup_dash_stop(sup_dash *d);              /* NULL is ignored */
/* The driver is ending, its last events on disk: the live view is dropped
 * (the status is the files', the job's end as the events say it, with
 * "closing": true), and if a page asked anything in the last
 * SUP_DASH_WATCHED_S, the server goes on until that page has read each of
 * its endpoints once more in full, at most linger_s: a page left open sees
 * how the job ended, and asks nothing after (no refused connections).
 * NULL is ignored. */
#define SUP_DASH_WATCHED_S 5.0
void sup_dash_finish(sup_dash *d, double linger_s);

/* The driver's live view: what the files do not say (yet). */
typedef enum {
    SUP_DASH_STARTING,
    SUP_DASH_RUNNING,
    SUP_DASH_SLOW, /* the straggler detector counts strikes against it */
    SUP_DASH_HUNG, /* no beat, or no step, for a while */
    SUP_DASH_DEAD,
    SUP_DASH_STOPPED,
    SUP_DASH_DONE,
} sup_dash_state;

typedef struct {
    sup_dash_state state;
    int step;          /* -1: not known (the events' step is shown) */
    double beat_age_s; /* NaN: no beat yet */
    double compute_ms; /* NaN: none */
} sup_dash_rank;

typedef struct {
    int attempt, restarts, best_step;
    int recovering; /* between a fault and the ranks' return */
    double ettr;    /* so far (NaN: not known) */
    int n_ranks;    /* ranks[0..n_ranks) */
    const sup_dash_rank *ranks;
} sup_dash_live;

/* Replace the live view (copied). */
void sup_dash_push(sup_dash *d, const sup_dash_live *l);

#endif
