/* sup_driver.c - the driver's loop (see sup.h): heartbeat server,
 * detection, stop, restart policy, summary.
 *
 * Detection, each checked every 0.2 s:
 *  - a rank's heartbeat connection closes before it said "done" or "error"
 *    (the process died: kill -9, a crash, OOM): at once;
 *  - a rank's beat carries phase "error" (it failed, and says why: a peer
 *    lost, storage, non-finite loss, ...): at once;
 *  - mpirun exits with a non-zero status: at once;
 *  - no beat from a rank for --heartbeat-timeout (the process is stopped
 *    or its beat thread cannot run);
 *  - beats without a new step for max(--heartbeat-timeout,
 *    --progress-factor x the longest step seen) (hung in compute or in a
 *    collective), or no first step within --startup-timeout.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/fault.h"
#include "base/fileio.h"
#include "base/timeutil.h"
#include "monitor/heartbeat.h"
#include "supervisor/sup_internal.h"

#define SUP_TICK_MS 200
#define SUP_MAX_CONNS 4096

typedef struct {
    int fd, rank; /* rank -1 until its first valid beat */
    unsigned long long seq;
    size_t len;
    char buf[MON_HB_LINE_MAX + 1];
} conn;

typedef struct {
    int connected, pid, step, first_step, done, failed;
    int started;     /* in the training loop (phase train, or a step done) */
    int resume_step; /* the step it started the loop at (-1: not yet) */
    double last_beat, last_progress;
    char host[128], phase[16], error[1024];
} rank_state;

typedef struct {
    const sup_config *c;
    sup_events ev;
    char token[33], addr[64];
    int lfd;
    conn *conns;
    int n_conns;
    rank_state *r;
    sup_job job;
    double t_launch;
    /* the fault of this attempt */
    int fault;
    char kind[24], detail[1100];
    int fault_rank, fault_step;
    double t_detect, t_stall; /* when it was detected; when the rank went silent/stuck */
    /* across attempts */
    int best_step, start_step, restarts, no_progress, pending_recovery, redone_booked;
    double t_recovery_from;
    int step_at_fault;
    ms_fault_plan plan;   /* --faults: the faults to hand out */
    int faults_through;   /* the faults at steps <= this have fired */
    char fault_arg[8192]; /* this attempt's --inject-fault */
    double step_ms_sum;
    long step_ms_n;
    double max_interval; /* the longest step seen, over ranks and attempts (s) */
} driver;

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    g_stop = sig;
}

static int node_of(const driver *d, int rank) {
    return d->c->nodes > 1 ? (int)((long long)rank * d->c->nodes / d->c->np) : 0;
}

static int make_token(char *out) {
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return -1;
    for (int i = 0; i < 16; i++)
        sprintf(out + 2 * i, "%02x", raw[i]);
    return 0;
}

static int listen_on(driver *d, char *why, size_t n) {
    const char *bind_addr = d->c->bind ? d->c->bind : "127.0.0.1";
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1) {
        snprintf(why, n, "--bind %s: not an IPv4 address", bind_addr);
        return -1;
    }
    d->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t len = sizeof sa;
    if (d->lfd < 0 || bind(d->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(d->lfd, 128) != 0 || getsockname(d->lfd, (struct sockaddr *)&sa, &len) != 0) {
        snprintf(why, n, "heartbeat socket on %s: %s", bind_addr, strerror(errno));
        return -1;
    }
    snprintf(d->addr, sizeof d->addr, "%s:%d", bind_addr, ntohs(sa.sin_port));
    return 0;
}

static cJSON *fault_fields(driver *d) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "kind", d->kind);
    cJSON_AddNumberToObject(f, "rank", d->fault_rank);
    cJSON_AddNumberToObject(f, "node", d->fault_rank >= 0 ? node_of(d, d->fault_rank) : -1);
    if (d->fault_rank >= 0) cJSON_AddStringToObject(f, "host", d->r[d->fault_rank].host);
    cJSON_AddNumberToObject(f, "step", d->fault_step);
    cJSON_AddStringToObject(f, "detail", d->detail);
    return f;
}

