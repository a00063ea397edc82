/* sup_dash.c - the dashboard's HTTP server (libmicrohttpd, one internal
 * thread): the token check, the fixed table of paths, the API replies from
 * the model, refreshed from the run's files at most every 0.25 s (a file is
 * read only as far as it grew).  See sup_dash.h. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "supervisor/sup_dash_internal.h"
#include "supervisor/sup_internal.h"

#define REFRESH_S 0.25
#define READ_PER_REFRESH                                                                           \
    (16u << 20) /* bytes of each file per refresh (a long run's first look takes a few) */
#define EVENT_WORK_PER_REFRESH (1L << 24) /* rank records touched: ~20 ms */
#define REPLY_MAX (64u << 20)
#define CONN_LIMIT 64              /* past it the quietest connection is closed (see on_conn) */
#define CONN_HARD (2 * CONN_LIMIT) /* libmicrohttpd's own bound, closing ones included */
#define CONN_MEMORY (64u << 10)    /* a request's line and headers: more gets 431 / 414 */
/* the endpoints a page reads after the driver's end (sup_dash_finish waits for all) */
enum { FINAL_STATUS = 1, FINAL_EVENTS = 2, FINAL_METRICS = 4, FINAL_HEATMAP = 8, FINAL_CKPTS = 16 };
#define FINAL_ALL 31

typedef struct {
    struct MHD_Connection *c;
    int fd, shut;
    double t; /* opened, or the last request it made */
} dash_conn;

struct sup_dash {
    struct MHD_Daemon *mhd;
    int fd;
    int live;
    char run_dir[4096], token[33], addr[64], url[512];
    pthread_mutex_t mu; /* the model, the files' readers */
    dash_model *model;
    dash_tail events, metrics, compute;
    double t_refresh;
    /* the live view as pushed; its own lock, so that a push never waits
     * for the files to be read (the driver's loop must not stall) */
    pthread_mutex_t view_mu;
    sup_dash_live view;
    sup_dash_rank *ranks;
    int ranks_cap, have_view;
    sup_dash_live shown; /* the server thread's copy of it */
    sup_dash_rank *shown_ranks;
    int shown_cap;
    dash_conn conns[CONN_HARD]; /* the server thread's only */
    int n_conns;
    long version; /* lines read (d->mu) */
    long work;    /* the events' work in this refresh (d->mu) */
    char *heat;   /* the heat map's reply at heat_version (d->mu) */
    size_t heat_len;
    long heat_version;
    double t_asked; /* the last request's time (view_mu) */
    int finishing;  /* sup_dash_finish was called: the server exits after it (d->mu) */
    int final_seen; /* after it: a FINAL_* bit for each endpoint served in full (d->mu) */
};

/* ---- the files ------------------------------------------------------------ */

/* Each feeds the model (arg: the sup_dash) and counts a change.  The events' work is
 * bounded per refresh (EVENT_WORK_PER_REFRESH rank records): the rest waits for the next
 * refresh.  (Bytes alone bounded nothing: 16 MiB of job_done lines of a job of 65536 ranks
 * held the server's one thread, every request and its stop, for minutes.) */
static int event_line(void *arg, const char *line, size_t len) {
    sup_dash *d = arg;
    d->version++;
    d->work += dash_model_event_line(d->model, line, len);
    return d->work >= EVENT_WORK_PER_REFRESH;
}
static int metrics_line(void *arg, const char *line, size_t len) {
    sup_dash *d = arg;
    d->version++;
    dash_model_metrics_line(d->model, line, len);
    return 0;
}
static int compute_line(void *arg, const char *line, size_t len) {
    sup_dash *d = arg;
    d->version++;
    dash_model_compute_line(d->model, line, len);
    return 0;
}
static void metrics_replaced(void *arg) {
    sup_dash *d = arg;
    d->version++;
    dash_model_metrics_reset(d->model);
}

/* 1 if path is the driver's default metrics file (NAME/metrics.jsonl) of a directory other
 * than run_dir. */
