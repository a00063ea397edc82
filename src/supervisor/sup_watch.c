/* sup_watch.c - what the driver sees: the heartbeat and control sockets,
 * and the detectors (see sup_driver.c for the list and their latency). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

#define CTL_READ_S 2.0 /* a control connection must say its line within this */

int sup_listen(const char *bind_addr, int port, int *fd, char *addr, size_t an, char *why,
               size_t n) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1) {
        snprintf(why, n, "'%s' is not a numeric IPv4 address", bind_addr);
        return -1;
    }
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (*fd >= 0) setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof sa;
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(*fd, 128) != 0 ||
        getsockname(*fd, (struct sockaddr *)&sa, &len) != 0) {
        snprintf(why, n, "socket on %s:%d: %s", bind_addr, port, strerror(errno));
        if (*fd >= 0) close(*fd);
        *fd = -1;
        return -1;
    }
    snprintf(addr, an, "%s:%d", bind_addr, ntohs(sa.sin_port));
    return 0;
}

const char *sup_node_name(const sup_driver *d, int rank) {
    return rank >= 0 && rank < d->c->np ? sup_nodes_rank_name(d->pool, rank) : "";
}

static cJSON *fault_fields(sup_driver *d) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "kind", d->kind);
    cJSON_AddNumberToObject(f, "rank", d->fault_rank);
    cJSON_AddStringToObject(f, "node",
                            d->fault_rank < 0 && d->evict_node >= 0
                                ? d->pool->name[d->evict_node]
                                : sup_node_name(d, d->fault_rank));
    if (d->fault_rank >= 0) cJSON_AddStringToObject(f, "host", d->r[d->fault_rank].host);
    if (d->fault_reporter >= 0) cJSON_AddNumberToObject(f, "reported_by", d->fault_reporter);
    cJSON_AddNumberToObject(f, "step", d->fault_step);
    cJSON_AddStringToObject(f, "detail", d->detail);
    return f;
}

/* The first fault of an attempt wins (later ones are its consequences). */
void sup_set_fault(sup_driver *d, const char *kind, int rank, double t_stall, const char *fmt,
                   ...) {
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
    d->fault_best = d->best_step;
    cJSON *f = fault_fields(d);
    /* the attempt stops (see sup_recover); then a restart, unless the
     * policy has already given up on the job (it exits after the diag) */
    int np;
    d->fault_final = sup_policy_verdict(d, d->recover_prev_best, &np) != 0 ||
                     (sup_refused_options(d) && !d->options_ok); /* after_fault's usage exit (2) */
    cJSON_AddStringToObject(f, "action", d->fault_final ? "stop" : "restart");
    cJSON_AddNumberToObject(f, "detect_s", d->t_detect - d->t_stall);
    sup_events_put(&d->ev, "fault_detected", f);
    /* no rank (mpirun's end, an eviction by the control socket): none said (before, "rank -1") */
    char who[32] = "";
    if (rank >= 0) snprintf(who, sizeof who, ", rank %d", rank);
    const char *node = rank >= 0            ? sup_node_name(d, rank)
                       : d->evict_node >= 0 ? d->pool->name[d->evict_node] /* as fault_fields */
                                            : NULL;
    fprintf(stderr, "megascale launch: fault: %s%s%s%s%s, step %d: %s\n", kind, who,
            node ? " (node " : "", node ? node : "", node ? ")" : "", d->fault_step, d->detail);
}

/* What an error line says about the fault's class. */
static const char *classify(const char *err) {
    if (strstr(err, "No space")) return "storage";
    if (strstr(err, "not committed")) return "ckpt_commit";
    if (strstr(err, "Input/output") || strstr(err, "fsync")) return "storage";
    if (strstr(err, "timed out") || strstr(err, "cannot complete") || strstr(err, "world broken"))
        return "comm";
    if (strstr(err, "non-finite")) return "nonfinite";
    if (strstr(err, "CUDA") || strstr(err, "cuda")) return "device";
    return "error";
}

/* R if text p starts "rank R" and then `then`, else -1. */
static int rank_then(const char *p, const char *then) {
    int r = -1, len = 0;
    if (strncmp(p, "rank ", 5) || !isdigit((unsigned char)p[5]) ||
        sscanf(p, "rank %d%n", &r, &len) != 1 || r < 0)
        return -1;
    return !strncmp(p + len, then, strlen(then)) ? r : -1;
}

/* The rank an error line says failed ("resume: rank 0 could not choose a checkpoint ...:
 * WHY", a step the ranks share, which that rank failed: the checkpoint manager's), or -1. */
static int peer_failed(const char *err) {
    for (const char *p = err; (p = strstr(p, "rank ")); p += 5) {
        int r = p == err || p[-1] == ' ' ? rank_then(p, " could not ") : -1;
        if (r >= 0) return r;
    }
    return -1;
}

/* The nonfinite fault_detected event of `step` (action redo or skip), naming the ranks whose
 * own gradients it was in when the beat knows them (known), else the beat's rank. */
static void put_nonfinite(sup_driver *d, const sup_beat *b, const char *action, int step, int known,
                          const char *detail) {
    int rank = known ? b->nan_ranks[0] : b->rank;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "kind", "nonfinite");
    cJSON_AddStringToObject(f, "action", action);
    cJSON_AddNumberToObject(f, "rank", rank);
    cJSON_AddStringToObject(f, "node", sup_node_name(d, rank));
    cJSON_AddNumberToObject(f, "step", step);
    if (known)
        cJSON_AddItemToObject(f, "ranks", cJSON_CreateIntArray(b->nan_ranks, b->n_nan_ranks));
    cJSON_AddNumberToObject(f, "reported_by", b->rank);
    cJSON_AddStringToObject(f, "detail", detail);
    cJSON_AddNumberToObject(f, "detect_s", 0);
    sup_events_put(&d->ev, "fault_detected", f);
}

/* A step redone after a non-finite loss or gradient (every rank redoes it:
 * the check is on the global norm): one event per step. */
static void on_redone(sup_driver *d, const sup_beat *b) {
    if (b->step == d->nan_step) return; /* steps count from 1: 0 is none */
    /* the ranks where the gradient was not finite, when the beat names them
     * for a step after the last event's (a non-finite loss names none) */
    int known = b->n_nan_ranks > 0 && b->nan_step > d->nan_step && b->nan_step <= b->step;
    d->nan_step = b->step;
    char detail[512], list[96] = "";
    size_t len = 0;
    for (int i = 0; known && i < b->n_nan_ranks && len < sizeof list; i++)
        len +=
            (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? ", " : "", b->nan_ranks[i]);
    if (known)
        snprintf(detail, sizeof detail,
                 "a non-finite gradient, in the own gradients of %s %s: every rank redoes the "
                 "step from the same micro-batches",
                 b->n_nan_ranks > 1 ? "ranks" : "rank", list);
    else
        snprintf(detail, sizeof detail,
                 "a non-finite loss or gradient (global norm): every rank redoes the step from "
                 "the same micro-batches");
    put_nonfinite(d, b, "redo", known ? b->nan_step : b->step, known, detail);
    sup_events *e = &d->ev;
    if (e->n_faults < SUP_MAX_FAULTS) {
        snprintf(e->kinds[e->n_faults], sizeof e->kinds[0], "nonfinite");
        e->detect_s[e->n_faults] = 0;
        e->recover_s[e->n_faults] = isfinite(b->step_ms) ? b->step_ms / 1e3 : 0;
        e->n_faults++;
    }
    cJSON *g = cJSON_CreateObject();
    /* the step redone, as the fault's (a beat read late, by a driver that took the job over,
     * says a later one: before, the fault said step 6 and its recovery step 16) */
    cJSON_AddNumberToObject(g, "step", known ? b->nan_step : b->step);
    cJSON_AddNumberToObject(g, "recover_s", isfinite(b->step_ms) ? b->step_ms / 1e3 : 0);
    cJSON_AddBoolToObject(g, "in_place", 1);
    sup_events_put(&d->ev, "recovered", g);
    fprintf(stderr, "megascale launch: step %d: non-finite result redone in place%s%s%s\n",
            known ? b->nan_step : b->step,
            !known               ? ""
            : b->n_nan_ranks > 1 ? " (the gradients of ranks "
                                 : " (the gradients of rank ",
            known ? list : "", known ? ")" : "");
}

/* A step whose update the ranks skipped: its result was not finite, nor
 * were its redos (every rank skips it: the check is on the global norm).
 * Said as such, not recovered: the run goes on without that step's update
 * (it was reported as "redone in place" and "recovered"). */