/* The first fault of an attempt wins (later ones are its consequences). */
static void set_fault(driver *d, const char *kind, int rank, double t_stall, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void set_fault(driver *d, const char *kind, int rank, double t_stall, const char *fmt, ...) {
    if (d->fault) return;
    d->fault = 1;
    snprintf(d->kind, sizeof d->kind, "%s", kind);
    d->fault_rank = rank;
    d->fault_step = rank >= 0 && d->r[rank].step > 0 ? d->r[rank].step : d->best_step;
    d->t_detect = ms_now();
    d->t_stall = t_stall > 0 ? t_stall : d->t_detect;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->detail, sizeof d->detail, fmt, ap);
    va_end(ap);
    cJSON *f = fault_fields(d);
    cJSON_AddNumberToObject(f, "detect_s", d->t_detect - d->t_stall);
    sup_events_put(&d->ev, "fault_detected", f);
    fprintf(stderr, "megascale launch: fault: %s, rank %d (node %d), step %d: %s\n", kind, rank,
            rank >= 0 ? node_of(d, rank) : -1, d->fault_step, d->detail);
}

/* What an error line says about the fault's class. */
static const char *classify(const char *err) {
    if (strstr(err, "timed out") || strstr(err, "cannot complete") || strstr(err, "world broken"))
        return "comm";
    if (strstr(err, "No space") || strstr(err, "Input/output") || strstr(err, "fsync"))
        return "storage";
    if (strstr(err, "non-finite")) return "nonfinite";
    if (strstr(err, "CUDA") || strstr(err, "cuda")) return "device";
    return "error";
}

static void on_beat(driver *d, conn *k, const sup_beat *b) {
    rank_state *s = &d->r[b->rank];
    double now = ms_now();
    if (k->rank < 0) {
        k->rank = b->rank;
        s->connected = 1;
        s->first_step = -1;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "rank", b->rank);
        cJSON_AddNumberToObject(f, "node", node_of(d, b->rank));
        cJSON_AddStringToObject(f, "host", b->host);
        cJSON_AddNumberToObject(f, "pid", b->pid);
        sup_events_put(&d->ev, "rank_up", f);
    }
    s->pid = b->pid;
    s->last_beat = now;
    snprintf(s->host, sizeof s->host, "%s", b->host);
    snprintf(s->phase, sizeof s->phase, "%s", b->phase);
    if (!s->started && (!strcmp(b->phase, "train") || b->step > 0)) {
        s->started = 1; /* the progress clock starts here: the first step is timed too */
        s->last_progress = now;
        s->resume_step = b->step; /* beats carry the steps done: a resumed run's start */
        s->step = b->step;
    }
    if (b->step > s->step) {
        if (s->first_step >= 0 && now - s->last_progress > d->max_interval)
            d->max_interval = now - s->last_progress;
        if (s->first_step < 0) s->first_step = b->step;
        s->last_progress = now;
        s->step = b->step;
        if (b->rank == 0 && isfinite(b->step_ms) && b->step > d->best_step)
            d->step_ms_sum += b->step_ms, d->step_ms_n++;
    }
    if (b->step > d->best_step) d->best_step = b->step;
    if (!strcmp(b->phase, "done")) s->done = 1;
    if (!strcmp(b->phase, "error") && !s->failed) {
        s->failed = 1;
        snprintf(s->error, sizeof s->error, "%s", b->error);
        set_fault(d, classify(b->error), b->rank, 0, "%s", b->error);
    }
}