static int other_default(const char *path, const char *run_dir) {
    const char *slash = strrchr(path, '/');
    if (!slash || strcmp(slash + 1, "metrics.jsonl")) return 0;
    char dir[4200];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    struct stat a, b;
    return stat(dir, &a) == 0 && stat(run_dir, &b) == 0 &&
           (a.st_dev != b.st_dev || a.st_ino != b.st_ino);
}

/* Read what the files gained (d->mu held). */
static void refresh(sup_dash *d) {
    double now = ms_now();
    if (now - d->t_refresh < REFRESH_S) return;
    d->t_refresh = now;
    d->work = 0;
    dash_tail_read(&d->events, READ_PER_REFRESH, event_line, d, NULL);
    /* the file job_start names, an absolute path: if it is not there (the
     * run directory was copied or moved since), the driver's default one; and
     * that one too when job_start names the default of another directory (a
     * copy of a run whose original is still there: it showed the original's) */
    const char *mp = dash_model_metrics_path(d->model);
    char want[4200];
    snprintf(want, sizeof want, "%s/metrics.jsonl", d->run_dir);
    /* (only the driver's own file of a copied run: not the driver's server, whose job names
     * the file it writes, nor a file the train options named, as O/metrics.jsonl of an
     * --out-dir O beside a stale RUN_DIR/metrics.jsonl) */
    if (*mp && access(mp, F_OK) == 0 &&
        !(!d->live && dash_model_own_metrics(d->model) && access(want, F_OK) == 0 &&
          other_default(mp, d->run_dir)))
        snprintf(want, sizeof want, "%s", mp);
    if (strcmp(want, d->metrics.path)) { /* the events named another metrics file */
        dash_tail_free(&d->metrics);
        dash_tail_init(&d->metrics, want);
        metrics_replaced(d);
    }
    dash_tail_read(&d->metrics, READ_PER_REFRESH, metrics_line, d, metrics_replaced);
    dash_tail_read(&d->compute, READ_PER_REFRESH, compute_line, d, NULL);
}

void sup_dash_push(sup_dash *d, const sup_dash_live *l) {
    if (!d) return;
    pthread_mutex_lock(&d->view_mu);
    if (l->n_ranks > d->ranks_cap) {
        sup_dash_rank *r = realloc(d->ranks, sizeof *r * (size_t)l->n_ranks);
        if (r) d->ranks = r, d->ranks_cap = l->n_ranks;
    }
    if (l->n_ranks <= d->ranks_cap) {
        d->view = *l;
        if (l->n_ranks) memcpy(d->ranks, l->ranks, sizeof *d->ranks * (size_t)l->n_ranks);
        d->view.ranks = d->ranks;
        d->have_view = 1;
    }
    pthread_mutex_unlock(&d->view_mu);
}

/* A copy of the live view (the server thread's), or NULL if none was pushed. */
static const sup_dash_live *live_view(sup_dash *d) {
    const sup_dash_live *out = NULL;
    pthread_mutex_lock(&d->view_mu);
    if (d->have_view && d->view.n_ranks > d->shown_cap) {
        sup_dash_rank *r = realloc(d->shown_ranks, sizeof *r * (size_t)d->view.n_ranks);
        if (r) d->shown_ranks = r, d->shown_cap = d->view.n_ranks;
    }
    if (d->have_view && d->view.n_ranks <= d->shown_cap) {
        d->shown = d->view;
        if (d->view.n_ranks)
            memcpy(d->shown_ranks, d->view.ranks, sizeof *d->ranks * (size_t)d->view.n_ranks);
        d->shown.ranks = d->shown_ranks;
        out = &d->shown;
    }
    pthread_mutex_unlock(&d->view_mu);
    return out;
}

/* ---- replies ---------------------------------------------------------------- */

static enum MHD_Result send_reply(struct MHD_Connection *c, unsigned status, const char *type,
                                  const void *body, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (type) MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer"); /* the token is in the URL */
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, "Allow", "GET, HEAD");
    if (status == MHD_HTTP_UNAUTHORIZED) /* RFC 7235: a 401 names its scheme */
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"megascale dashboard\"");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' "
                            "data:; frame-ancestors 'none'");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* The length of the valid UTF-8 character (RFC 3629: no overlong form, no
 * surrogate, at most U+10FFFF) at s[0, n), or 0. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0], cp, min;
    size_t len;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (len > n) return 0;
    cp = c & (0x7fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : len;
}