static void on_skipped(sup_driver *d, const sup_beat *b) {
    if (b->skip_step == d->skip_step) return; /* one event a step, whichever rank says it */
    d->skip_step = b->skip_step;
    int known = b->n_nan_ranks > 0 && b->nan_step == b->skip_step;
    char detail[512];
    snprintf(detail, sizeof detail,
             "a non-finite loss or gradient at step %d, and in every redo of it: the ranks "
             "skipped the step's update (the weights are those of the step before)",
             b->skip_step);
    /* not one of the summary's faults: the run goes on without that update, or stops for
     * the streak (--max-bad-steps), and that stop is the fault, counted once */
    put_nonfinite(d, b, "skip", b->skip_step, known, detail);
    fprintf(stderr,
            "megascale launch: step %d: non-finite result, its redos too: the update was "
            "skipped\n",
            b->skip_step);
}

static int lost_peer(const sup_driver *d, int reporter, double *since);

/* The first global rank a comm error's arrival report says did not arrive ("not arrived:
 * rank i (global G, ..."), or -1. */
static int first_not_arrived(const char *err) {
    const char *p = strstr(err, "not arrived: rank ");
    int g = -1;
    if (p) p = strstr(p, "(global ");
    return p && sscanf(p, "(global %d", &g) == 1 && g >= 0 ? g : -1;
}

/* The rank whose own write failed: the rank a failed commit's error names
 * ("rank R failed to ...", what the other ranks report: agree() in
 * src/ckpt/ckpt_persist.c; "rank R: ...", rank R's own message as rank 0
 * passes it on); for a commit whose collective timed out, the peer it lost
 * (as for a rank's comm error: before, a host cut off during a checkpoint was
 * booked on the survivor that reported it); else the beat's own rank. */
static int ckpt_failed_rank(const sup_driver *d, const sup_beat *b) {
    int r = rank_then(b->ckpt_error, ":");
    if (r < 0) r = rank_then(b->ckpt_error, " failed to ");
    double since = 0;
    if (r < 0 && !strcmp(classify(b->ckpt_error), "comm")) r = lost_peer(d, b->rank, &since);
    /* else the rank its collective waited for (a writer slower than --comm-timeout: the
     * persist's collectives wait for it; before, the rank that reported it, then each
     * rank whose next commit was refused in the broken world) */
    if (r < 0 && !strcmp(classify(b->ckpt_error), "comm")) r = first_not_arrived(b->ckpt_error);
    return r >= 0 && r < d->c->np ? r : b->rank;
}

static void anomaly(sup_driver *d, const char *kind, cJSON *f) {
    cJSON_AddStringToObject(f, "kind", kind);
    sup_events_put(&d->ev, "anomaly", f);
    d->n_anomalies++;
}

void sup_feed_loss(sup_driver *d, int step, double loss) {
    double mean = 0, sd = 0, z;
    if (d->c->loss_spike_z <= 0 ||
        (z = sup_spike_feed(&d->spike, step, loss, d->c->loss_spike_z, &mean, &sd)) <= 0)
        return;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "rank", 0);
    cJSON_AddNumberToObject(f, "step", step);
    cJSON_AddNumberToObject(f, "loss", loss);
    cJSON_AddNumberToObject(f, "from", mean);
    cJSON_AddNumberToObject(f, "sd", sd);
    cJSON_AddNumberToObject(f, "z", z);
    anomaly(d, "loss_spike", f);
    fprintf(stderr,
            "megascale launch: step %d: loss spike: %.4g from %.4g, %.1f standard deviations "
            "above the last %d steps' changes\n",
            step, loss, mean, z, d->spike.n);
}

/* A checkpoint that committed with a warning (the directory's fsync after the rename, or
 * DIR/latest, failed): it loads and the job goes on, but the disk is suspect and a crash
 * could undo the commit; before, only the rank's log said it.  One anomaly for each beat
 * that raises the count (two commits between beats: one, with count 2 and the later step). */
static void on_ckpt_warned(sup_driver *d, const sup_beat *b) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "rank", b->rank);
    cJSON_AddStringToObject(f, "node", sup_node_name(d, b->rank));
    cJSON_AddNumberToObject(f, "step", b->ckpt_warn_step);
    cJSON_AddNumberToObject(f, "count", b->ckpt_warned);
    cJSON_AddStringToObject(f, "detail", b->ckpt_warning);
    anomaly(d, "ckpt_durability", f);
    fprintf(stderr,
            "megascale launch: step %d: the checkpoint committed with a warning (the disk of "
            "rank %d, node %s, is suspect%s): %s\n",
            b->ckpt_warn_step, b->rank, sup_node_name(d, b->rank),
            b->ckpt_warn_step < d->c->steps ? "; the job goes on" : "", b->ckpt_warning);
}

/* Checkpoints that fail to commit (the rank's persist reports it; the
 * older commits are intact): the job goes on and retries at its next
 * checkpoint, until --ckpt-fail-limit fail in a row; then it is stopped
 * and the storage diagnosed.  A commit after a failure is its recovery. */
static void on_ckpt(sup_driver *d, const sup_beat *b) {
    sup_events *e = &d->ev;
    int rank = ckpt_failed_rank(d, b);
    d->r[b->rank].ckpt_failed = b->ckpt_failed;
    int streak = 0; /* the ranks learn of a failed commit at different times: the most any says */
    for (int i = 0; i < d->c->np; i++)
        if (d->r[i].ckpt_failed > streak) streak = d->r[i].ckpt_failed;
    if (streak > d->ckpt_streak) {
        d->ckpt_streak = streak;
        int full = strstr(b->ckpt_error, "No space") != NULL;
        if (d->ckpt_streak >= d->c->ckpt_fail_limit) {
            sup_set_fault(d, "ckpt_commit", rank, 0,
                          "%d checkpoint(s) in a row failed to commit (--ckpt-fail-limit %d)%s: "
                          "%s",
                          d->ckpt_streak, d->c->ckpt_fail_limit, full ? ", the disk is full" : "",
                          b->ckpt_error);
            return;
        }
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "kind", "ckpt_commit");
        cJSON_AddNumberToObject(f, "rank", rank);
        cJSON_AddStringToObject(f, "node", sup_node_name(d, rank));
        cJSON_AddNumberToObject(f, "reported_by", b->rank);
        cJSON_AddNumberToObject(f, "step", b->step);
        cJSON_AddStringToObject(f, "detail", b->ckpt_error);
        cJSON_AddBoolToObject(f, "disk_full", full);
        cJSON_AddStringToObject(f, "action", "watch");
        cJSON_AddNumberToObject(f, "detect_s", 0);
        sup_events_put(e, "fault_detected", f);
        fprintf(stderr,
                "megascale launch: step %d: a checkpoint failed to commit (%d in a row; the job "
                "goes on and retries): %s\n",
                b->step, d->ckpt_streak, b->ckpt_error);
        if (d->ckpt_fault < 0 && e->n_faults < SUP_MAX_FAULTS) {
            d->ckpt_fault = e->n_faults++;
            snprintf(e->kinds[d->ckpt_fault], sizeof e->kinds[0], "ckpt_commit");
            e->detect_s[d->ckpt_fault] = 0;
            e->recover_s[d->ckpt_fault] = NAN;
            d->t_ckpt_fail = ms_now();
        }
    } else if (streak == 0 && d->ckpt_streak > 0 && b->ckpt_commit >= 0) {
        d->ckpt_streak = 0;
        double rec = ms_now() - d->t_ckpt_fail;
        if (d->ckpt_fault >= 0) e->recover_s[d->ckpt_fault] = rec;
        d->ckpt_fault = -1;
        cJSON *g = cJSON_CreateObject();
        cJSON_AddNumberToObject(g, "step", b->ckpt_commit);
        cJSON_AddNumberToObject(g, "recover_s", rec);
        cJSON_AddBoolToObject(g, "commit", 1);
        sup_events_put(e, "recovered", g);
    }
}

/* 1 while rank s's process runs (same host: its pid with its start time). */
static int rank_lives(const sup_rank *s) {
    return sup_pid_same(s->pid, s->pid_start) != 0;
}