/* Read what k has; 0 to keep it, -1 to drop it. */
static int read_conn(driver *d, conn *k) {
    for (;;) {
        ssize_t got = recv(k->fd, k->buf + k->len, sizeof k->buf - 1 - k->len, MSG_DONTWAIT);
        if (got == 0) return -1;
        if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        k->len += (size_t)got;
        char *nl;
        while ((nl = memchr(k->buf, '\n', k->len)) != NULL) {
            size_t n = (size_t)(nl - k->buf);
            sup_beat b;
            const char *why = "";
            if (sup_beat_parse(k->buf, n, d->token, d->c->np, &b, &why) != 0 || b.seq <= k->seq ||
                (k->rank >= 0 && b.rank != k->rank) || (k->rank < 0 && d->r[b.rank].connected)) {
                cJSON *f = cJSON_CreateObject();
                cJSON_AddStringToObject(f, "why", b.seq && b.seq <= k->seq ? "out of order" : why);
                sup_events_put(&d->ev, "beat_rejected", f);
                return -1;
            }
            k->seq = b.seq;
            on_beat(d, k, &b);
            memmove(k->buf, nl + 1, k->len - n - 1);
            k->len -= n + 1;
        }
        if (k->len >= sizeof k->buf - 1) { /* a line longer than allowed */
            cJSON *f = cJSON_CreateObject();
            cJSON_AddStringToObject(f, "why", "line too long");
            sup_events_put(&d->ev, "beat_rejected", f);
            return -1;
        }
    }
}

static void drop_conn(driver *d, int i) {
    conn *k = &d->conns[i];
    if (k->rank >= 0) {
        rank_state *s = &d->r[k->rank];
        s->connected = 0;
        if (!s->done && !s->failed && !d->fault && d->job.pid && !sup_job_poll(&d->job))
            set_fault(d, "crash", k->rank, 0,
                      "rank %d (pid %d) is gone: its heartbeat "
                      "connection closed before it finished",
                      k->rank, s->pid);
    }
    close(k->fd);
    d->conns[i] = d->conns[--d->n_conns];
}

/* Accept, read every connection, handle EOFs. */
static void serve(driver *d) {
    struct pollfd *p = calloc((size_t)d->n_conns + 1, sizeof *p);
    if (!p) return;
    p[0] = (struct pollfd){d->lfd, POLLIN, 0};
    for (int i = 0; i < d->n_conns; i++)
        p[i + 1] = (struct pollfd){d->conns[i].fd, POLLIN, 0};
    int n = d->n_conns;
    if (poll(p, (nfds_t)n + 1, SUP_TICK_MS) > 0) {
        for (int i = n - 1; i >= 0; i--)
            if (p[i + 1].revents && read_conn(d, &d->conns[i]) != 0) drop_conn(d, i);
        if (p[0].revents & POLLIN)
            for (;;) {
                int fd = accept4(d->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) break;
                if (d->n_conns >= SUP_MAX_CONNS || d->n_conns >= 4 * d->c->np + 16) {
                    close(fd);
                    continue;
                }
                conn *k = &d->conns[d->n_conns++];
                k->fd = fd, k->rank = -1, k->seq = 0, k->len = 0;
            }
    }
    free(p);
}

/* The rank whose last beat is oldest, if it has missed about two beats (a
 * live rank beats every second: silence past min(3 s, 0.6 x the heartbeat
 * timeout)), else -1. */
static int silent_rank(const driver *d, double now) {
    int best = -1;
    double quiet = fmin(3.0, 0.6 * d->c->hb_timeout);
    for (int i = 0; i < d->c->np; i++) {
        const rank_state *s = &d->r[i];
        if (s->done || s->failed || !s->connected) continue;
        if (now - s->last_beat > quiet && (best < 0 || s->last_beat < d->r[best].last_beat))
            best = i;
    }
    return best;
}