/* JSON is UTF-8, but the run's files (a rank's error line, a path) may hold
 * any bytes, which cJSON passes on: each invalid byte becomes U+FFFD.
 * *text is replaced (cJSON_free'd) when it changes; -1: out of memory. */
static int utf8_repair(char **text, size_t *n) {
    const unsigned char *s = (const unsigned char *)*text;
    size_t i = 0, k;
    while (i < *n && (k = utf8_char(s + i, *n - i)) > 0)
        i += k;
    if (i == *n) return 0;
    char *out = cJSON_malloc(3 * *n + 1), *o = out;
    if (!out) return -1;
    memcpy(o, s, i);
    o += i;
    while (i < *n) {
        if ((k = utf8_char(s + i, *n - i)) > 0) {
            memcpy(o, s + i, k);
            o += k, i += k;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3, i++;
        }
    }
    *o = 0;
    cJSON_free(*text);
    *text = out;
    *n = (size_t)(o - out);
    return 0;
}

/* o as JSON text (o is deleted); NULL when out of memory. */
static char *json_text(cJSON *o, size_t *n) {
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    *n = text ? strlen(text) : 0;
    if (text && utf8_repair(&text, n) != 0) {
        cJSON_free(text);
        text = NULL;
    }
    return text;
}

static enum MHD_Result send_text(struct MHD_Connection *c, const char *text, size_t n) {
    if (!text)
        return send_reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", "out of memory\n", 14);
    if (n > REPLY_MAX)
        return send_reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", "reply too large\n", 16);
    return send_reply(c, MHD_HTTP_OK, "application/json", text, n);
}

static enum MHD_Result send_json(struct MHD_Connection *c, cJSON *o) {
    size_t n;
    char *text = json_text(o, &n);
    enum MHD_Result ret = send_text(c, text, n);
    cJSON_free(text);
    return ret;
}

/* The page with its token filled in. */
static enum MHD_Result send_page(sup_dash *d, struct MHD_Connection *c, const dash_asset *a) {
    if (!a->templated) return send_reply(c, MHD_HTTP_OK, a->type, a->data, a->len);
    static const char mark[] = "{{token}}";
    size_t ml = sizeof mark - 1, tl = strlen(d->token), cap = a->len + 1, n = 0;
    for (size_t i = 0; i + ml <= a->len; i++)
        if (!memcmp(a->data + i, mark, ml)) cap += tl;
    char *out = malloc(cap);
    if (!out) return send_reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", "", 0);
    for (size_t i = 0; i < a->len;) {
        if (i + ml <= a->len && !memcmp(a->data + i, mark, ml)) {
            memcpy(out + n, d->token, tl);
            n += tl;
            i += ml;
        } else {
            out[n++] = (char)a->data[i++];
        }
    }
    enum MHD_Result ret = send_reply(c, MHD_HTTP_OK, a->type, out, n);
    free(out);
    return ret;
}

/* The request's token: ?token=T, or "Authorization: Bearer T". */
static int authorized(const sup_dash *d, struct MHD_Connection *c) {
    const char *t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "token");
    if (t && sup_token_eq(t, d->token)) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    /* the scheme's name is case-insensitive (RFC 7235) */
    return h && !strncasecmp(h, "Bearer ", 7) && sup_token_eq(h + 7, d->token);
}

/* ?name=N, an integer in [lo, hi] (absent: def); -2 when malformed. */
static long query_long(struct MHD_Connection *c, const char *name, long lo, long hi, long def) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v) return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) return -2;
    return x;
}

static enum MHD_Result bad_request(struct MHD_Connection *c, const char *why) {
    return send_reply(c, MHD_HTTP_BAD_REQUEST, "text/plain", why, strlen(why));
}

