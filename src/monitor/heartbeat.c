/* heartbeat.c - the heartbeat client and its thread (see heartbeat.h). */
#include "monitor/heartbeat.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/node.h"
#include "base/timeutil.h"

#define HB_CONNECT_S 5.0
#define HB_RECONNECT_S 2.0
#define HB_TOKEN_MAX 64
#define HB_WAIT_NEWS_S 0.25 /* a wait this long, not in the last beat: beaten at once */

struct mon_heartbeat {
    char host[256], port[16], token[HB_TOKEN_MAX + 1], hostname[128];
    char node[MS_NODE_NAME_MAX]; /* "": not sent */
    int rank, world, stage;      /* stage: -1 when not sent */
    double period_s;
    long long (*comm_bytes)(void *);
    double (*comm_blocked_s)(void *);
    int (*comm_dumps)(void *);
    int dumps_sent; /* the beat thread's: comm_dumps in the last beat */
    double wait_from_sent; /* the beat thread's: when the wait the last beat showed began (0:
                            * it showed none) */
    void *comm_ctx;
    int fd;                 /* thread: -1 while disconnected */
    double next_connect;    /* thread */
    unsigned long long seq; /* thread */
    int warned;             /* thread */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t sent_cv; /* a beat went out (mon_heartbeat_flush) */
    /* under mu */
    int stop, dirty;
    unsigned long long taken, sent; /* beats the thread began and finished sending */
    int urgent;                     /* a flush waits: connect at once if the connection is lost */
    int step;
    int redone;    /* steps redone after a non-finite result that came out finite, cumulative */
    int skipped;   /* steps whose update was skipped (not finite, redos too), cumulative... */
    int skip_step; /* ...and the last of them (0: none) */
    int nan_step;                 /* the last step with a non-finite gradient (0: none)... */
    int nan_ranks[MON_NAN_RANKS], n_nan_ranks; /* ...and the ranks where it was */
    int ckpt_commit, ckpt_failed; /* mon_heartbeat_ckpt (-1, 0: nothing to say) */
    char ckpt_error[512];
    int ckpt_warned, ckpt_warn_step; /* mon_heartbeat_ckpt_warned (0: nothing to say) */
    char ckpt_warning[512];
    double step_ms, compute_ms, loss, grad_norm;
    char phase[16];
    char error[1024];
    int usage;     /* the error is a usage error */
    int stop_here; /* phase stopped: this rank was asked to stop (not another's agreement) */
    int start;     /* the step the training loop began at (mon_heartbeat_train; -1: not yet) */
    int attempt;   /* mon_heartbeat_config's (0: not sent) */
};

static ms_status parse_addr(mon_heartbeat *hb, const char *addr) {
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof hb->host || !colon[1] ||
        strlen(colon + 1) >= sizeof hb->port ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) || strtol(colon + 1, NULL, 10) < 1 ||
        strtol(colon + 1, NULL, 10) > 65535) /* getaddrinfo would take 70000 as 4464 */
        return ms_error(MS_ERR_ARG, "--heartbeat '%s': expected HOST:PORT (PORT 1..65535)",
                        addr ? addr : "");
    snprintf(hb->host, sizeof hb->host, "%.*s", (int)(colon - addr), addr);
    snprintf(hb->port, sizeof hb->port, "%s", colon + 1);
    return MS_OK;
}