static void crash(sup_driver *d, int rank, double t_stall) {
    if (d->fault) return; /* one fault an attempt: the first seen */
    /* another rank already gone, unseen (its connection lost before, or not back after a
     * takeover): it died first, and this one's end follows from it (its collective failed
     * and it exited).  A successor blamed the survivor whose connection closed first. */
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (i != rank && !s->done && !s->failed && !s->stopped && !s->connected &&
            (s->t_lost > 0 || s->adopted) && s->pid_start && !rank_lives(s)) {
            rank = i, t_stall = s->t_lost > 0 ? s->t_lost : t_stall;
            break;
        }
    }
    /* the others gone as well (killed at once, or by mpirun after it): said, the first 8
     * (before, only the rank blamed was named, and the others' ends were in no record).
     * Processes killed together end a few milliseconds apart (a large one's exit takes
     * longer): looked at for up to 20 ms, unless every other rank is gone before */
    char also[160] = "";
    int n_also = 0;
    for (int t = 0; t < 20; t++) {
        int gone = 0, others = 0;
        for (int i = 0; i < d->c->np; i++) {
            const sup_rank *s = &d->r[i];
            if (i == rank || s->done || s->failed || s->stopped || !s->pid_start) continue;
            others++;
            gone += !rank_lives(s);
        }
        if (gone == others) break;
        usleep(1000);
    }
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (i == rank || s->done || s->failed || s->stopped || !s->pid_start || rank_lives(s))
            continue;
        size_t o = strlen(also);
        if (n_also++ < 8)
            snprintf(also + o, sizeof also - o, "%s%d", n_also > 1 ? ", " : "", i);
        else if (n_also == 9)
            snprintf(also + o, sizeof also - o, ", ...");
    }
    sup_set_fault(d, "crash", rank, t_stall, "rank %d (pid %d) is gone: %s%s%s%s", rank,
                  d->r[rank].pid,
                  d->r[rank].adopted ? "its process ended before it reconnected to this driver "
                                       "(which took the job over from an earlier one)"
                                     : "its heartbeat connection closed before it finished",
                  n_also ? (n_also > 1 ? "; also gone: ranks " : "; also gone: rank ") : "", also,
                  n_also ? " (their processes ended too)" : "");
}

static int read_conn(sup_driver *d, sup_conn *k);
static int read_lines(sup_driver *d, sup_conn *k);

/* The beats every connection but `cur` holds unread, taken in now (a rank's last words
 * before it exited: its error, its end), with no fault decided on them (the beat being read
 * decides); a connection's end is left for the next pass, which drops it. */
static void read_ahead(sup_driver *d, sup_conn *cur) {
    if (d->reading_ahead) return;
    d->reading_ahead = 1;
    for (int i = 0; i < d->n_conns; i++)
        if (&d->conns[i] != cur) (void)read_conn(d, &d->conns[i]);
    d->reading_ahead = 0;
}

/* 1 if a rank other than `reporter` that reported an error has exited since (on this
 * host): mpirun ends the job's other ranks once one exits so, and their being gone says
 * nothing. */
static int exited_after_error(const sup_driver *d, int reporter) {
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (i != reporter && s->failed && s->pid_start && !rank_lives(s)) return 1;
    }
    return 0;
}

/* 1 if a comm error's arrival report says global rank g's process exited ("(global G,
 * process P exited", or "(global G): process P exited": src/comm/comm_board.c): it died
 * before the op failed, the crash. */
static int says_exited(const char *err, int g) {
    char key[32];
    snprintf(key, sizeof key, "(global %d, process ", g);
    const char *p = strstr(err, key), *close = p ? strchr(p, ')') : NULL;
    const char *ex = p ? strstr(p, " exited") : NULL;
    if (ex && close && ex < close) return 1;
    /* a point-to-point op's, or the batch ring's, "peer rank R (global G): process P exited" */
    snprintf(key, sizeof key, "(global %d): process ", g);
    p = strstr(err, key);
    const char *end = p ? strstr(p, "; ") : NULL;
    ex = p ? strstr(p, " exited") : NULL;
    return ex && (!end || ex < end);
}

/* A rank whose process (on this host: known by its start time) is gone
 * though it never said it ended (done, error, stopped), or -1. */
static int gone_rank(const sup_driver *d) {
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (!s->done && !s->failed && !s->stopped && s->pid_start && !rank_lives(s)) return i;
    }
    return -1;
}

/* The peer a communication error lost, as the beats tell it: the rank that
 * reports the error is a survivor that waited for it (--comm-timeout), and
 * the lost one (stopped, hung, its host cut off: on another host, its
 * process cannot be looked at) went silent meanwhile.  Of the ranks other
 * than the reporter, the one whose connection closed, else the one silent
 * the longest, past the hang detector's silence (sup_rank_silence: about
 * two missed beats); -1 when every other rank still beats (a flaky link: no
 * rank to blame).  *since: when it went quiet. */
static int lost_peer(const sup_driver *d, int reporter, double *since) {
    double now = ms_now();
    int who = -1, closed = 0;
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (i == reporter || s->done || s->failed || s->stopped) continue;
        int gone = !s->connected && s->t_lost > 0;
        if (!gone && sup_rank_silence(d, i, now) < 0) continue; /* beats, or never connected */
        double t = gone ? s->t_lost : s->last_beat;
        if (who < 0 || gone > closed || (gone == closed && t < *since))
            who = i, closed = gone, *since = t;
    }
    return who;
}

/* 1 if a comm error's arrival report names global rank g as one the op waited for: in its
 * "not arrived: ..." or "unknown (other host): ..." part (up to the next "; "), or as a
 * point-to-point op's "peer rank R (global g)" (src/comm/comm_board.c writes both). */
static int names_waited_for(const char *err, int g) {
    static const char *const parts[] = {"not arrived: ", "unknown (other host): ", "peer rank "};
    char key[32];
    snprintf(key, sizeof key, "(global %d", g);
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        const char *p = strstr(err, parts[k]), *end;
        if (!p) continue;
        end = strstr(p, "; ");
        for (const char *q = p; (q = strstr(q, key)) && (!end || q < end); q += strlen(key))
            if (q[strlen(key)] == ',' || q[strlen(key)] == ' ' || q[strlen(key)] == ')') return 1;
    }
    return 0;
}

/* The peer a survivor's communication timed out waiting for when every other rank still
 * beats: one stuck in its own work (a hung kernel, a deadlock in its compute), which
 * --comm-timeout shorter than the hang detector's no-progress limit reports first.  The wait
 * is the reporter's own, as its beats said it: from when its newest wait began to its last
 * beat in it (its error comes later: the rank tears down first, a persist in flight, the
 * dumps' grace); a reporter with no beat in a wait since its last step, the error's "timed
 * out after X s" up to now.  Of the others, a rank that made no step while the reporter
 * waited, beat in the wait's second half or at most SUP_BEAT_RECENT_S ago, waiting in
 * nothing at its newest beat, and was blocked in communication at no
 * beat since the wait began (the ranks waiting for it are; one that timed out itself a
 * moment ago says 0 at its newest beat, its error on the way: before, a dp peer's report
 * named the tp peer of the stuck rank so); those the error names as not arrived first,
 * then the one without a step the longest.  Also, before those, a rank that went quiet in
 * the wait: none of its beats for more than SUP_BEAT_MISSED_S (stopped, cut off: lost_peer
 * names it only once silent about two beats, and a --comm-timeout of 2 s reported it
 * first); *quiet says which.  -1 when no rank fits (every
 * other one waits too: a lost message, no rank to blame) or the beats do not say (no beat
 * late in the wait, or a rank that sends no wait time).  *since: the rank's last step, or
 * its last beat if quiet. */