/* 1 if a process holds an flock on path (the kernel's list, /proc/locks: read, never taken,
 * so that a driver starting meanwhile never finds it held by this server), 0 if none does,
 * -1 when it cannot be told (no such file: a run of an older version, or events alone). */
static int flock_held(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return -1;
    FILE *f = fopen("/proc/locks", "r");
    if (!f) return -1;
    /* the inode alone: the device a container's overlay file system reports in stat is not
     * always the one the kernel lists (a lock missed would call a live job abandoned; a
     * foreign lock on the same inode number only keeps the warning back) */
    char line[256], want[64];
    snprintf(want, sizeof want, ":%llu ", (unsigned long long)sb.st_ino);
    int held = 0;
    for (int n = 0; !held && n < 100000 && fgets(line, sizeof line, f); n++)
        held = strstr(line, " FLOCK ") && strstr(line, want);
    fclose(f);
    return held;
}

/* What the page should know that the files do not say (d->mu held), or "": the events file
 * gone (the run directory deleted or moved), or a job that has not ended with no driver
 * left (killed, or its host lost): its state would read "running" for ever. */
static void files_warning(sup_dash *d, cJSON *status, char *out, size_t n) {
    out[0] = 0;
    /* gone: read before (a plain `train --out-dir` run has none: no warning; before, every
     * such run said its events file "is gone") */
    if (d->events.ino && access(d->events.path, F_OK) != 0) {
        snprintf(out, n,
                 "%s is gone (the run directory deleted or moved?): what is shown is what was "
                 "read before",
                 d->events.path);
        return;
    }
    /* not read to its end yet (a long run's first look, a line of many MiB: a refresh reads
     * READ_PER_REFRESH of each): the state it shows is the one read so far; before, such a
     * job with its end still unread was called abandoned */
    const dash_tail *tails[] = {&d->events, &d->metrics, &d->compute};
    for (size_t i = 0; i < sizeof tails / sizeof *tails; i++)
        if (tails[i]->ino && tails[i]->off < tails[i]->size) {
            snprintf(out, n,
                     "%s is still being read (%.1f of its %.1f MB so far): what is shown is what "
                     "was read, and the rest follows",
                     tails[i]->path, (double)tails[i]->off / 1e6, (double)tails[i]->size / 1e6);
            return;
        }
    cJSON *job = cJSON_GetObjectItemCaseSensitive(status, "job");
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(job, "state");
    const char *now = cJSON_IsString(state) ? state->valuestring : "";
    if (d->live || !strcmp(now, "done") || !strcmp(now, "failed") || !strcmp(now, "stopped"))
        return;
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/driver.lock", d->run_dir);
    /* a lock file that is not there is held by none (a run directory copied without it read
     * "running" for ever); only a kernel's list that cannot be read says nothing */
    int held = flock_held(lock);
    if (held == 1 || (held < 0 && access(lock, F_OK) == 0)) return;
    if (!d->events.ino) return; /* no events: a plain run, no driver to lose */
    cJSON_ReplaceItemInObjectCaseSensitive(job, "state", cJSON_CreateString("abandoned"));
    /* nor are its ranks known to run any more (before, they read "running" for ever): each
     * live one reads "unknown", what the events said last kept as last_state */
    cJSON *ranks = cJSON_GetObjectItemCaseSensitive(status, "ranks"), *r;
    cJSON_ArrayForEach(r, ranks) {
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r, "state");
        const char *was = cJSON_IsString(rs) ? rs->valuestring : "";
        if (strcmp(was, "starting") && strcmp(was, "running") && strcmp(was, "slow") &&
            strcmp(was, "hung"))
            continue;
        cJSON_AddStringToObject(r, "last_state", was); /* before the replace frees it */
        cJSON_ReplaceItemInObjectCaseSensitive(r, "state", cJSON_CreateString("unknown"));
    }
    /* its time ends with its last sign of life (before, it counted on to now) */
    const cJSON *started = cJSON_GetObjectItemCaseSensitive(job, "started");
    double last = dash_model_last_time(d->model);
    if (cJSON_IsNumber(started) && isfinite(last) && last >= started->valuedouble)
        cJSON_ReplaceItemInObjectCaseSensitive(job, "wall_s",
                                               cJSON_CreateNumber(last - started->valuedouble));
    snprintf(out, n,
             "no driver holds %s and the events end without the job's end: its driver was "
             "killed or its host lost (`megascale launch` with the same --run-dir takes the job "
             "over)",
             lock);
}