/* A connected socket, or -1 (errno set), within HB_CONNECT_S an address. */
static int dial(const mon_heartbeat *hb) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(hb->host, hb->port, &hints, &res) != 0 || !res) {
        errno = EHOSTUNREACH;
        return -1;
    }
    /* every address the name has, in order (a name whose first is ::1
     * while the driver listens on 127.0.0.1 was never reached) */
    int fd = -1, e = ECONNREFUSED;
    for (const struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        int rc = fd < 0 ? -1 : connect(fd, a->ai_addr, a->ai_addrlen);
        if (fd >= 0 && rc != 0 && errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            int err = 0;
            socklen_t len = sizeof err;
            if (poll(&p, 1, (int)(HB_CONNECT_S * 1000)) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
                rc = 0;
            else
                errno = err ? err : ETIMEDOUT;
        }
        if (rc != 0) {
            e = errno;
            if (fd >= 0) close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        errno = e;
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    struct timeval tv = {1, 0}; /* a send never blocks training for long */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

static void add_num(cJSON *o, const char *k, double v) {
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

/* This beat's line (malloc'd, newline-terminated), from the state under mu. */
/* o's string k cut to at most max bytes (not inside a UTF-8 sequence), if it is longer. */
static void shorten(cJSON *o, const char *k, size_t max) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(x) || strlen(x->valuestring) <= max) return;
    char cut[1024];
    if (max >= sizeof cut) max = sizeof cut - 1;
    const char *s = x->valuestring; /* longer than max: s[max] is its next byte */
    while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80)
        max--;
    memcpy(cut, s, max);
    cut[max] = 0;
    cJSON_ReplaceItemInObjectCaseSensitive(o, k, cJSON_CreateString(cut));
}

/* The time this rank has waited in communication (comm_blocked_s), taken as said: the wait
 * is no news to wait_news (beat thread only). */
static double wait_said(mon_heartbeat *hb) {
    double w = hb->comm_blocked_s(hb->comm_ctx);
    hb->wait_from_sent = w > 0 ? ms_now() - w : 0;
    return w;
}

static char *beat_line(mon_heartbeat *hb) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "v", 1);
    cJSON_AddStringToObject(o, "token", hb->token);
    cJSON_AddNumberToObject(o, "rank", hb->rank);
    cJSON_AddNumberToObject(o, "world", hb->world);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    cJSON_AddStringToObject(o, "host", hb->hostname);
    if (hb->node[0]) cJSON_AddStringToObject(o, "node", hb->node);
    if (hb->stage >= 0) cJSON_AddNumberToObject(o, "stage", hb->stage);
    if (hb->attempt > 0) cJSON_AddNumberToObject(o, "attempt", hb->attempt);
    cJSON_AddNumberToObject(o, "seq", (double)++hb->seq);
    pthread_mutex_lock(&hb->mu);
    cJSON_AddNumberToObject(o, "step", hb->step);
    cJSON_AddStringToObject(o, "phase", hb->phase);
    add_num(o, "step_ms", hb->step_ms);
    add_num(o, "compute_ms", hb->compute_ms);
    add_num(o, "loss", hb->loss);
    add_num(o, "grad_norm", hb->grad_norm);
    cJSON_AddNumberToObject(o, "redone", hb->redone);
    if (hb->start >= 0) cJSON_AddNumberToObject(o, "start", hb->start);
    if (hb->skipped > 0) {
        cJSON_AddNumberToObject(o, "skipped", hb->skipped);
        cJSON_AddNumberToObject(o, "skip_step", hb->skip_step);
    }
    if (hb->nan_step > 0) {
        cJSON_AddNumberToObject(o, "nan_step", hb->nan_step);
        cJSON_AddItemToObject(o, "nan_ranks",
                              cJSON_CreateIntArray(hb->nan_ranks, hb->n_nan_ranks < MON_NAN_RANKS
                                                                      ? hb->n_nan_ranks
                                                                      : MON_NAN_RANKS));
    }
    if (hb->ckpt_commit >= 0) cJSON_AddNumberToObject(o, "ckpt_commit", hb->ckpt_commit);
    if (hb->ckpt_failed > 0) {
        cJSON_AddNumberToObject(o, "ckpt_failed", hb->ckpt_failed);
        cJSON_AddStringToObject(o, "ckpt_error", hb->ckpt_error);
    }
    if (hb->ckpt_warned > 0) {
        cJSON_AddNumberToObject(o, "ckpt_warned", hb->ckpt_warned);
        cJSON_AddNumberToObject(o, "ckpt_warn_step", hb->ckpt_warn_step);
        cJSON_AddStringToObject(o, "ckpt_warning", hb->ckpt_warning);
    }
    if (hb->error[0]) cJSON_AddStringToObject(o, "error", hb->error);
    if (hb->usage) cJSON_AddTrueToObject(o, "usage");
    if (hb->stop_here && !strcmp(hb->phase, "stopped")) cJSON_AddTrueToObject(o, "stop_here");
    hb->dirty = 0;
    pthread_mutex_unlock(&hb->mu);
    cJSON_AddNumberToObject(o, "comm_bytes",
                            hb->comm_bytes ? (double)hb->comm_bytes(hb->comm_ctx) : 0);
    if (hb->comm_blocked_s) { /* 0.1 s is plenty for telling a stuck rank from its waiting peers */
        cJSON_AddNumberToObject(o, "comm_wait_s", round(wait_said(hb) * 10) / 10);
    }
    if (hb->comm_dumps) {
        hb->dumps_sent = hb->comm_dumps(hb->comm_ctx);
        cJSON_AddNumberToObject(o, "dumps", hb->dumps_sent);
    }
    char *text = cJSON_PrintUnformatted(o);
    if (text && strlen(text) + 1 > MON_HB_LINE_MAX) {
        /* the texts, escaped (a quote or a backslash doubles), could pass the line's bound,
         * and a line too long is never sent: the driver would hear nothing more */
        shorten(o, "ckpt_warning", 160);
        shorten(o, "ckpt_error", 320);
        shorten(o, "error", 640);
        free(text);
        text = cJSON_PrintUnformatted(o);
    }
    cJSON_Delete(o);
    size_t n = text ? strlen(text) : 0;
    char *line = text ? realloc(text, n + 2) : NULL;
    if (!line) {
        free(text);
        return NULL;
    }
    line[n] = '\n', line[n + 1] = 0;
    return line;
}