static int stuck_peer(const sup_driver *d, int reporter, const char *err, double *since,
                      int *quiet) {
    const sup_rank *rep = &d->r[reporter];
    double now = ms_now(), began, waited = 0;
    if (rep->t_blocked > rep->last_progress && rep->t_wait_from > 0) {
        began = rep->t_wait_from, waited = rep->t_blocked - began;
    } else {
        const char *t = strstr(err, "timed out after ");
        if (!t || sscanf(t, "timed out after %lf", &waited) != 1) waited = 0;
        began = now - waited;
    }
    if (!(waited > 0)) return -1;
    int who = -1, rank_who = 0, unknown = 0;
    /* a beat that says the rank's state in the wait: in its second half, or at most
     * SUP_BEAT_RECENT_S old, the newest of a rank that beats once a second (in a wait under
     * 2 s it can come before the half, or before the wait: the beat of the rank's last step;
     * before, a rank hung in its compute whose newest beat came 1.0 s before the report was
     * not judged, and the reporter was booked, 6 runs in 10 of tp2 x pp2 under heavy load at
     * --comm-timeout 1).  A rank that waits says so within HB_WAIT_NEWS_S (0.25 s,
     * src/monitor/heartbeat.c), so a newest beat that says it waits in none, with no wait
     * said since, is one that does not.  Not older: a rank whose next beat is overdue may
     * have begun to wait since (for the same rank as the reporter) */
    double late = began + 0.5 * waited, fresh = fmin(late, now - SUP_BEAT_RECENT_S);
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (i == reporter || s->done || s->failed || s->stopped || !s->connected || !s->started)
            continue;
        if (s->last_progress > late) continue; /* made a step in the wait */
        int silent = now - s->last_beat > SUP_BEAT_MISSED_S; /* a beat missed, now */
        if (!silent && isnan(s->comm_wait_s)) unknown = 1;   /* its waits unsaid */
        if (!silent && (isnan(s->comm_wait_s) || s->comm_wait_s > 0 || s->last_beat < fresh ||
                        s->t_blocked >= began))
            continue; /* no beat late in the wait, or waits, or waited in it too */
        /* quiet first (before, a rank the error named outranked it: the tp follower, waiting
         * for its stopped ring leader with no beat yet to say so, was booked for it), then
         * named */
        int rank = 2 * silent + names_waited_for(err, i);
        if (who < 0 || rank > rank_who ||
            (rank == rank_who && s->last_progress < d->r[who].last_progress))
            who = i, rank_who = rank;
    }
    if (who < 0 || (unknown && !(rank_who >> 1))) return -1; /* stuck: only if every rank says */
    *quiet = rank_who >> 1;
    *since = *quiet ? d->r[who].last_beat : d->r[who].last_progress;
    return who;
}

/* pid's start time if host is this host, else 0 (unknown: never signalled). */
/* 1 if a beat's host is this one (its pid is one of this host's). */
static int local_host(const char *host) {
    char me[256] = "";
    gethostname(me, sizeof me - 1);
    return !strcmp(host, me);
}

static unsigned long long local_pid_start(const char *host, int pid) {
    return local_host(host) ? sup_pid_start(pid) : 0;
}

/* The fault of rank b->rank's error beat, of class kind (no rank known gone): its own, the
 * rank whose gradients were not finite, the rank it names as failed, or for a comm error the
 * peer it lost (lost_peer, stuck_peer), reported by it. */
static void on_error(sup_driver *d, const sup_beat *b, const char *kind) {
    d->fault_usage |= b->usage && !d->fault;
    /* a persistent non-finite gradient: the rank whose own gradients
     * it was in, when the beat names one */
    int rank = !strcmp(kind, "nonfinite") && b->n_nan_ranks > 0 ? b->nan_ranks[0] : b->rank;
    /* "rank 0 could not ...: WHY" (a step the ranks share, which rank 0 failed: the
     * checkpoint manager's): the fault is that rank's, reported by this one */
    int origin = peer_failed(b->error);
    if (origin >= 0 && origin < d->c->np && origin != b->rank)
        rank = origin, d->fault_reporter = d->fault ? d->fault_reporter : b->rank;
    double since = 0;
    int comm = !strcmp(kind, "comm") && !d->fault;
    int quiet = comm ? lost_peer(d, b->rank, &since) : -1;
    int went_quiet = 0;
    int stuck = comm && quiet < 0 ? stuck_peer(d, b->rank, b->error, &since, &went_quiet) : -1;
    if (went_quiet) quiet = stuck, stuck = -1;
    if (quiet >= 0) { /* the lost peer, not the survivor that reports it */
        d->fault_reporter = b->rank;
        sup_set_fault(d, kind, quiet, since,
                      "rank %d (on %s) went silent %.1f s before rank %d reported: %s", quiet,
                      d->r[quiet].host, ms_now() - since, b->rank, b->error);
    } else if (stuck >= 0) { /* the peer it waited for, stuck in its own work */
        d->fault_reporter = b->rank;
        sup_set_fault(d, kind, stuck, since,
                      "rank %d (on %s) beats but made no step for %.1f s and waits in no "
                      "communication, while rank %d waited for it: %s",
                      stuck, d->r[stuck].host, ms_now() - since, b->rank, b->error);
    } else {
        sup_set_fault(d, kind, rank, 0, "%s", b->error);
    }
}

void sup_on_beat(sup_driver *d, sup_conn *k, const sup_beat *b) {
    sup_rank *s = &d->r[b->rank];
    double now = ms_now();
    if (k->rank < 0) {
        k->rank = b->rank;
        s->connected = 1;
        s->t_lost = 0;
        s->adopted = 0;
        s->first_step = -1;
        /* the rank's identity for a later stop (pids are reused): its start
         * time, read here only when it runs on this host; an adopted rank's
         * was verified at take-over */
        if (s->pid != b->pid || !s->pid_start) s->pid_start = local_pid_start(b->host, b->pid);
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "rank", b->rank);
        cJSON_AddStringToObject(f, "node", sup_node_name(d, b->rank));
        cJSON_AddStringToObject(f, "host", b->host);
        cJSON_AddNumberToObject(f, "pid", b->pid);
        sup_events_put(&d->ev, "rank_up", f);
    }
    s->pid = b->pid;
    s->last_beat = now;
    s->comm_wait_s = b->comm_wait_s;
    if (b->comm_wait_s > 0) s->t_blocked = now, s->t_wait_from = now - b->comm_wait_s;
    s->dumps = b->dumps;
    snprintf(s->host, sizeof s->host, "%s", b->host);
    /* a validation or a checkpoint's wait (10x the no-progress limit) is
     * over: the next step is timed from now, with the step's limit */
    if (s->started && b->step == s->step && !strcmp(b->phase, "train") &&
        (!strcmp(s->phase, "val") || !strcmp(s->phase, "ckpt")))
        s->last_progress = now;
    snprintf(s->phase, sizeof s->phase, "%s", b->phase);
    if (!s->started && (!strcmp(b->phase, "train") || b->step > 0)) {
        s->started = 1; /* the progress clock starts here: the first step is timed too */
        s->last_progress = now;
        /* the loop's start, as the beat says it (a beat carries the latest state: the first
         * one may come a step or more later); else the steps done, a run's of before */
        s->resume_step = b->start >= 0 ? b->start : b->step;
        s->step = b->step;
    }
    if (b->redone > s->redone || b->skipped > s->skipped) {
        if (b->redone > s->redone) s->redone = b->redone, on_redone(d, b);
        if (b->skipped > s->skipped) s->skipped = b->skipped, on_skipped(d, b);
        sup_state_save(d, 0, 0); /* the counts with the events: a successor says none again */
    }
    if (!d->fault) on_ckpt(d, b);
    if (b->ckpt_warned > d->ckpt_warned) { /* said while stopping after a fault too */
        d->ckpt_warned = b->ckpt_warned;
        on_ckpt_warned(d, b);
        sup_state_save(d, 0, 0); /* the count with the event: a successor says neither again */
    }
    if (b->step > s->step) {
        /* the step a stopping job finishes after a fault waited for the
         * faulty rank: not a step time to learn the hang limit from */
        if (!d->fault && s->first_step >= 0)
            sup_interval_feed(&d->interval, b->step, now - s->last_progress);
        /* an attempt's first step (its set-up's warm-up included) is not
         * learnt into the interval, but once one is made the job is past
         * its start: until a later step is timed, the no-progress limit
         * is based on it, not on --startup-timeout (a hang at step 2 took
         * 600 s to find) */
        if (!d->fault && s->first_step < 0 && now - s->last_progress > d->first_interval)
            d->first_interval = now - s->last_progress;
        if (s->first_step < 0) s->first_step = b->step;
        s->last_progress = now;
        s->step = b->step;
        /* a step made with these options: a later refusal of them is no usage error (a
         * rank's first beats come before its options are checked) */
        if (s->started) d->options_ok = 1;
        /* the mean step time of the ETTR: rank 0's time of each step once,
         * however the ranks' beats of it arrive (best_step may already be
         * there by another rank's), not a step redone after a restart (it
         * was timed), nor the steps a stopping job finishes, after a fault or
         * a stop the driver was asked for (one of them waited for the faulty
         * rank, or for one stopped (SIGSTOP) that the stop's SIGCONT let go:
         * a 152 s step that made the ETTR 1.24; they are timed when redone) */
        if (b->rank == 0 && !d->fault && !d->stopping && isfinite(b->step_ms) &&
            b->step > d->timed_step) {
            d->step_ms_sum += b->step_ms, d->step_ms_n++;
            d->timed_step = b->step;
        }
        if (b->step > s->resume_step + SUP_STRAGGLER_WARMUP) /* not the first steps' set-up */
            sup_straggler_feed(&d->strag, b->rank, b->stage, b->step, b->compute_ms);
        sup_heatlog_feed(&d->heat, d->attempt_no, b->rank, b->step, b->compute_ms);
        if (b->rank == 0) sup_feed_loss(d, b->step, b->loss);
    }
    if (b->step > d->best_step) d->best_step = b->step;
    if (!strcmp(b->phase, "done")) s->done = 1;
    if (!strcmp(b->phase, "stopped") && !s->stopped) {
        s->stopped = 1; /* ended cleanly short of --steps: unless the driver stops it, a fault */
        /* the rank the signal reached (its beat says stop_here); the others
         * stopped by agreement, and their beats may come first: without one
         * that says so, the lowest rank once every rank has stopped */
        int all = 1, low = -1;
        for (int i = 0; i < d->c->np; i++) {
            all &= d->r[i].stopped;
            if (low < 0 && d->r[i].stopped) low = i;
        }
        int rank = b->stop_here ? b->rank : all ? low : -1;
        if (!d->stopping && rank >= 0)
            sup_set_fault(d, "stopped", rank, 0,
                          "rank %d stopped at step %d before --steps %d (%s the driver did not "
                          "send)",
                          rank, b->step, d->c->steps,
                          b->stop_here ? "a SIGTERM, SIGINT or SIGUSR1 to it that"
                                       : "a SIGTERM or SIGINT");
    }
    if (!strcmp(b->phase, "error") && !s->failed) {
        s->failed = 1;
        snprintf(s->error, sizeof s->error, "%s", b->error);
        if (d->reading_ahead) { /* the beat being read decides, with this one's cause */
            if (d->ahead_rank < 0 && strcmp(classify(b->error), "comm"))
                d->ahead_rank = b->rank, d->ahead_beat = *b;
            return;
        }
        const char *kind = classify(b->error);
        if (!strcmp(kind, "comm")) {
            /* the beats the other connections hold unread first: a rank's last words before
             * it exited (its own error, the cause of this one: decided as its own), and the
             * newest beats of the ranks the analysis below judges (a beat still unread made a
             * rank look quiet, or not blocked) */
            d->ahead_rank = -1;
            read_ahead(d, k);
            if (d->ahead_rank >= 0 && !d->fault) {
                on_error(d, &d->ahead_beat, classify(d->ahead_beat.error));
                return;
            }
        }
        /* a peer lost: when a rank's process is known gone, that rank is
         * the fault (its end was not seen first: it had not reconnected to
         * a driver that took the job over, or its close is still unread),
         * unless another rank that reported an error has exited since and this error does
         * not say the gone one's process exited: mpirun then kills the rest, and their being
         * gone is that abort's cascade, no crash (before, under load, a survivor whose
         * error was still unread, or a rank mpirun killed, was booked as the crash: 2 runs
         * in 5 of a SIGSTOPped rank's comm fault) */
        int gone = strcmp(kind, "comm") ? -1 : gone_rank(d);
        if (gone >= 0 && exited_after_error(d, b->rank) && !says_exited(b->error, gone))
            gone = -1; /* the beats decide */
        if (gone >= 0)
            crash(d, gone, d->r[gone].t_lost > 0 ? d->r[gone].t_lost : 0);
        else
            on_error(d, b, kind);
    }
}