static enum MHD_Result api(sup_dash *d, struct MHD_Connection *c, const char *url) {
    long since = query_long(c, "since", -1, 2000000000L, -1);
    if (since == -2) return bad_request(c, "since: an integer in [-1, 2000000000]\n");
    long val_since = query_long(c, "val_since", -1, 2000000000L, since); /* default: since */
    if (val_since == -2) return bad_request(c, "val_since: an integer in [-1, 2000000000]\n");
    long final = query_long(c, "final", 0, 1, 0); /* a page's last read of this endpoint */
    if (final == -2) return bad_request(c, "final: 0 or 1\n");
    pthread_mutex_lock(&d->mu);
    refresh(d);
    cJSON *o = NULL;
    int known = 1;
    static const sup_dash_live none = {.ettr = NAN}; /* a driver that has not pushed yet */
    /* what a page read after the driver's end (sup_dash_finish): a read it
     * marks as its last of an endpoint (final=1: begun once it knew the
     * server closes; a read begun before, still in flight, is not, and the
     * page reads again), a paged reply once it is the last page; the
     * status that says closing is the page's last status read */
    int final_bit = !d->finishing                          ? 0
                    : !final && strcmp(url, "/api/status") ? 0
                    : !strcmp(url, "/api/status")          ? FINAL_STATUS
                    : !strcmp(url, "/api/events")          ? FINAL_EVENTS
                    : !strcmp(url, "/api/metrics")         ? FINAL_METRICS
                    : !strcmp(url, "/api/heatmap")         ? FINAL_HEATMAP
                    : !strcmp(url, "/api/checkpoints")     ? FINAL_CKPTS
                                                           : 0;
    if (!strcmp(url, "/api/status")) {
        const sup_dash_live *live = d->live ? live_view(d) : NULL;
        o = dash_model_status(d->model, d->live && !live ? &none : live, d->run_dir, ms_wall_now());
        char warn[4600];
        if (o) files_warning(d, o, warn, sizeof warn);
        if (o && warn[0])
            cJSON_AddStringToObject(o, "warning", warn);
        else if (o)
            cJSON_AddNullToObject(o, "warning");
        /* the job has ended and this server exits once the page has read the rest */
        if (o) cJSON_AddBoolToObject(o, "closing", d->finishing);
    } else if (!strcmp(url, "/api/metrics"))
        o = dash_model_metrics(d->model, since, val_since, /* -1: step 0's val too */
                               DASH_METRICS_REPLY);
    else if (!strcmp(url, "/api/events"))
        o = dash_model_events(d->model, since, DASH_EVENTS_REPLY);
    else if (!strcmp(url, "/api/heatmap")) { /* the dearest: made again only when a line came */
        if (!d->heat || d->heat_version != d->version) {
            cJSON_free(d->heat);
            d->heat = json_text(dash_model_heatmap(d->model, DASH_HEAT_COLS), &d->heat_len);
            d->heat_version = d->version;
        }
        enum MHD_Result ret = send_text(c, d->heat, d->heat_len); /* copied */
        if (ret == MHD_YES) d->final_seen |= final_bit;
        pthread_mutex_unlock(&d->mu);
        return ret;
    } else if (!strcmp(url, "/api/checkpoints"))
        o = dash_model_checkpoints(d->model);
    else
        known = 0;
    if (o && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "more"))) d->final_seen |= final_bit;
    pthread_mutex_unlock(&d->mu);
    if (!known) return send_reply(c, MHD_HTTP_NOT_FOUND, "text/plain", "not found\n", 10);
    return send_json(c, o);
}

/* ---- connections ------------------------------------------------------------ */