/* The hang and start-up detectors. */
static void watch(driver *d) {
    const sup_config *c = d->c;
    double now = ms_now();
    for (int i = 0; i < c->np && !d->fault; i++) {
        rank_state *s = &d->r[i];
        if (s->done || s->failed) continue;
        if (!s->connected || !s->started) {
            if (now - d->t_launch > c->startup_timeout)
                set_fault(d, "startup", i, d->t_launch,
                          "rank %d did not %s within %.0f s "
                          "(--startup-timeout)",
                          i, s->connected ? "start training" : "send a heartbeat",
                          c->startup_timeout);
            continue;
        }
        if (now - s->last_beat > c->hb_timeout)
            set_fault(d, "hang", i, s->last_beat,
                      "no heartbeat from rank %d (pid %d) for %.1f s "
                      "(--heartbeat-timeout %.0f s): stopped or stuck",
                      i, s->pid, now - s->last_beat, c->hb_timeout);
    }
    for (int i = 0; i < c->np && !d->fault; i++) {
        rank_state *s = &d->r[i];
        if (s->done || s->failed || !s->connected || !s->started) continue;
        double limit = fmax(c->hb_timeout, c->progress_factor * d->max_interval);
        if (d->max_interval <= 0) limit = fmax(limit, c->startup_timeout); /* no step seen yet */
        if (!strcmp(s->phase, "val") || !strcmp(s->phase, "ckpt")) limit *= 10; /* no steps */
        if (now - s->last_progress <= limit) continue;
        /* every rank of a hung job stops making steps; the culprit is the one
         * that also went silent, if any (the others are waiting for it) */
        int silent = silent_rank(d, now);
        if (silent >= 0)
            set_fault(d, "hang", silent, d->r[silent].last_beat,
                      "no step for %.1f s, and rank "
                      "%d (pid %d) has sent no heartbeat for %.1f s: stopped or stuck",
                      now - s->last_progress, silent, d->r[silent].pid,
                      now - d->r[silent].last_beat);
        else
            set_fault(d, "hang", i, s->last_progress,
                      "rank %d beats but made no step for %.1f s "
                      "(limit %.1f s: %.1f x the longest step seen, at least the heartbeat "
                      "timeout)",
                      i, now - s->last_progress, limit, c->progress_factor);
    }
}

/* mpirun's argv for the job (NULL-terminated, malloc'd; strings borrowed). */
static char **job_argv(driver *d, char *np) {
    const sup_config *c = d->c;
    int n = 0, cap = 32 + c->train_argc;
    char **a = calloc((size_t)cap, sizeof *a);
    if (!a) return NULL;
    a[n++] = (char *)(c->mpirun ? c->mpirun : "mpirun");
    if (getuid() == 0) a[n++] = "--allow-run-as-root";
    if (!c->hostfile) a[n++] = "--oversubscribe";
    a[n++] = "-np";
    a[n++] = np;
    a[n++] = "-x";
    a[n++] = "MS_HEARTBEAT";
    a[n++] = "-x";
    a[n++] = "MS_HEARTBEAT_TOKEN";
    if (c->hostfile) a[n++] = "--hostfile", a[n++] = (char *)c->hostfile;
    a[n++] = (char *)c->bin;
    a[n++] = "train";
    int has_resume = 0;
    for (int i = 0; i < c->train_argc; i++) {
        has_resume |=
            !strcmp(c->train_argv[i], "--resume") || !strncmp(c->train_argv[i], "--resume=", 9);
        a[n++] = c->train_argv[i];
    }
    if (!has_resume) a[n++] = "--resume", a[n++] = "auto"; /* every start continues */
    if (d->plan.n) {
        ms_fault_format(&d->plan, d->faults_through, d->fault_arg, sizeof d->fault_arg);
        if (d->fault_arg[0]) a[n++] = "--inject-fault", a[n++] = d->fault_arg;
    }
    return a;
}

static void reset_ranks(driver *d) {
    memset(d->r, 0, sizeof *d->r * (size_t)d->c->np);
    for (int i = 0; i < d->c->np; i++)
        d->r[i].first_step = -1;
    while (d->n_conns) {
        close(d->conns[d->n_conns - 1].fd);
        d->n_conns--;
    }
    d->fault = 0;
    d->kind[0] = d->detail[0] = 0;
    d->fault_rank = -1;
    d->redone_booked = 0;
}