/* A rejected connection or beat, as an event: at most REJECT_PER_S a
 * second, so that a local process flooding the ports cannot fill the disk
 * with the event log (one rejects_left_out event counts the rest). */
#define REJECT_PER_S 20
static void reject_flush(sup_driver *d) {
    if (!d->rej_cut) return;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "count", d->rej_cut);
    sup_events_put(&d->ev, "rejects_left_out", f);
    d->rej_cut = 0;
}

/* 1 if one more event of what others send may be written this second; else it is counted for
 * the next rejects_left_out. */
static int reject_budget(sup_driver *d) {
    double now = ms_now();
    if (now - d->rej_t0 >= 1.0) {
        reject_flush(d);
        d->rej_t0 = now, d->rej_n = 0;
    }
    if (d->rej_n >= REJECT_PER_S) {
        d->rej_cut++;
        return 0;
    }
    d->rej_n++;
    return 1;
}

static void reject(sup_driver *d, const char *what, const char *why) {
    if (!reject_budget(d)) return;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "why", why);
    sup_events_put(&d->ev, what, f);
}

/* A rank of an earlier attempt that beats now: it was still starting when that attempt was
 * stopped (no beat recorded its pid, so the stop's sweep did not kill it) and outlived its
 * mpirun.  Before, its beats were taken as the new attempt's rank: a crash was blamed on the
 * new node when it exited, with a stop, a diag and a restart for nothing.  Killed when it runs
 * on this host and is the driver's own (an orphan the subreaper took: its parent is the driver
 * now; never the job's mpirun); said in the events once a process (it reconnects every 2 s). */
static void stale_rank(sup_driver *d, const sup_beat *b) {
    int killed = local_host(b->host) && b->pid != d->job.pid &&
                 sup_pid_parent(b->pid) == getpid() && kill(b->pid, SIGKILL) == 0;
    sup_rank *s = &d->r[b->rank];
    if (s->stale_pid == b->pid && !killed) return;
    s->stale_pid = b->pid;
    /* within the rejects' budget: a beat that names a new pid each time wrote one event a
     * beat, without bound */
    if (!reject_budget(d)) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", b->rank);
    cJSON_AddNumberToObject(o, "pid", b->pid);
    cJSON_AddStringToObject(o, "host", b->host);
    cJSON_AddNumberToObject(o, "attempt", b->attempt);
    cJSON_AddNumberToObject(o, "current", d->attempt_no);
    cJSON_AddBoolToObject(o, "killed", killed);
    sup_events_put(&d->ev, "stale_rank", o);
}

/* Read what k has; 0 to keep it, -1 to drop it. */
static int read_conn(sup_driver *d, sup_conn *k) {
    int rc = k->ended ? -1 : read_lines(d, k);
    k->ended = rc != 0; /* a rejected line is not read (nor its event written) again: before,
                         * read_ahead's pass rejected it and the next pass did once more */
    return rc;
}

static int read_lines(sup_driver *d, sup_conn *k) {
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
            int parsed = sup_beat_parse(k->buf, n, d->token, d->c->np, &b, &why) == 0;
            if (parsed)
                why = sup_beat_admit(&b, k->rank, k->seq, d->r[b.rank].connected, d->attempt_no);
            if (parsed && why && b.attempt > 0 && d->attempt_no > 0 && b.attempt != d->attempt_no)
                stale_rank(d, &b);
            if (why) {
                reject(d, "beat_rejected", why);
                return -1;
            }
            k->seq = b.seq;
            sup_on_beat(d, k, &b);
            memmove(k->buf, nl + 1, k->len - n - 1);
            k->len -= n + 1;
        }
        if (k->len >= sizeof k->buf - 1) { /* a line longer than allowed */
            reject(d, "beat_rejected", "line too long");
            return -1;
        }
    }
}

/* A rank's connection closes: it died, unless its process (on this host)
 * still runs; then the connection broke (its beat client gives up a send
 * that waited a second for a driver busy elsewhere) and it reconnects:
 * sup_watch makes that a crash if the process ends, a hang if it stays
 * silent for --heartbeat-timeout. */
static void drop_conn(sup_driver *d, int i) {
    sup_conn *k = &d->conns[i];
    if (k->rank >= 0) {
        sup_rank *s = &d->r[k->rank];
        s->connected = 0;
        if (!s->done && !s->failed && !s->stopped && !d->fault && d->job.pid &&
            !sup_job_poll(&d->job)) {
            /* a rank killed this moment closes its files a little before it
             * is a zombie: looked at again for up to 20 ms (mpirun may
             * exit soon after, and that fault would win) */
            int lives = rank_lives(s);
            for (int t = 0; lives && t < 20; t++) {
                usleep(1000);
                lives = rank_lives(s);
            }
            if (!lives) {
                crash(d, k->rank, 0);
            } else {
                s->t_lost = ms_now();
                cJSON *f = cJSON_CreateObject();
                cJSON_AddNumberToObject(f, "rank", k->rank);
                cJSON_AddNumberToObject(f, "pid", s->pid);
                sup_events_put(&d->ev, "beat_conn_lost", f);
            }
        }
    }
    close(k->fd);
    d->conns[i] = d->conns[--d->n_conns];
}

/* ---- the control socket ------------------------------------------------- */