/* Send one beat; (re)connect when due.  urgent (a flush: an injected fault
 * or the process's end follows; the last beat): connect now, whenever the
 * last try was, and once more if the send fails (before, a flush within 2 s
 * of a lost connection returned with nothing sent, and the driver never
 * learnt the steps done or the error).  Thread only. */
static void send_beat(mon_heartbeat *hb, int urgent) {
    for (int tries = 0; tries <= urgent; tries++) {
        double now = ms_now();
        if (hb->fd < 0 && (urgent || now >= hb->next_connect)) {
            hb->fd = dial(hb);
            /* from the dial's end: one that timed out (5 s an address) is not
             * followed by another at once, nor by one more at the close */
            hb->next_connect = ms_now() + HB_RECONNECT_S;
        }
        if (hb->fd < 0) { /* nobody to tell: the next beat after a period, the whole state then */
            pthread_mutex_lock(&hb->mu);
            hb->dirty = 0; /* left set, the thread's wait returned at once: a spinning core */
            pthread_mutex_unlock(&hb->mu);
            if (hb->comm_blocked_s) /* nor the news of a wait, every 0.1 s while it lasts */
                (void)wait_said(hb);
            return;
        }
        char *line = beat_line(hb);
        size_t n = line ? strlen(line) : 0;
        if (line && n <= MON_HB_LINE_MAX && send(hb->fd, line, n, MSG_NOSIGNAL) == (ssize_t)n) {
            free(line);
            return;
        }
        if (!hb->warned)
            ms_warn("heartbeat: lost the driver at %s:%s (%s); training goes on, reconnecting",
                    hb->host, hb->port, strerror(errno));
        hb->warned = 1;
        free(line);
        close(hb->fd);
        hb->fd = -1;
    }
}

/* 1 if this rank has waited in communication for HB_WAIT_NEWS_S or more in a wait that began
 * after the one the last beat showed (none, or an earlier one). */
static int wait_news(mon_heartbeat *hb) {
    double w = hb->comm_blocked_s(hb->comm_ctx);
    return w >= HB_WAIT_NEWS_S && ms_now() - w > hb->wait_from_sent + 0.1;
}

static void *beat_main(void *arg) {
    mon_heartbeat *hb = arg;
    pthread_mutex_lock(&hb->mu);
    while (!hb->stop) {
        /* the next beat after a period; with comm_dumps, as soon as a hang
         * dump was answered too (the supervisor waits for it to stop a hung
         * job), and with comm_blocked_s, once a wait in communication that
         * the last beat did not show has lasted HB_WAIT_NEWS_S: looked at
         * every 0.1 s.  A rank that began to wait just after a beat said so
         * only a period later: a peer's --comm-timeout of 1 s ran out first,
         * and the supervisor, which books such a timeout on the rank it
         * waited for when that rank beats but waits for nobody, took the
         * waiting rank for the stuck one (the tp follower of a hung or stopped
         * ring leader in tp2 x pp2, 3 runs in 43) */
        for (double left = hb->period_s; !hb->dirty && !hb->stop && left > 0;) {
            int look = hb->comm_dumps || hb->comm_blocked_s;
            double slice = look && left > 0.1 ? 0.1 : left;
            struct timespec ts = ms_deadline(CLOCK_MONOTONIC, slice);
            pthread_cond_timedwait(&hb->cv, &hb->mu, &ts);
            left -= slice;
            if (hb->comm_dumps && hb->comm_dumps(hb->comm_ctx) != hb->dumps_sent) break;
            if (hb->comm_blocked_s && wait_news(hb)) break;
        }
        if (hb->stop) break;
        unsigned long long gen = ++hb->taken; /* holds every update made before this */
        int urgent = hb->urgent;
        hb->urgent = 0;
        pthread_mutex_unlock(&hb->mu);
        send_beat(hb, urgent);
        pthread_mutex_lock(&hb->mu);
        hb->sent = gen;
        pthread_cond_broadcast(&hb->sent_cv);
    }
    pthread_mutex_unlock(&hb->mu);
    /* the last word, "done" or "error": once more over a connection that
     * breaks at the send; a connection lost before is tried when due (a
     * driver's host unreachable would hold the exit 5 s an address) */
    send_beat(hb, hb->fd >= 0);
    return NULL;
}