/* A connection opens (or closes).  Past CONN_LIMIT open ones, the one that
 * has been quiet the longest (opened, or last asked, longest ago) is shut
 * down: a client that holds connections without finishing a request (one
 * header line every few seconds: slowloris) cannot lock others out for
 * longer than it takes them to connect.  libmicrohttpd then closes it. */
static void on_conn(void *cls, struct MHD_Connection *c, void **ctx,
                    enum MHD_ConnectionNotificationCode what) {
    sup_dash *d = cls;
    (void)ctx;
    if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
        for (int i = 0; i < d->n_conns; i++)
            if (d->conns[i].c == c) {
                d->conns[i] = d->conns[--d->n_conns];
                break;
            }
        return;
    }
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info || d->n_conns == CONN_HARD) return;
    d->conns[d->n_conns++] = (dash_conn){c, info->connect_fd, 0, ms_now()};
    int open = 0, quiet = -1;
    for (int i = 0; i < d->n_conns - 1; i++) {
        if (d->conns[i].shut) continue;
        open++;
        if (quiet < 0 || d->conns[i].t < d->conns[quiet].t) quiet = i;
    }
    if (open >= CONN_LIMIT && quiet >= 0) {
        shutdown(d->conns[quiet].fd, SHUT_RDWR);
        d->conns[quiet].shut = 1;
    }
}

/* A request came on c (its line and headers are in). */
static void conn_asked(sup_dash *d, struct MHD_Connection *c) {
    double now = ms_now();
    for (int i = 0; i < d->n_conns; i++)
        if (d->conns[i].c == c) d->conns[i].t = now;
}

/* A page with the token asked: sup_dash_finish waits for its last reads (a request without
 * the token is none: it kept a driver's end waiting for 5 s). */
static void page_asked(sup_dash *d) {
    pthread_mutex_lock(&d->view_mu);
    d->t_asked = ms_now();
    pthread_mutex_unlock(&d->view_mu);
}

/* libmicrohttpd's unescaping of the path and of each argument, refusing a
 * %00: the NUL would end the string the handler compares
 * ("/api/status%00x" answered as /api/status).  Such a path or argument
 * becomes "\x7f", which no path, asset or token is. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls, (void)c;
    size_t n = MHD_http_unescape(s);
    if (!memchr(s, 0, n)) return n;
    s[0] = 0x7f, s[1] = 0;
    return 1;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **req) {
    sup_dash *d = cls;
    (void)url, (void)version, (void)upload;
    /* A GET or HEAD without a body is answered on the second call, once
     * libmicrohttpd has read the whole request: a reply queued on the first
     * one closes the connection, and a polling page would open one a poll.
     * Anything with a body is answered at once (and the connection closed:
     * no body is ever read). */
    int body = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH) ||
               MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (!*req) {
        *req = d;
        /* only a request with the token keeps its connection from being the quiet one that
         * makes room (on_conn): token-less requests on held connections kept them looking
         * busy, and a flood of them crowded out the page's own */
        if (authorized(d, c)) conn_asked(d, c);
        if (!body &&
            (!strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD)))
            return MHD_YES;
    } else if (*upload_size) { /* not reached: a request with a body was answered above */
        return MHD_NO;
    }
    /* the token first: every request without it is 401, whatever its method (a POST was
     * 405, which told a stranger what the server takes) */
    if (!authorized(d, c)) return send_reply(c, MHD_HTTP_UNAUTHORIZED, NULL, "", 0);
    page_asked(d);
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return send_reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "", 0);
    const dash_asset *a = dash_asset_find(url);
    if (a) return send_page(d, c, a);
    if (!strncmp(url, "/api/", 5)) return api(d, c, url);
    return send_reply(c, MHD_HTTP_NOT_FOUND, "text/plain", "not found\n", 10);
}

/* ---- start, stop ---------------------------------------------------------------- */