static void ctl_reply(int fd, int ok, const char *msg, cJSON *extra) {
    cJSON *o = extra ? extra : cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ok", ok);
    cJSON_AddStringToObject(o, "msg", msg);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (text) {
        (void)!send(fd, text, strlen(text), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)!send(fd, "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    cJSON_free(text);
}

static cJSON *status_json(sup_driver *d) {
    cJSON *o = cJSON_CreateObject(), *nodes = cJSON_AddArrayToObject(o, "nodes");
    cJSON_AddNumberToObject(o, "step", d->best_step);
    cJSON_AddNumberToObject(o, "restarts", d->restarts);
    cJSON_AddNumberToObject(o, "attempt", d->attempt_no);
    cJSON_AddNumberToObject(o, "faults", d->ev.n_faults);
    for (int i = 0; i < d->pool->n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "node", d->pool->name[i]);
        cJSON_AddStringToObject(e, "state",
                                d->pool->blocked[i][0]            ? "blocked"
                                : sup_nodes_is_active(d->pool, i) ? "active"
                                                                  : "spare");
        if (d->pool->blocked[i][0]) cJSON_AddStringToObject(e, "reason", d->pool->blocked[i]);
        cJSON_AddItemToArray(nodes, e);
    }
    return o;
}

static void on_ctl(sup_driver *d, int fd, const sup_ctl_msg *m) {
    char msg[512];
    if (!strcmp(m->cmd, "status")) {
        ctl_reply(fd, 1, "status", status_json(d));
        return;
    }
    if (!strcmp(m->cmd, "dump")) { /* every rank's hang dump, the job going on */
        int busy = d->fault || d->recovering, asked = 0;
        int n = busy ? 0 : sup_hang_dumps(d, "ctl", &asked);
        if (busy)
            snprintf(msg, sizeof msg, "a recovery is under way; try again");
        else if (!asked)
            snprintf(msg, sizeof msg,
                     "no rank to ask: no job running, or its ranks trace nothing (--trace-dir "
                     "none)");
        else
            snprintf(msg, sizeof msg,
                     "%d of %d rank(s) wrote their hang dump into %s: megascale trace hang %s", n,
                     asked, d->trace_dir, d->trace_dir);
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "cmd", "dump");
        cJSON_AddBoolToObject(f, "ok", n > 0);
        if (n <= 0) cJSON_AddStringToObject(f, "why", msg);
        sup_events_put(&d->ev, "ctl", f);
        ctl_reply(fd, n > 0, msg, NULL);
        return;
    }
    int i = sup_nodes_find(d->pool, m->node);
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "cmd", "evict");
    cJSON_AddStringToObject(f, "node", m->node);
    if (i < 0) {
        snprintf(msg, sizeof msg, "no node '%s' in this job's pool", m->node);
    } else if (d->pool->blocked[i][0]) {
        snprintf(msg, sizeof msg, "node %s is already on the blocklist (%s)", m->node,
                 d->pool->blocked[i]);
    } else if (sup_nodes_is_active(d->pool, i) && sup_nodes_usable(d->pool) <= d->pool->needed) {
        snprintf(msg, sizeof msg,
                 "evicting node %s would leave %d healthy node(s) for a job of %d: no spare",
                 m->node, sup_nodes_usable(d->pool) - 1, d->pool->needed);
    } else if (sup_nodes_is_active(d->pool, i) && (!d->job.pid || d->job.exited)) {
        /* the eviction rides on the running attempt's fault: between attempts (the
         * pre-flight check, the final save) the next attempt's sup_reset_ranks cleared it
         * and the job went on on the node, after a reply that said it was evicted */
        snprintf(msg, sizeof msg,
                 "no job is running (a pre-flight check, a restart or the end is under way): "
                 "try again once it runs");
    } else if (sup_nodes_is_active(d->pool, i)) {
        if (d->evict_node < 0 && !d->fault && !d->recovering) {
            d->evict_node = i;
            snprintf(d->evict_reason, sizeof d->evict_reason,
                     "manual eviction (megascale launch --ctl)");
            sup_set_fault(d, "evicted", -1, 0, "node %s evicted by the control socket", m->node);
            sup_state_save(d, 0, 1); /* accepted: a driver that takes over from here evicts it */
            d->t_saved = ms_now();
            snprintf(msg, sizeof msg, "node %s: evicting; the job restarts on a spare", m->node);
            cJSON_AddBoolToObject(f, "ok", 1);
            sup_events_put(&d->ev, "ctl", f);
            ctl_reply(fd, 1, msg, NULL);
            return;
        }
        snprintf(msg, sizeof msg, "a recovery is under way; try again");
    } else if ((d->evict_node >= 0 || d->fault || d->recovering) &&
               sup_nodes_usable(d->pool) - (d->evict_node >= 0) - 1 < d->pool->needed) {
        /* the recovery under way may need this spare (it was taken, then missed) */
        snprintf(msg, sizeof msg,
                 "a recovery is under way and may need spare node %s; try again once it is done",
                 m->node);
    } else {
        sup_evict(d, i, "manual", "manual eviction (megascale launch --ctl)");
        snprintf(msg, sizeof msg, "spare node %s is on the blocklist", m->node);
        cJSON_AddBoolToObject(f, "ok", 1);
        sup_events_put(&d->ev, "ctl", f);
        ctl_reply(fd, 1, msg, NULL);
        return;
    }
    cJSON_AddBoolToObject(f, "ok", 0);
    cJSON_AddStringToObject(f, "why", msg);
    sup_events_put(&d->ev, "ctl", f);
    ctl_reply(fd, 0, msg, NULL);
}