ms_status mon_heartbeat_open(mon_heartbeat **out, const mon_heartbeat_config *c) {
    *out = NULL;
    if (!c->token || !*c->token) /* the driver's beats are refused without it */
        return ms_error(MS_ERR_ARG,
                        "--heartbeat %s needs --heartbeat-token (env MS_HEARTBEAT_TOKEN): the "
                        "job's token, which megascale launch gives every rank",
                        c->addr ? c->addr : "");
    if (strlen(c->token) > HB_TOKEN_MAX ||
        strspn(c->token, "0123456789abcdefABCDEF") != strlen(c->token))
        return ms_error(MS_ERR_ARG, "--heartbeat-token: expected up to %d hex digits",
                        HB_TOKEN_MAX);
    mon_heartbeat *hb = calloc(1, sizeof *hb);
    if (!hb) return ms_error(MS_ERR_NOMEM, "heartbeat: out of memory");
    ms_status st = parse_addr(hb, c->addr);
    if (st != MS_OK) {
        free(hb);
        return st;
    }
    snprintf(hb->token, sizeof hb->token, "%s", c->token);
    if (c->node && ms_node_name_ok(c->node)) snprintf(hb->node, sizeof hb->node, "%s", c->node);
    gethostname(hb->hostname, sizeof hb->hostname - 1);
    hb->rank = c->rank, hb->world = c->world;
    hb->stage = c->has_stage && c->stage >= 0 ? c->stage : -1;
    hb->start = -1;
    hb->attempt = c->attempt > 0 ? c->attempt : 0;
    hb->period_s = c->period_s > 0 ? c->period_s : 1.0;
    hb->comm_bytes = c->comm_bytes, hb->comm_ctx = c->comm_ctx;
    hb->comm_blocked_s = c->comm_blocked_s;
    hb->comm_dumps = c->comm_dumps;
    snprintf(hb->phase, sizeof hb->phase, "start");
    hb->loss = hb->grad_norm = hb->compute_ms = NAN;
    hb->ckpt_commit = -1;
    hb->fd = dial(hb);
    if (hb->fd < 0) {
        st = ms_error(MS_ERR_IO, "--heartbeat %s: cannot connect to the driver: %s", c->addr,
                      strerror(errno));
        free(hb);
        return st;
    }
    hb->next_connect = ms_now() + HB_RECONNECT_S;
    hb->dirty = 1;
    pthread_mutex_init(&hb->mu, NULL);
    /* waits on the monotonic clock: a wall clock stepped back (NTP, a VM
     * resumed) made the beat thread sleep that much longer, silent past
     * --heartbeat-timeout: a healthy rank taken for hung */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&hb->cv, &ca);
    pthread_cond_init(&hb->sent_cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&hb->thread, NULL, beat_main, hb);
    if (rc != 0) {
        close(hb->fd);
        free(hb);
        return ms_error(MS_ERR_INTERNAL, "heartbeat: cannot start its thread: %s", strerror(rc));
    }
    *out = hb;
    return MS_OK;
}

static void update(mon_heartbeat *hb, const char *phase, const char *error) {
    pthread_mutex_lock(&hb->mu);
    if (phase) snprintf(hb->phase, sizeof hb->phase, "%s", phase);
    if (error) {
        snprintf(hb->error, sizeof hb->error, "%s", error);
        for (char *p = hb->error; *p; p++) /* one line: the driver takes no control bytes */
            if ((unsigned char)*p < 0x20) *p = ' ';
    }
    hb->dirty = 1;
    pthread_cond_signal(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
}

void mon_heartbeat_phase(mon_heartbeat *hb, const char *phase) {
    if (hb) update(hb, phase, NULL);
}

void mon_heartbeat_train(mon_heartbeat *hb, int step) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    hb->step = step;
    hb->start = step; /* said in every beat: a beat covers the latest state only, and under load
                         the first one the driver got said step start+1 (it counted one step
                         fewer redone) */
    pthread_mutex_unlock(&hb->mu);
    update(hb, "train", NULL);
}