int sup_dash_start(sup_dash **out, const sup_dash_config *c, char *why, size_t n) {
    *out = NULL;
    sup_dash *d = calloc(1, sizeof *d);
    if (!d || !(d->model = dash_model_new()) || sup_make_token(d->token) != 0) {
        if (d) dash_model_free(d->model);
        free(d);
        return snprintf(why, n, "out of memory or no random token"), -1;
    }
    d->fd = -1;
    d->live = c->live;
    snprintf(d->run_dir, sizeof d->run_dir, "%s", c->run_dir);
    char path[4200];
    if (c->events && *c->events)
        snprintf(path, sizeof path, "%s", c->events);
    else
        snprintf(path, sizeof path, "%s/events.jsonl", c->run_dir);
    dash_tail_init(&d->events, path);
    snprintf(path, sizeof path, "%s/compute.jsonl", c->run_dir);
    dash_tail_init(&d->compute, path);
    dash_tail_init(&d->metrics, "");
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->view_mu, NULL);
    d->t_refresh = -1e9;
    if (sup_listen(c->bind ? c->bind : "127.0.0.1", c->port, &d->fd, d->addr, sizeof d->addr, why,
                   n) != 0) {
        sup_dash_stop(d);
        return -1;
    }
    d->mhd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC, 0, NULL, NULL, handle, d,
        MHD_OPTION_LISTEN_SOCKET, d->fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONN_HARD,
        MHD_OPTION_NOTIFY_CONNECTION, on_conn, d, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY, MHD_OPTION_UNESCAPE_CALLBACK,
        unescape, NULL, MHD_OPTION_END);
    if (!d->mhd) {
        snprintf(why, n, "dashboard: libmicrohttpd could not start its server on %s", d->addr);
        sup_dash_stop(d);
        return -1;
    }
    /* bound to every address (0.0.0.0, ::): the URL names this host, which a browser
     * elsewhere can open (http://0.0.0.0:PORT/ opens nothing) */
    char where[sizeof d->addr + 256];
    snprintf(where, sizeof where, "%s", d->addr);
    const char *colon = strrchr(d->addr, ':');
    char host[256];
    if (colon && (!strncmp(d->addr, "0.0.0.0:", 8) || !strncmp(d->addr, "[::]:", 5)) &&
        gethostname(host, sizeof host) == 0) {
        host[sizeof host - 1] = 0;
        snprintf(where, sizeof where, "%s%s", host, colon);
    }
    snprintf(d->url, sizeof d->url, "http://%s/?token=%s", where, d->token);
    *out = d;
    return 0;
}

const char *sup_dash_url(const sup_dash *d) {
    return d->url;
}

const char *sup_dash_token(const sup_dash *d) {
    return d->token;
}

const char *sup_dash_addr(const sup_dash *d) {
    return d->addr;
}

void sup_dash_finish(sup_dash *d, double linger_s) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->live = 0; /* the files alone from now on: the job's end as the events say it */
    d->finishing = 1;
    d->final_seen = 0;
    d->t_refresh = -1e9; /* the last lines, at the next request */
    pthread_mutex_unlock(&d->mu);
    double t0 = ms_now();
    pthread_mutex_lock(&d->view_mu);
    double asked = d->t_asked;
    pthread_mutex_unlock(&d->view_mu);
    if (t0 - asked > SUP_DASH_WATCHED_S) return; /* no page is polling */
    for (;;) {
        pthread_mutex_lock(&d->mu);
        int seen = d->final_seen;
        pthread_mutex_unlock(&d->mu);
        if (seen == FINAL_ALL || ms_now() - t0 >= linger_s) return;
        usleep(50000);
    }
}

void sup_dash_stop(sup_dash *d) {
    if (!d) return;
    if (d->mhd) {
        MHD_quiesce_daemon(d->mhd); /* the listening socket stays ours to close */
        MHD_stop_daemon(d->mhd);
    }
    if (d->fd >= 0) close(d->fd);
    dash_tail_free(&d->events);
    dash_tail_free(&d->metrics);
    dash_tail_free(&d->compute);
    dash_model_free(d->model);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->view_mu);
    free(d->ranks);
    free(d->shown_ranks);
    cJSON_free(d->heat);
    free(d);
}