/* 1 when connection k is done (answered, or dropped). */
static int read_ctl(sup_driver *d, sup_ctl_conn *k) {
    ssize_t got = recv(k->fd, k->buf + k->len, sizeof k->buf - 1 - k->len, MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return 1;
    if (got > 0) k->len += (size_t)got;
    char *nl = memchr(k->buf, '\n', k->len);
    if (!nl && k->len < sizeof k->buf - 1) return 0;
    sup_ctl_msg m;
    const char *why = "line too long";
    if (nl && sup_ctl_parse(k->buf, (size_t)(nl - k->buf), d->ctl_token, &m, &why) == 0) {
        on_ctl(d, k->fd, &m);
    } else {
        reject(d, "ctl_rejected", why);
        ctl_reply(k->fd, 0, why, NULL);
    }
    return 1;
}

static void drop_ctl(sup_driver *d, int i) {
    close(d->ctl[i].fd);
    d->ctl[i] = d->ctl[--d->n_ctl];
}

/* The control connection pass `pass` answered; `done`: dropped.  The answer
 * may have nested a pass (an eviction waits for its state on disk, serving
 * the sockets meanwhile) that dropped or accepted others: it is found again. */
static void ctl_answered(sup_driver *d, unsigned long pass, int done) {
    for (int i = 0; i < d->n_ctl; i++)
        if (d->ctl[i].busy == pass) {
            d->ctl[i].busy = 0;
            if (done) drop_ctl(d, i);
            return;
        }
}

/* Take the connections waiting on lfd (the heartbeat port, or the control port with ctl), at
 * most half the slots a pass, and read each at once: a client with something to say has
 * usually said it by the time it is taken (it waited behind the others), and it is then
 * answered, or known for a rank, before the next one can make room.  Full, the oldest that
 * said nothing makes room (a control client that sent part of its line, and a rank, are left
 * alone): so a flood of connections that never send cannot crowd the owner out, nor a rank
 * reconnecting.  Before, 64 were taken a pass and the oldest made room, so that under a flood
 * the owner's `launch --ctl` was dropped unread in 16 calls of 25. */
static void accept_all(sup_driver *d, int lfd, int ctl, unsigned long pass) {
    int slots = ctl ? SUP_MAX_CTL : 4 * d->c->np + 16;
    if (slots > SUP_MAX_CONNS) slots = SUP_MAX_CONNS;
    for (int taken = 0; taken < (slots + 1) / 2 && d->serve_passes == pass; taken++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return;
        if (ctl) {
            if (d->n_ctl >= SUP_MAX_CTL) {
                int old = -1; /* the oldest silent one, else the oldest */
                for (int i = 0; i < d->n_ctl; i++) {
                    if (d->ctl[i].busy) continue;
                    int quiet = d->ctl[i].len == 0, was = old >= 0 && d->ctl[old].len == 0;
                    if (old < 0 || quiet > was ||
                        (quiet == was && d->ctl[i].t_open < d->ctl[old].t_open))
                        old = i;
                }
                if (old < 0) { /* every one is being answered */
                    close(fd);
                    continue;
                }
                reject(d, "ctl_rejected", "every slot taken: the oldest connection made room");
                drop_ctl(d, old);
            }
            sup_ctl_conn *k = &d->ctl[d->n_ctl++];
            k->fd = fd, k->busy = pass, k->len = 0, k->t_open = ms_now();
            ctl_answered(d, pass, read_ctl(d, k));
            continue;
        }
        if (d->n_conns >= slots) {
            int old =
                -1; /* the oldest that has not said a valid beat (a real rank beats at once) */
            for (int i = 0; i < d->n_conns; i++)
                if (d->conns[i].rank < 0 && (old < 0 || d->conns[i].t_open < d->conns[old].t_open))
                    old = i;
            if (old < 0) {
                close(fd);
                continue;
            }
            reject(d, "beat_rejected",
                   "every slot taken: the oldest connection without a beat made room");
            drop_conn(d, old);
        }
        int i = d->n_conns++;
        sup_conn *k = &d->conns[i];
        k->fd = fd, k->rank = -1, k->ended = 0, k->seq = 0, k->len = 0, k->t_open = ms_now();
        if (read_conn(d, k) != 0) drop_conn(d, i);
    }
}

void sup_serve(sup_driver *d) {
    sup_serve_for(d, SUP_TICK_MS);
}

/* One pass over the sockets.  It nests in an answer on the control socket
 * (an eviction's waited save): the nested pass leaves the connection being
 * answered alone, and the outer one, its events stale once a nested pass
 * has polled (the connections moved), ends its own. */
void sup_serve_for(sup_driver *d, int ms) {
    unsigned long pass = ++d->serve_passes;
    int n = d->n_conns, m = 0;
    struct pollfd *p = calloc((size_t)(n + d->n_ctl) + 2, sizeof *p);
    int *ctl_of = calloc((size_t)d->n_ctl + 1, sizeof *ctl_of);
    if (!p || !ctl_of) {
        free(p);
        free(ctl_of);
        return;
    }
    p[0] = (struct pollfd){d->lfd, POLLIN, 0};
    p[1] = (struct pollfd){d->ctl_fd, POLLIN, 0};
    for (int i = 0; i < n; i++)
        p[i + 2] = (struct pollfd){d->conns[i].fd, POLLIN, 0};
    for (int i = 0; i < d->n_ctl; i++)
        if (!d->ctl[i].busy) {
            ctl_of[m] = i;
            p[n + 2 + m++] = (struct pollfd){d->ctl[i].fd, POLLIN, 0};
        }
    if (poll(p, (nfds_t)(n + m) + 2, ms) > 0) {
        for (int j = m - 1; j >= 0 && d->serve_passes == pass; j--) {
            if (!p[n + 2 + j].revents) continue;
            d->ctl[ctl_of[j]].busy = pass;
            ctl_answered(d, pass, read_ctl(d, &d->ctl[ctl_of[j]]));
        }
        for (int i = n - 1; i >= 0 && d->serve_passes == pass; i--)
            if (p[i + 2].revents && read_conn(d, &d->conns[i]) != 0) drop_conn(d, i);
        if (d->serve_passes == pass && (p[0].revents & POLLIN)) accept_all(d, d->lfd, 0, pass);
        if (d->serve_passes == pass && (p[1].revents & POLLIN)) accept_all(d, d->ctl_fd, 1, pass);
    }
    free(p);
    free(ctl_of);
    double now = ms_now();
    for (int i = d->n_conns - 1; i >= 0; i--) {
        if (d->conns[i].ended) { /* in read_ahead, nothing new on it since */
            drop_conn(d, i);
        } else if (d->conns[i].rank < 0 && now - d->conns[i].t_open > SUP_HB_AUTH_S) {
            reject(d, "beat_rejected", "no valid beat within 5 s"); /* nor a client without one */
            drop_conn(d, i);
        }
    }
    for (int i = d->n_ctl - 1; i >= 0; i--) /* a silent client does not hold a slot */
        if (!d->ctl[i].busy && now - d->ctl[i].t_open > CTL_READ_S) {
            reject(d, "ctl_rejected", "no line within 2 s");
            drop_ctl(d, i);
        }
    if (d->rej_cut && now - d->rej_t0 >= 1.0) reject_flush(d); /* the flood's count */
}

double sup_rank_silence(const sup_driver *d, int i, double now) {
    const sup_rank *s = &d->r[i];
    double quiet = fmin(3.0, 0.6 * d->c->hb_timeout);
    if (s->done || s->failed || (!s->connected && !s->adopted)) return -1;
    /* a rank of a job taken over that has not reconnected: silent since the takeover, once a
     * live one would have redialled (before, it was never silent, and a rank stopped before
     * the takeover left the rank that waited for it to be named) */
    if (!s->connected) quiet += SUP_REDIAL_S;
    if (now - s->last_beat <= quiet) return -1;
    return now - s->last_beat;
}

/* A rank of a job taken over that may still reconnect (not yet silent by sup_rank_silence). */
static int adopted_pending(const sup_driver *d, double now) {
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (s->adopted && !s->connected && !s->done && !s->failed &&
            sup_rank_silence(d, i, now) < 0)
            return 1;
    }
    return 0;
}

/* The rank whose last beat is oldest, if it has gone silent
 * (sup_rank_silence), else -1. */
static int silent_rank(const sup_driver *d, double now) {
    int best = -1;
    for (int i = 0; i < d->c->np; i++)
        if (sup_rank_silence(d, i, now) >= 0 &&
            (best < 0 || d->r[i].last_beat < d->r[best].last_beat))
            best = i;
    return best;
}

/* Every rank that beats (started, connected, not done) has beaten since t. */
static int all_beat_since(const sup_driver *d, double t) {
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (!s->done && !s->failed && s->connected && s->started && s->last_beat <= t) return 0;
    }
    return 1;
}

/* Of the ranks that beat but make no step, the one that is not blocked in
 * communication while others are (they wait for it: a pipeline stage in its
 * recv from the next one, a tp group in its all-reduce), the shortest wait
 * first; -1 when the beats do not say, or when every rank waits or none
 * does.  *n_blocked, *longest: the ranks that wait, and the longest wait. */
static int unblocked_rank(const sup_driver *d, double now, int *n_blocked, double *longest) {
    int best = -1;
    *n_blocked = 0, *longest = 0;
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        if (s->done || s->failed || !s->connected || !s->started) continue;
        if (isnan(s->comm_wait_s)) return -1;
        /* blocked since it stalled: in a wait at its last beat, one that
         * began in the first half of the stall.  The beat is up to a beat
         * period (1 s) old and the wait has gone on since: before, the wait
         * as of the beat was held against half the stall as of now, and
         * with --heartbeat-timeout 2 a beat 1 s old said 0.9 s of a 2 s
         * stall, no rank counted as blocked and the hang was put on the
         * first rank (rank 0 named for a hang of rank 1, bench/chaos
         * --heartbeat-timeout 2 --steps-per-fault 1 --seed 707) */
        double began = s->last_beat - s->comm_wait_s;
        if (s->comm_wait_s > 0 && began - s->last_progress <= 0.5 * (now - s->last_progress)) {
            (*n_blocked)++;
            *longest = fmax(*longest, now - began);
        } else if (best < 0 || s->comm_wait_s < d->r[best].comm_wait_s) {
            best = i;
        }
    }
    return *n_blocked ? best : -1;
}

/* A straggler: evicted when a spare can take its node's place, else said once. */
static void watch_straggler(sup_driver *d) {
    const sup_config *c = d->c;
    double score = 1;
    int r = c->straggler_rounds > 0
                ? sup_straggler_check(&d->strag, c->straggler_score, c->straggler_rounds, &score)
                : -1;
    if (r < 0) return;
    int node = sup_nodes_of_rank(d->pool, r);
    if (sup_nodes_usable(d->pool) > d->pool->needed && node >= 0) {
        d->evict_node = node;
        snprintf(d->evict_reason, sizeof d->evict_reason,
                 "straggler: rank %d's compute time per step is %.0f%% of its reference (its "
                 "stage's or its own earlier) for %d "
                 "steps",
                 r, score > 0 ? 100 / score : 0, c->straggler_rounds);
        sup_set_fault(d, "straggler", r, 0,
                      "rank %d (node %s) computes at %.2f x its reference speed (its stage's or "
                      "its own earlier) for %d steps in a "
                      "row (--straggler-score %.2f)",
                      r, d->pool->name[node], score, c->straggler_rounds, c->straggler_score);
    } else if (!d->straggler_warned) {
        d->straggler_warned = 1;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "rank", r);
        cJSON_AddStringToObject(f, "node", sup_node_name(d, r));
        cJSON_AddNumberToObject(f, "step", d->r[r].step);
        cJSON_AddNumberToObject(f, "score", score);
        cJSON_AddStringToObject(f, "detail", "no spare node to take its place: the job goes on");
        anomaly(d, "straggler", f);
        fprintf(stderr,
                "megascale launch: straggler: rank %d (node %s) at %.2f x its reference speed; no "
                "spare node, so the job goes on\n",
                r, sup_node_name(d, r), score);
    }
}