void mon_heartbeat_ckpt(mon_heartbeat *hb, int last_commit, int fail_streak, const char *msg) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    int changed = hb->ckpt_commit != last_commit || hb->ckpt_failed != fail_streak;
    hb->ckpt_commit = last_commit;
    hb->ckpt_failed = fail_streak;
    snprintf(hb->ckpt_error, sizeof hb->ckpt_error, "%s", fail_streak > 0 && msg ? msg : "");
    for (char *c = hb->ckpt_error; *c; c++) /* one line, printable */
        if ((unsigned char)*c < 0x20) *c = ' ';
    if (changed) {
        hb->dirty = 1;
        pthread_cond_signal(&hb->cv);
    }
    pthread_mutex_unlock(&hb->mu);
}

void mon_heartbeat_ckpt_warned(mon_heartbeat *hb, int warned, int step, const char *msg) {
    if (!hb || warned <= 0) return;
    pthread_mutex_lock(&hb->mu);
    if (warned != hb->ckpt_warned) {
        hb->ckpt_warned = warned;
        hb->ckpt_warn_step = step > 0 ? step : 0;
        snprintf(hb->ckpt_warning, sizeof hb->ckpt_warning, "%s", msg ? msg : "");
        for (char *c = hb->ckpt_warning; *c; c++) /* one line, printable */
            if ((unsigned char)*c < 0x20) *c = ' ';
        hb->dirty = 1;
        pthread_cond_signal(&hb->cv);
    }
    pthread_mutex_unlock(&hb->mu);
}

void mon_heartbeat_stopped(mon_heartbeat *hb, int here) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    hb->stop_here = here != 0;
    pthread_mutex_unlock(&hb->mu);
    update(hb, "stopped", NULL);
}

void mon_heartbeat_error(mon_heartbeat *hb, const char *msg, int usage) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    hb->usage = usage;
    pthread_mutex_unlock(&hb->mu);
    update(hb, "error", msg && *msg ? msg : "unknown error");
}

static ms_status hb_step(void *ctx, const mon_step *s) {
    mon_heartbeat *hb = ctx;
    pthread_mutex_lock(&hb->mu);
    hb->step = s->step;
    hb->step_ms = s->sec * 1e3;
    hb->compute_ms = s->compute_ms;
    /* a redo that came out finite, or a skipped update (its redos not finite either): the
     * driver reported a skipped step as "redone in place" and "recovered" */
    hb->redone += s->redone > 0 && !s->skipped;
    if (s->skipped) hb->skipped++, hb->skip_step = s->step;
    if (s->n_nan_ranks > 0) { /* kept until the next one: a beat may cover several steps */
        hb->nan_step = s->step;
        hb->n_nan_ranks = s->n_nan_ranks;
        memcpy(hb->nan_ranks, s->nan_ranks, sizeof hb->nan_ranks);
    }
    hb->loss = s->loss;
    hb->grad_norm = s->grad_norm;
    snprintf(hb->phase, sizeof hb->phase, "train");
    hb->dirty = 1;
    pthread_cond_signal(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
    return MS_OK;
}

void mon_heartbeat_flush(mon_heartbeat *hb, double timeout_s) {
    if (!hb) return;
    struct timespec ts = ms_deadline(CLOCK_MONOTONIC, timeout_s);
    pthread_mutex_lock(&hb->mu);
    unsigned long long want = hb->taken + 1; /* a beat begun from now on carries the state */
    hb->dirty = 1;
    hb->urgent = 1;
    pthread_cond_signal(&hb->cv);
    while (!hb->stop && hb->sent < want)
        if (pthread_cond_timedwait(&hb->sent_cv, &hb->mu, &ts) != 0) break;
    pthread_mutex_unlock(&hb->mu);
}

mon_sink mon_sink_heartbeat(mon_heartbeat *hb) {
    return (mon_sink){.ctx = hb, .on_step = hb_step};
}

void mon_heartbeat_close(mon_heartbeat *hb) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    hb->stop = 1;
    pthread_cond_signal(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
    pthread_join(hb->thread, NULL);
    if (hb->fd >= 0) close(hb->fd);
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->cv);
    pthread_cond_destroy(&hb->sent_cv);
    free(hb);
}