/* One attempt: launch, watch until it finishes or a fault; 1 if done. */
static int attempt(driver *d, int k, char *why, size_t n) {
    char np[16];
    snprintf(np, sizeof np, "%d", d->c->np);
    char **argv = job_argv(d, np);
    if (!argv) return snprintf(why, n, "out of memory"), -1;
    reset_ranks(d);
    d->t_launch = ms_now();
    int rc = sup_job_start(&d->job, argv, d->addr, d->token, why, n);
    free(argv);
    if (rc != 0) return -1;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "attempt", k);
    cJSON_AddNumberToObject(f, "pid", d->job.pid);
    sup_events_put(&d->ev, "launch", f);
    for (;;) {
        serve(d);
        if (d->pending_recovery && d->best_step > d->step_at_fault) { /* caught up */
            double rec = ms_now() - d->t_recovery_from;
            if (d->ev.n_faults <= SUP_MAX_FAULTS) d->ev.recover_s[d->ev.n_faults - 1] = rec;
            cJSON *g = cJSON_CreateObject();
            cJSON_AddNumberToObject(g, "step", d->best_step);
            cJSON_AddNumberToObject(g, "recover_s", rec);
            sup_events_put(&d->ev, "recovered", g);
            d->pending_recovery = 0;
        }
        if (!d->redone_booked && d->r[0].started) { /* where this attempt resumed */
            if (d->restarts > 0 && d->step_at_fault > d->r[0].resume_step)
                d->ev.redone += d->step_at_fault - d->r[0].resume_step;
            if (d->restarts == 0) d->start_step = d->r[0].resume_step;
            d->redone_booked = 1;
        }
        if (g_stop) return 2;
        if (sup_job_poll(&d->job)) {
            serve(d); /* the last beats */
            char st[64];
            sup_job_describe(&d->job, st, sizeof st);
            if (WIFEXITED(d->job.status) && WEXITSTATUS(d->job.status) == 0 && !d->fault) return 1;
            set_fault(d, "exit", -1, 0, "mpirun ended with %s", st);
            return 0;
        }
        watch(d);
        if (d->fault) return 0;
    }
}

/* Stop the attempt and book the fault for the summary. */
static void stop_attempt(driver *d) {
    int *pids = calloc((size_t)d->c->np, sizeof *pids);
    for (int i = 0; pids && i < d->c->np; i++)
        pids[i] = d->r[i].pid;
    double took = sup_job_stop(&d->job, d->c->grace, pids, pids ? d->c->np : 0);
    free(pids);
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "stop_s", took);
    sup_events_put(&d->ev, "job_stopped", f);
}