void sup_watch(sup_driver *d) {
    const sup_config *c = d->c;
    double now = ms_now();
    for (int i = 0; i < c->np && !d->fault; i++) {
        sup_rank *s = &d->r[i];
        if (s->done || s->failed) continue;
        /* gone before it reconnected: after its connection broke, or (a job
         * taken over) before its first beat to this driver */
        if (!s->connected && (s->t_lost > 0 || s->adopted) && !rank_lives(s)) {
            crash(d, i, s->t_lost > 0 ? s->t_lost : d->t_launch);
            continue;
        }
        if (s->adopted && !s->connected) {
            /* alive, and silent since the takeover past a redial: stopped or stuck (before,
             * only --startup-timeout, 600 s, applied to it) */
            if (now - s->last_beat > c->hb_timeout + SUP_REDIAL_S)
                sup_set_fault(d, "hang", i, s->last_beat,
                              "rank %d (pid %d) has sent no heartbeat in the %.1f s since this "
                              "driver took the job over (--heartbeat-timeout %.0f s, + %.0f s to "
                              "reconnect): stopped or stuck",
                              i, s->pid, now - s->last_beat, c->hb_timeout, SUP_REDIAL_S);
            continue;
        }
        if (!s->started) {
            if (now - d->t_launch > c->startup_timeout)
                sup_set_fault(d, "startup", i, d->t_launch,
                              "rank %d did not %s within %.0f s (--startup-timeout)", i,
                              s->connected ? "start training" : "send a heartbeat",
                              c->startup_timeout);
            continue;
        }
        if (now - s->last_beat > c->hb_timeout)
            sup_set_fault(d, "hang", i, s->last_beat,
                          "no heartbeat from rank %d (pid %d) for %.1f s (--heartbeat-timeout "
                          "%.0f s): stopped or stuck",
                          i, s->pid, now - s->last_beat, c->hb_timeout);
    }
    int stalled = 0; /* a rank is past its limit */
    for (int i = 0; i < c->np && !d->fault; i++) {
        sup_rank *s = &d->r[i];
        if (s->done || s->failed || !s->connected || !s->started) continue;
        double seen = sup_interval_max(&d->interval);
        if (seen <= 0) seen = d->first_interval;
        double limit = fmax(c->hb_timeout, c->progress_factor * seen);
        if (seen <= 0) limit = fmax(limit, c->startup_timeout); /* no step seen yet */
        if (!strcmp(s->phase, "val") || !strcmp(s->phase, "ckpt")) limit *= 10; /* no steps */
        if (now - s->last_progress <= limit) continue;
        stalled = 1;
        /* every rank of a hung job stops making steps; the culprit is the one
         * that also went silent, if any, else the one that waits in no
         * communication (the others are waiting for it) */
        int silent = silent_rank(d, now), n_blocked;
        /* a rank of a job taken over may yet reconnect, or be found silent: every other
         * rank's stall may be its, so the verdict waits (at most SUP_REDIAL_S + quiet) */
        if (silent < 0 && adopted_pending(d, now)) break;
        double longest;
        int stuck = silent < 0 ? unblocked_rank(d, now, &n_blocked, &longest) : -1;
        /* neither: the beats may be older than the stall's shape (a rank's
         * newest beat from before its wait began, sent up to a period ago
         * and late on a loaded host).  With peers to compare, the verdict
         * waits until each has beaten since, for at most SUP_UNCLEAR_WAIT_S;
         * before, the first rank without progress was named at once, and a
         * CI run named the rank waiting for the hung one. */
        if (silent < 0 && stuck < 0 && c->np > 1) {
            if (d->t_unclear <= 0) d->t_unclear = now;
            if (now - d->t_unclear < SUP_UNCLEAR_WAIT_S && !all_beat_since(d, d->t_unclear))
                break; /* looked at again on the next pass */
        }
        if (silent >= 0)
            sup_set_fault(d, "hang", silent, d->r[silent].last_beat,
                          "no step for %.1f s, and rank %d (pid %d) has sent no heartbeat for "
                          "%.1f s: stopped or stuck",
                          now - s->last_progress, silent, d->r[silent].pid,
                          now - d->r[silent].last_beat);
        else if (stuck >= 0)
            sup_set_fault(d, "hang", stuck, d->r[stuck].last_progress,
                          "rank %d beats but made no step for %.1f s and waits in no "
                          "communication, while %d other rank(s) have been blocked in it for up "
                          "to %.1f s (waiting for it)",
                          stuck, now - d->r[stuck].last_progress, n_blocked, longest);
        else if (seen <= 0) /* the limit was --startup-timeout's, not a step's */
            sup_set_fault(d, "hang", i, s->last_progress,
                          "rank %d beats but made no step for %.1f s (limit %.1f s: "
                          "--startup-timeout, no step made yet)",
                          i, now - s->last_progress, limit);
        else
            sup_set_fault(d, "hang", i, s->last_progress,
                          "rank %d beats but made no step for %.1f s (limit %.1f s: %.1f x the "
                          "longest recent step, at least the heartbeat timeout)",
                          i, now - s->last_progress, limit, c->progress_factor);
    }
    if (!stalled) d->t_unclear = 0;
    if (!d->fault) watch_straggler(d);
}

void sup_dash_update(sup_driver *d, int now) {
    if (!d->dash || (!now && ms_now() - d->t_dash < 0.25)) return;
    d->t_dash = ms_now();
    double t = ms_now(), quiet = fmin(3.0, 0.6 * d->c->hb_timeout);
    for (int i = 0; i < d->c->np; i++) {
        const sup_rank *s = &d->r[i];
        sup_dash_rank *x = &d->dash_ranks[i];
        /* before a started rank's first step, the step it resumed at; before
         * its start, not known (-1: the events' step is shown) */
        x->step = s->step > 0 ? s->step : s->started ? s->resume_step : -1;
        x->beat_age_s = s->connected ? t - s->last_beat : NAN;
        x->compute_ms = d->strag.compute[i];
        /* done or failed first: a rank that said so has closed its connection */
        x->state = s->done                    ? SUP_DASH_DONE
                   : s->failed                ? SUP_DASH_DEAD
                   : !s->connected            ? SUP_DASH_STARTING
                   : t - s->last_beat > quiet ? SUP_DASH_HUNG
                   : d->strag.strikes[i] > 0  ? SUP_DASH_SLOW
                                              : SUP_DASH_RUNNING;
        if (d->fault) /* stopping: the events tell the culprit; the others wait */
            x->state = i == d->fault_rank
                           ? (strcmp(d->kind, "hang") ? SUP_DASH_DEAD : SUP_DASH_HUNG)
                           : SUP_DASH_STOPPED;
    }
    sup_dash_live l = {.attempt = d->attempt_no,
                       .restarts = d->restarts,
                       .best_step = d->best_step,
                       .recovering = d->fault || d->pending_recovery,
                       .ettr = sup_ettr(d),
                       .n_ranks = d->c->np,
                       .ranks = d->dash_ranks};
    sup_dash_push(d->dash, &l);
}

void sup_reset_ranks(sup_driver *d) {
    memset(d->r, 0, sizeof *d->r * (size_t)d->c->np);
    for (int i = 0; i < d->c->np; i++)
        d->r[i].first_step = -1, d->r[i].comm_wait_s = NAN, d->r[i].dumps = -1;
    while (d->n_conns) {
        close(d->conns[d->n_conns - 1].fd);
        d->n_conns--;
    }
    d->fault = 0;
    d->kind[0] = d->detail[0] = 0;
    d->fault_rank = -1;
    d->fault_reporter = -1;
    /* a new attempt's ranks count from 0: the same step redone or skipped again (a restart
     * from before it) is said again */
    d->nan_step = d->skip_step = 0;
    d->fault_booked = 0;
    d->fault_usage = 0;
    d->redone_booked = 0;
    d->ckpt_warned = 0;
    d->evict_node = -1;
    d->evict_reason[0] = 0;
    d->straggler_warned = 0;
    d->t_unclear = 0;
    d->ckpt_streak = 0;
    d->ckpt_fault = -1;
    d->stopping = 0;
    d->t_all_done = 0;
    sup_straggler_reset(&d->strag);
}