static void book_fault(driver *d) {
    sup_events *e = &d->ev;
    if (e->n_faults < SUP_MAX_FAULTS) {
        snprintf(e->kinds[e->n_faults], sizeof e->kinds[0], "%s", d->kind);
        e->detect_s[e->n_faults] = d->t_detect - d->t_stall;
        e->recover_s[e->n_faults] = NAN;
        e->n_faults++;
    }
    d->step_at_fault = d->best_step;
    d->faults_through = d->best_step + 1; /* an injected fault fires at the start of its step */
    d->t_recovery_from = d->t_detect;
    d->pending_recovery = 1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and worst of the finite values of v[0..n). */
static void stats(const double *v, int n, double *med, double *worst) {
    double *t = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    int m = 0;
    for (int i = 0; t && i < n; i++)
        if (isfinite(v[i])) t[m++] = v[i];
    if (t && m) qsort(t, (size_t)m, sizeof *t, cmp_double);
    *med = t && m ? t[m / 2] : NAN;
    *worst = t && m ? t[m - 1] : NAN;
    free(t);
}

/* The bottom line: faults by kind, detection and recovery times, steps
 * redone, effective training time ratio; printed and in the events. */
static void summary(driver *d, const char *outcome) {
    sup_events *e = &d->ev;
    int n = e->n_faults < SUP_MAX_FAULTS ? e->n_faults : SUP_MAX_FAULTS;
    double wall = ms_wall_now() - e->t0, dmed, dmax, rmed, rmax;
    double step_s = d->step_ms_n ? d->step_ms_sum / (double)d->step_ms_n / 1e3 : 0;
    double ettr = wall > 0 ? (double)(d->best_step - d->start_step) * step_s / wall : 0;
    stats(e->detect_s, n, &dmed, &dmax);
    stats(e->recover_s, n, &rmed, &rmax);
    cJSON *f = cJSON_CreateObject(), *kinds = cJSON_AddObjectToObject(f, "faults");
    for (int i = 0; i < n; i++) {
        cJSON *k = cJSON_GetObjectItemCaseSensitive(kinds, e->kinds[i]);
        if (k)
            cJSON_SetNumberValue(k, k->valuedouble + 1);
        else
            cJSON_AddNumberToObject(kinds, e->kinds[i], 1);
    }
    char *ktext = cJSON_PrintUnformatted(kinds);
    cJSON_AddStringToObject(f, "outcome", outcome);
    cJSON_AddNumberToObject(f, "restarts", d->restarts);
    cJSON_AddNumberToObject(f, "steps", d->best_step);
    cJSON_AddNumberToObject(f, "steps_redone", e->redone);
    cJSON_AddNumberToObject(f, "wall_s", wall);
    cJSON_AddNumberToObject(f, "ettr", ettr);
    if (n) {
        cJSON_AddNumberToObject(f, "detect_p50_s", isfinite(dmed) ? dmed : -1);
        cJSON_AddNumberToObject(f, "detect_max_s", isfinite(dmax) ? dmax : -1);
        cJSON_AddNumberToObject(f, "recover_p50_s", isfinite(rmed) ? rmed : -1);
        cJSON_AddNumberToObject(f, "recover_max_s", isfinite(rmax) ? rmax : -1);
    }
    sup_events_put(e, "summary", f);
    fprintf(stderr,
            "megascale launch: %s after %.1f s: %d step(s), %d fault(s) %s, %d restart(s), %d "
            "step(s) redone; detection p50 %.2f s / worst %.2f s, recovery p50 %.1f s / worst "
            "%.1f s; effective training time %.1f%%\n",
            outcome, wall, d->best_step, n, ktext ? ktext : "{}", d->restarts, e->redone,
            n ? dmed : 0, n ? dmax : 0, n ? rmed : 0, n ? rmax : 0, 100 * ettr);
    cJSON_free(ktext);
}

static int has_opt(const sup_config *c, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < c->train_argc; i++)
        if (!strncmp(c->train_argv[i], name, n) &&
            (c->train_argv[i][n] == 0 || c->train_argv[i][n] == '='))
            return 1;
    return 0;
}

/* The restart policy after a fault: 0 to go on, else the exit code. */
static int policy(driver *d, int prev_best) {
    d->no_progress = d->best_step > prev_best ? 0 : d->no_progress + 1;
    if (d->no_progress >= d->c->no_progress_limit) {
        fprintf(stderr,
                "megascale launch: giving up: %d restart(s) in a row made no progress "
                "past step %d (do not requeue this job: the same fault comes back)\n",
                d->no_progress, d->best_step);
        return SUP_EXIT_NO_PROGRESS;
    }
    if (d->restarts >= d->c->max_restarts) {
        fprintf(stderr,
                "megascale launch: giving up: the restart budget (--max-restarts %d) is "
                "spent\n",
                d->c->max_restarts);
        return SUP_EXIT_GAVE_UP;
    }
    double wait = d->c->backoff * (double)(1 << (d->restarts < 5 ? d->restarts : 5));
    if (wait > 30) wait = 30;
    usleep((useconds_t)(wait * 1e6));
    d->restarts++;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "restart", d->restarts);
    cJSON_AddNumberToObject(f, "after_s", wait);
    sup_events_put(&d->ev, "restart", f);
    return 0;
}

static int run_loop(driver *d) {
    char why[512] = "";
    for (int k = 1;; k++) {
        int prev_best = d->best_step;
        int r = attempt(d, k, why, sizeof why);
        if (r < 0) {
            fprintf(stderr, "megascale launch: error: %s\n", why);
            return SUP_EXIT_ERROR;
        }
        if (r == 1) {
            summary(d, "done");
            sup_events_put(&d->ev, "job_done", NULL);
            return SUP_EXIT_DONE;
        }
        if (r == 2) { /* asked to stop: the ranks checkpoint on SIGTERM */
            stop_attempt(d);
            summary(d, "stopped");
            return SUP_EXIT_STOPPED;
        }
        book_fault(d);
        stop_attempt(d);
        int code = policy(d, prev_best);
        if (code) {
            summary(d, code == SUP_EXIT_NO_PROGRESS ? "no progress" : "gave up");
            cJSON *f = cJSON_CreateObject();
            cJSON_AddNumberToObject(f, "exit", code);
            sup_events_put(&d->ev, "job_failed", f);
            return code;
        }
    }
}

int sup_run(const sup_config *c) {
    if (c->np < 1 || !c->run_dir || !*c->run_dir) {
        fprintf(stderr, "megascale launch: error: --np and --run-dir are required\n");
        return SUP_EXIT_USAGE;
    }
    if (c->faults && *c->faults && has_opt(c, "--inject-fault")) {
        fprintf(stderr, "megascale launch: error: --faults and the train option --inject-fault "
                        "exclude each other (the driver hands out --faults)\n");
        return SUP_EXIT_USAGE;
    }
    if (!has_opt(c, "--ckpt-dir")) {
        fprintf(stderr, "megascale launch: error: the train options need --ckpt-dir: the driver "
                        "restarts the job from its checkpoints\n");
        return SUP_EXIT_USAGE;
    }
    driver *d = calloc(1, sizeof *d); /* large (the fault plan): not on the stack */
    if (!d) {
        fprintf(stderr, "megascale launch: error: out of memory\n");
        return SUP_EXIT_ERROR;
    }
    d->c = c;
    d->lfd = -1;
    char why[4400] = "", events[4200];
    int code = SUP_EXIT_USAGE;
    if (ms_fault_parse(&d->plan, c->faults, "--faults") != MS_OK) {
        fprintf(stderr, "megascale launch: error: %s\n", ms_errmsg());
        goto out;
    }
    code = SUP_EXIT_ERROR;
    if (ms_mkdirs(c->run_dir) != MS_OK) {
        fprintf(stderr, "megascale launch: error: %s\n", ms_errmsg());
        goto out;
    }
    snprintf(events, sizeof events, "%s/events.jsonl", c->run_dir);
    d->r = calloc((size_t)c->np, sizeof *d->r);
    d->conns = calloc((size_t)4 * c->np + 16, sizeof *d->conns);
    if (!d->r || !d->conns || make_token(d->token) != 0) {
        fprintf(stderr, "megascale launch: error: out of memory or no random token\n");
        goto out;
    }
    if (sup_events_open(&d->ev, c->events ? c->events : events, why, sizeof why) != 0 ||
        listen_on(d, why, sizeof why) != 0) {
        fprintf(stderr, "megascale launch: error: %s\n", why);
        goto out;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* ranks that lose mpirun become ours to reap */
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "np", c->np);
    cJSON_AddNumberToObject(f, "nodes", c->nodes > 1 ? c->nodes : 1);
    cJSON_AddStringToObject(f, "heartbeat", d->addr);
    cJSON_AddNumberToObject(f, "pid", getpid());
    if (d->plan.n) cJSON_AddNumberToObject(f, "faults_planned", d->plan.n);
    sup_events_put(&d->ev, "job_start", f);
    fprintf(stderr, "megascale launch: %d rank(s), heartbeats on %s, events in %s\n", c->np,
            d->addr, d->ev.path);
    code = run_loop(d);
out:
    if (d->lfd >= 0) close(d->lfd);
    for (int i = 0; i < d->n_conns; i++)
        close(d->conns[i].fd);
    sup_events_close(&d->ev);
    free(d->conns);
    free(d->r);
    free(d);
    return code;
}
