/* sup_driver.c - the driver's loop (see sup.h): attempts, the restart
 * policy, the summary.  What it watches is in sup_watch.c, what it does
 * after a fault (diag, eviction, spares) and its state file in
 * sup_recover.c.
 *
 * Detection, each checked every 0.2 s (docs/operations.md, "Faults"):
 *  - a rank's heartbeat connection closes before it said "done" or "error"
 *    (the process died: kill -9, a crash, OOM): at once;
 *  - a rank's beat carries phase "error" (it failed, and says why: a peer
 *    lost, storage, a checkpoint that did not commit, a persistent
 *    non-finite loss, ...): at once;
 *  - mpirun exits with a non-zero status: at once;
 *  - no beat from a rank for --heartbeat-timeout (the process is stopped
 *    or its beat thread cannot run);
 *  - beats without a new step for max(--heartbeat-timeout,
 *    --progress-factor x the longest recent step) (hung in compute or in a
 *    collective), or no first step within --startup-timeout;
 *  - a straggler: a rank whose compute time per step stays above the
 *    others' (score < --straggler-score for --straggler-rounds steps);
 *  - a transient non-finite step (redone in place by the ranks) and a loss
 *    spike (z-score): events, no restart;
 *  - a manual eviction through the control socket.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/ctx.h"
#include "base/fault.h"
#include "base/fileio.h"
#include "base/strnum.h"
#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    g_stop = sig;
}

int sup_make_token(char *out) {
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return -1;
    for (int i = 0; i < 16; i++)
        sprintf(out + 2 * i, "%02x", raw[i]);
    return 0;
}

const char *sup_argv_value(char *const *argv, int argc, const char *name) {
    size_t n = strlen(name);
    const char *v = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, name, n)) continue;
        if (a[n] == '=') v = a + n + 1;
        if (a[n] == 0 && i + 1 < argc) v = argv[i + 1];
    }
    return v;
}

/* The first line of CKPT_DIR/NAME into buf ("" if none). */
static void ckpt_text(const sup_driver *d, const char *name, char *buf, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", d->ckpt_dir, name);
    buf[0] = 0;
    FILE *f = fopen(path, "re");
    if (!f) return;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
}

/* CKPT_DIR/latest's text ("step_00000040") into buf ("" if none). */
static void latest_text(const sup_driver *d, char *buf, size_t n) {
    ckpt_text(d, "latest", buf, n);
}

/* The step CKPT_DIR/stopped names (the ranks' final checkpoint after a
 * stop request, written by rank 0; every start of the job removes it), or
 * -1: a job gone with it stopped cleanly. */
static int stopped_step(const sup_driver *d) {
    char text[32];
    int step = -1;
    ckpt_text(d, "stopped", text, sizeof text);
    return sscanf(text, "step %d", &step) == 1 && step >= 0 ? step : -1;
}

/* The step of CKPT_DIR/latest, or -1. */
static int latest_commit(const sup_driver *d) {
    char buf[64];
    int step = -1;
    latest_text(d, buf, sizeof buf);
    return sscanf(buf, "step_%d", &step) == 1 ? step : -1;
}

/* CKPT_DIR/latest as "TEXT|INODE|MTIME_NS" ("" if none): it is replaced
 * by a rename at each commit, so a new commit of the same step differs. */
static void latest_id(const sup_driver *d, char *buf, size_t n) {
    char text[64], path[4200];
    struct stat sb;
    latest_text(d, text, sizeof text);
    snprintf(path, sizeof path, "%s/latest", d->ckpt_dir);
    if (!text[0] || stat(path, &sb) != 0) {
        buf[0] = 0;
        return;
    }
    snprintf(buf, n, "%s|%llu|%lld", text, (unsigned long long)sb.st_ino,
             (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec);
}

/* The newest step in the metrics (rank 0's lines; -1: none, or not
 * readable): what a driver that takes a job over knows of the steps made
 * while no driver watched, and of those no beat told when a fault is
 * booked.  Only the file's last 64 KiB are read. */
/* The metrics' last `tail` bytes as text (malloc'd, NUL bytes made spaces so that strstr
 * reads it whole), or NULL when none can be read; *from: the current start's lines, from
 * its config line when the tail holds one (a rollback's earlier history, later steps, came
 * before it), else the tail's start (its first line may be cut). */
static char *metrics_tail(const sup_driver *d, size_t tail, char **from) {
    int fd = open(d->metrics_path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    char *buf = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? malloc(tail + 1) : NULL;
    ssize_t got =
        buf ? pread(fd, buf, tail, (size_t)sb.st_size > tail ? sb.st_size - (off_t)tail : 0) : -1;
    if (fd >= 0) close(fd);
    if (got <= 0) {
        free(buf);
        return NULL;
    }
    for (ssize_t i = 0; i < got; i++)
        if (!buf[i]) buf[i] = ' ';
    buf[got] = 0;
    *from = buf;
    for (char *c = buf; (c = strstr(c, "\"type\":\"config\"")); c++)
        *from = c;
    return buf;
}

int sup_metrics_step(const sup_driver *d) {
    char *from = NULL, *buf = metrics_tail(d, 65536, &from);
    int best = -1;
    for (const char *p = from; buf && (p = strstr(p, "\"step\":")); p += 7) {
        int s;
        if (sscanf(p + 7, "%d", &s) == 1 && s > best) best = s;
    }
    free(buf);
    return best;
}

void sup_metrics_catch_up(sup_driver *d) {
    char *from = NULL, *buf = metrics_tail(d, 262144, &from);
    if (!buf) return;
    char *nl = strchr(from, '\n'); /* whole lines only: past the config line, or a cut one */
    for (char *line = nl ? nl + 1 : NULL; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (!nl) break; /* a line being written */
        *nl = 0;
        cJSON *o = cJSON_Parse(line);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step"),
                    *lo = cJSON_GetObjectItemCaseSensitive(o, "loss");
        if (cJSON_IsNumber(st) && cJSON_IsNumber(lo) && st->valuedouble > d->spike.last_step &&
            st->valuedouble < 1e9)
            sup_feed_loss(d, (int)st->valuedouble, lo->valuedouble);
        cJSON_Delete(o);
    }
    free(buf);
}

/* 1 once the job has committed a checkpoint of its own: CKPT_DIR/latest
 * is another than before its first start (what was there then is another
 * run's, or the one --resume names). */
static int own_commit(const sup_driver *d) {
    char now[sizeof d->latest0];
    latest_id(d, now, sizeof now);
    return now[0] && strcmp(now, d->latest0) != 0;
}

/* 1 once the job's first start has set up CKPT_DIR with --resume PATH or
 * --new-run: CKPT_DIR/job holds another id than before it (--new-run's
 * fresh start, --resume of another directory, a rollback past newer
 * commits each write a new one), or a start of the job reached training
 * (options_ok: its set-up was done; a --resume of the directory's own
 * newest commit keeps the id); the id into d->restart_job.  Until then a
 * restart is a first start again (what was there is another run's). */
static int first_start_done(sup_driver *d) {
    char job[40];
    ckpt_text(d, "job", job, sizeof job);
    if (!strcmp(d->job0, "-") || strspn(job, "0123456789abcdef") != 16 || job[16] ||
        (!strcmp(job, d->job0) && !d->options_ok))
        return 0;
    snprintf(d->restart_job, sizeof d->restart_job, "%s", job);
    return 1;
}

/* 1 if every rank said "done" at --steps. */
static int all_reached(const sup_driver *d) {
    for (int i = 0; i < d->c->np; i++)
        if (!d->r[i].done || d->r[i].step < d->c->steps) return 0;
    return 1;
}

/* An adopted job ended (no exit status): it finished if every rank said so,
 * or, when it ended before its ranks reconnected, if its final checkpoint
 * (at --steps) is committed. */
static int adopted_job_finished(const sup_driver *d) {
    return all_reached(d) || latest_commit(d) >= d->c->steps;
}

/* 1 if train option argv[i] is --resume or --new-run (sets *skip to the
 * arguments it takes up: 1 for --name=V, 2 for --name V, 1 for a bare
 * --new-run: the option parser's rule, a value only when it reads as an
 * integer, opts_spec.bare). */
static int start_option(char **argv, int argc, int i, int *skip) {
    static const struct {
        const char *name;
        int bare;
    } names[] = {{"--resume", 0}, {"--new-run", 1}};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(names[k].name);
        if (strncmp(argv[i], names[k].name, n)) continue;
        if (argv[i][n] == '=') return *skip = 1, 1;
        int value = i + 1 < argc && (!names[k].bare || ms_str_is_integer(argv[i + 1]));
        if (argv[i][n] == 0) return *skip = value ? 2 : 1, 1;
    }
    return 0;
}

/* mpirun's argv for the job (NULL-terminated, malloc'd; strings borrowed):
 * the train options, how to start, and this attempt's injected faults.
 * The user's --resume PATH and --new-run 1 are for the job's first start:
 * once the job has a commit of its own, every start resumes from its newest
 * valid one (--resume auto --new-run 0; on the command line, they override
 * a --config file).  Until then a restart starts as the first did. */
static char **job_argv(sup_driver *d, char *np) {
    const sup_config *c = d->c;
    int n = 0, cap = 40 + c->train_argc;
    char **a = calloc((size_t)cap, sizeof *a);
    if (!a) return NULL;
    a[n++] = (char *)(c->mpirun ? c->mpirun : "mpirun");
    if (getuid() == 0) a[n++] = "--allow-run-as-root";
    if (!c->hostfile) a[n++] = "--oversubscribe";
    /* Open MPI binds each rank of a job of 1 or 2 to one core: its threads (the trainer's
     * default is the host's cores over its ranks) would share that core */
    a[n++] = "--bind-to";
    a[n++] = "none";
    a[n++] = "-np";
    a[n++] = np;
    a[n++] = "-x";
    a[n++] = "MS_HEARTBEAT";
    a[n++] = "-x";
    a[n++] = "MS_HEARTBEAT_TOKEN";
    a[n++] = "-x";
    a[n++] = "MS_HEARTBEAT_ATTEMPT";
    a[n++] = "-x";
    a[n++] = "MS_NODE_MAP";
    if (ms_ctx_get()->cpu_gemm[0]) /* the fp32 GEMMs chosen here, on every host */
        a[n++] = "-x", a[n++] = "MS_CPU_GEMM";
    if (c->hostfile) a[n++] = "--hostfile", a[n++] = d->hostfile_path;
    a[n++] = (char *)c->bin;
    a[n++] = "train";
    int resume_own = own_commit(d);
    for (int i = 0, skip = 0; i < c->train_argc; i++) {
        if (resume_own && start_option(c->train_argv, c->train_argc, i, &skip)) {
            i += skip - 1;
            continue;
        }
        a[n++] = c->train_argv[i];
    }
    if (resume_own)
        a[n++] = "--resume", a[n++] = "auto", a[n++] = "--new-run", a[n++] = "0";
    else if (!c->resume[0] && !c->new_run) /* a job started again continues */
        a[n++] = "--resume", a[n++] = "auto";
    else if (first_start_done(d)) /* its own state first, not disowned (ckpt.h) */
        a[n++] = "--restart-job", a[n++] = d->restart_job;
    if (d->own_metrics) a[n++] = "--metrics", a[n++] = d->metrics_path; /* the dashboard's */
    if (d->peak_cache[0]) a[n++] = "--peak-cache", a[n++] = d->peak_cache;
    if (d->plan.n) { /* the trainer's faults still ahead (the diag:* ones go to diag) */
        sup_faults_format(d, 0, d->faults_through, NULL, d->fault_arg, sizeof d->fault_arg);
        if (d->fault_arg[0]) a[n++] = "--inject-fault", a[n++] = d->fault_arg;
    }
    return a;
}

/* Take over the job an earlier driver started (d->adopt_pid), with its
 * ranks' pids and start times from its state: a rank whose process is gone
 * before it reconnects is a crash (sup_watch), and only a pid that is still
 * the same process is ever signalled. */
static void adopt_job(sup_driver *d) {
    sup_job_adopt(&d->job, d->adopt_pid);
    for (int i = 0; i < d->c->np; i++) {
        d->r[i].pid = d->adopt_pids[i];
        d->r[i].pid_start = d->adopt_starts[i];
        d->r[i].adopted = d->adopt_starts[i] != 0;
        d->r[i].last_beat = d->t_launch; /* nothing heard from it since the takeover */
        snprintf(d->r[i].host, sizeof d->r[i].host, "%s", d->adopt_hosts[i]);
        /* its beats count from the attempt's start: what the earlier driver said, not again
         * (before, each rank's first beat to this driver raised its count from 0 and said
         * every redo and skip of the attempt anew, as the current step's, each a fault) */
        d->r[i].redone = d->redone_adopt, d->r[i].skipped = d->skipped_adopt;
    }
    d->nan_step = d->nan_step_adopt, d->skip_step = d->skip_step_adopt;
    d->straggler_warned = d->straggler_warned_adopt; /* said once an attempt */
    sup_metrics_catch_up(d); /* the steps it trained while no driver watched */
    d->adopt_pid = 0;
}

/* The recovery from the pending fault is over (the job caught up with the
 * step of the fault, or finished): its time, and a recovered event. */
static void book_recovered(sup_driver *d) {
    double rec = ms_now() - d->t_recovery_from;
    if (d->pending_fault >= 0) d->ev.recover_s[d->pending_fault] = rec;
    cJSON *g = cJSON_CreateObject();
    cJSON_AddNumberToObject(g, "step", d->best_step);
    cJSON_AddNumberToObject(g, "recover_s", rec);
    sup_events_put(&d->ev, "recovered", g);
    d->pending_recovery = 0;
}

/* One attempt: launch, watch until it finishes or a fault; 1 if done, 2 if
 * asked to stop, 0 after a fault, -1 (why set) if it could not start. */
static int attempt(sup_driver *d, char *why, size_t n) {
    char np[16];
    snprintf(np, sizeof np, "%d", d->c->np);
    sup_reset_ranks(d);
    sup_nodes_map(d->pool, d->pool->active, d->pool->needed, d->node_map, sizeof d->node_map);
    d->t_launch = ms_now();
    int adopted = d->adopt_pid > 0;
    if (adopted) { /* an earlier driver's job: it goes on, its ranks reconnect */
        /* adopted even when asked to stop already, so that the stop below ends it
         * (before, a stop that came first left it running unwatched, driver.json
         * saying no mpirun, and the next launch started a second job beside it) */
        adopt_job(d);
        d->redone_booked = 1;
        d->ckpt_warned = d->ckpt_warned_adopt; /* said by the driver before */
    } else if (g_stop) {
        return 2; /* asked to stop before this start: none */
    } else {
        d->attempt_no++;
        d->step_before = d->best_step;
        if (d->c->hostfile &&
            sup_nodes_write_hostfile(d->pool, d->pool->active, d->pool->needed, d->pool->per_node,
                                     d->hostfile_path, why, n) != 0)
            return -1;
        char **argv = job_argv(d, np);
        if (!argv) return snprintf(why, n, "out of memory"), -1;
        int rc = sup_job_start(&d->job, argv, d->addr, d->token, d->attempt_no, d->node_map,
                               d->lock_fd, why, n);
        /* mpirun's pid on disk before it runs: a driver killed from here on
         * leaves a job its successor adopts (or, held still, none), never
         * one it does not know of beside the one it starts (before, a kill
         * between the start and the save left such a job, which held the
         * checkpoint directory's lock so that every restart failed) */
        if (rc == 0) sup_state_save(d, 0, 1);
        if (rc == 0) rc = sup_job_release(&d->job, argv[0], why, n);
        free(argv);
        if (rc != 0) return -1;
    }
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "attempt", d->attempt_no);
    cJSON_AddNumberToObject(f, "pid", d->job.pid);
    cJSON_AddStringToObject(f, "nodes", d->node_map);
    if (adopted) cJSON_AddBoolToObject(f, "adopted", 1);
    sup_events_put(&d->ev, "launch", f);
    /* its pids on disk, no longer held: a successor adopts it, not a second one */
    sup_state_save(d, 0, 1);
    d->t_saved = ms_now();
    for (;;) {
        sup_dash_update(d, 0);
        if (ms_now() - d->t_saved > 1.0) { /* the pids and the counters, for a new driver */
            sup_state_save(d, 0, 0);       /* the newest of these is written: never waited for */
            d->t_saved = ms_now();
        }
        /* then the beats: whatever the driver itself was doing, the
         * detectors below see every beat that arrived meanwhile */
        sup_serve(d);
        if (d->pending_recovery && d->best_step > d->step_at_fault) /* caught up */
            book_recovered(d);
        if (!d->redone_booked && d->r[0].started) { /* where this attempt resumed */
            /* after a restart, or a launch again after a stop whose final checkpoint
             * did not commit (killed past --grace): the steps since its commit are
             * redone (before, only a restart's were counted) */
            if (d->attempt_no > 1 && d->step_before > d->r[0].resume_step)
                d->ev.redone += d->step_before - d->r[0].resume_step;
            if (d->start_step < 0) d->start_step = d->r[0].resume_step;
            d->redone_booked = 1;
        }
        if (g_stop) return 2;
        if (sup_job_poll(&d->job)) {
            sup_serve(d); /* the last beats */
            char st[96];
            sup_job_describe(&d->job, st, sizeof st);
            int ok = WIFEXITED(d->job.status) && WEXITSTATUS(d->job.status) == 0;
            if (!d->fault && (d->job.adopted ? adopted_job_finished(d) : ok && all_reached(d))) {
                if (d->job.adopted && latest_commit(d) > d->best_step)
                    d->best_step = latest_commit(d);
                /* a fault at the last step: the restart reached --steps with no
                 * step after it (resumed from that step's snapshot) */
                if (d->pending_recovery) book_recovered(d);
                return 1;
            }
            if (!d->fault && all_reached(d)) {
                /* every rank said "done" (final checkpoint and weights written)
                 * before mpirun failed: a rank killed while exiting, say.  The
                 * job is finished; a restart would only redo nothing. */
                cJSON *g = cJSON_CreateObject();
                cJSON_AddStringToObject(g, "status", st);
                sup_events_put(&d->ev, "mpirun_failed_after_done", g);
                fprintf(stderr,
                        "megascale launch: every rank was done at step %d, then mpirun ended "
                        "(%s); the job is finished\n",
                        d->c->steps, st);
                return 1;
            }
            if (!d->fault && ok &&
                !d->job
                     .adopted) /* a clean end short of --steps: a signal the driver did not send */
                sup_set_fault(d, "stopped", -1, 0,
                              "mpirun ended (%s) at step %d, short of --steps %d: stopped by "
                              "something other than the driver",
                              st, d->best_step, d->c->steps);
            else
                sup_set_fault(d, "exit", -1, 0, "mpirun ended (%s)", st);
            return 0;
        }
        sup_watch(d);
        if (d->fault) return 0;
        if (all_reached(d)) { /* every rank is done: mpirun should follow at once */
            if (d->t_all_done <= 0) d->t_all_done = ms_now();
            if (ms_now() - d->t_all_done > fmax(d->c->grace, 2.0)) {
                cJSON *g = cJSON_CreateObject();
                cJSON_AddNumberToObject(g, "waited_s", ms_now() - d->t_all_done);
                sup_events_put(&d->ev, "mpirun_lingered", g);
                fprintf(stderr,
                        "megascale launch: every rank is done but mpirun has not exited "
                        "after %.1f s; ending it\n",
                        ms_now() - d->t_all_done);
                d->stopping = 1;
                sup_job_stop(&d->job, 0, d->c->grace, NULL, 0, NULL, NULL);
                return 1;
            }
        }
    }
}

/* While a stopping job takes its final checkpoint, its beats still count
 * (a step redone in the grace period is seen). */
static void serve_tick(void *arg) {
    sup_serve(arg);
}

/* Whether the ranks can still take a final checkpoint: asked to stop (no
 * fault), or a fault that leaves every rank running and in step (a
 * straggler, an eviction, a failed commit, a rank that stopped cleanly: the
 * others agree on the same step).  After a crash, a hang or an error the
 * collectives of a checkpoint cannot complete: the ranks are ended at once
 * instead of holding the restart for the grace period. */
static int ranks_can_checkpoint(const sup_driver *d) {
    static const char *const healthy[] = {"straggler", "evicted", "ckpt_commit", "stopped"};
    if (!d->fault) return 1;
    for (size_t i = 0; i < sizeof healthy / sizeof *healthy; i++)
        if (!strcmp(d->kind, healthy[i])) return 1;
    return 0;
}

/* The ranks silent when the dumps are asked for (sup_rank_silence), as
 * [{"rank","host","pid","beat_age_s"}]: a rank stopped on another host
 * writes its dump only once it runs again (the SIGCONT before the stop),
 * and then looks like the ranks that waited for it; only the driver saw it
 * fall silent. */
static cJSON *silent_ranks(const sup_driver *d, double now) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < d->c->np; i++) {
        double age = sup_rank_silence(d, i, now);
        if (age < 0) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "rank", i);
        cJSON_AddStringToObject(x, "host", d->r[i].host);
        cJSON_AddNumberToObject(x, "pid", d->r[i].pid);
        cJSON_AddNumberToObject(x, "beat_age_s", round(age * 10) / 10);
        cJSON_AddItemToArray(a, x);
    }
    return a;
}

/* TRACE_DIR/hang_driver.json (docs/formats.md), beside the dumps (moved to
 * prev/ with them by the next attempt's rank 0): what `trace hang` cannot
 * learn from the dumps.  A failure is said; the dumps are asked for all the
 * same. */
static void write_hang_driver(const sup_driver *d, const char *by, double wall,
                              const cJSON *silent) {
    char path[4300];
    snprintf(path, sizeof path, "%s/hang_driver.json", d->trace_dir);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "hang_driver");
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "by", by);
    cJSON_AddNumberToObject(o, "world", d->c->np);
    cJSON_AddNumberToObject(o, "wall_s", wall);
    cJSON_AddItemToObject(o, "silent", cJSON_Duplicate(silent, 1));
    char *text = cJSON_PrintUnformatted(o);
    ms_status st =
        text ? ms_mkdirs(d->trace_dir) : ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    if (st == MS_OK) st = ms_file_write_atomic(path, text, strlen(text));
    if (st != MS_OK)
        fprintf(stderr, "megascale launch: %s (trace hang will not know the silent ranks)\n",
                ms_errmsg());
    free(text);
    cJSON_Delete(o);
}

/* Every rank's communication thread writes its hang dump (the ops it waits
 * in): before a hung job is stopped, so that `megascale trace hang` reads a
 * supervised hang as it reads a collective's timeout (the beats find a hang
 * long before --comm-timeout, and the stop kills the ranks without one),
 * and when asked on the control socket (`--ctl RUN_DIR dump`).  SIGUSR2 to
 * mpirun, which forwards it to every rank on every host, and to the ranks
 * here; then, serving the beats, until every rank that beats with tracing
 * on says it answered (its beats' "dumps" grew), at most 3 s.  A stopped or
 * stuck process does not answer: it is not waited for once its beats are
 * 2 s old.  Returns the ranks that answered, *asked those asked (0: no
 * job, or no rank traces). */
int sup_hang_dumps(sup_driver *d, const char *by, int *asked) {
    int np = d->c->np, *before = calloc((size_t)np, sizeof *before), answered = 0;
    *asked = 0;
    for (int i = 0; before && i < np; i++)
        before[i] = d->r[i].dumps, *asked += d->r[i].dumps >= 0 && !d->r[i].done;
    if (!before || !*asked || !d->job.pid || d->job.exited) {
        free(before);
        *asked = 0;
        return 0;
    }
    cJSON *silent = silent_ranks(d, ms_now());
    if (d->trace_dir[0]) write_hang_driver(d, by, ms_wall_now(), silent);
    kill(d->job.pid, SIGUSR2);
    for (int i = 0; i < np; i++) { /* only a pid still the rank it was (reused) */
        pid_t p = sup_pid_same(d->r[i].pid, d->r[i].pid_start);
        if (p > 0) kill(p, SIGUSR2);
    }
    double t0 = ms_now();
    for (int waiting = *asked; waiting && ms_now() - t0 < 3.0;) {
        sup_serve_for(d, 50);
        waiting = 0;
        for (int i = 0; i < np; i++)
            waiting += before[i] >= 0 && d->r[i].dumps <= before[i] && !d->r[i].done &&
                       ms_now() - d->r[i].last_beat < 2.0;
    }
    for (int i = 0; i < np; i++)
        answered += before[i] >= 0 && d->r[i].dumps > before[i];
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "by", by);
    cJSON_AddNumberToObject(f, "ranks", answered);
    cJSON_AddNumberToObject(f, "asked", *asked);
    cJSON_AddStringToObject(f, "trace_dir", d->trace_dir);
    cJSON_AddNumberToObject(f, "wait_s", ms_now() - t0);
    cJSON_AddItemToObject(f, "silent", silent);
    sup_events_put(&d->ev, "hang_dumps", f);
    free(before);
    return answered;
}

/* Stop the attempt and book the fault for the summary. */
static void stop_attempt(sup_driver *d) {
    d->stopping = 1; /* the ranks' "stopped" beats from here on are the driver's doing */
    int *pids = calloc((size_t)d->c->np, sizeof *pids);
    for (int i = 0; pids && i < d->c->np; i++) /* only a pid still the rank it was (reused) */
        pids[i] = sup_pid_same(d->r[i].pid, d->r[i].pid_start);
    if (d->fault && !strcmp(d->kind, "hang")) {
        double t0 = ms_now();
        int asked, n = sup_hang_dumps(d, "hang", &asked);
        /* the next start's rank 0 moves them to prev/: where they are when the user looks */
        int moved = !d->fault_final && !g_stop;
        if (asked)
            fprintf(stderr,
                    "megascale launch: hang dumps: %d of %d rank(s) wrote theirs in %.1f s "
                    "(%smegascale trace hang %s%s)\n",
                    n, asked, ms_now() - t0, moved ? "after the restart: " : "", d->trace_dir,
                    moved ? "/prev" : "");
    }
    double took = sup_job_stop(&d->job, ranks_can_checkpoint(d), d->c->grace, pids,
                               pids ? d->c->np : 0, serve_tick, d);
    free(pids);
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "stop_s", took);
    static const char *const how[4] = {"stop_request", "sigterm", "sigkill", "had_exited"};
    cJSON_AddStringToObject(f, "ended_by", how[d->job.escalation]);
    char st[96];
    sup_job_describe(&d->job, st, sizeof st);
    /* no job: it ended before this driver (taken over from a state whose job was gone);
     * before, "still running" beside ended_by "had_exited" */
    cJSON_AddStringToObject(f, "mpirun",
                            !d->job.pid     ? "none (it had ended before this driver started)"
                            : d->job.exited ? st
                                            : "still running");
    if (d->job.swept_segments || d->job.swept_session) {
        cJSON_AddNumberToObject(f, "shm_segments_removed", d->job.swept_segments);
        cJSON_AddNumberToObject(f, "shm_mb_removed", d->job.swept_mb);
        cJSON_AddBoolToObject(f, "session_dir_removed", d->job.swept_session);
        fprintf(stderr,
                "megascale launch: removed what killed Open MPI jobs left on this host: "
                "%d shared-memory segment(s) (%.1f MB)%s\n",
                d->job.swept_segments, d->job.swept_mb,
                d->job.swept_session ? " and mpirun's session directory" : "");
    }
    sup_events_put(&d->ev, "job_stopped", f);
}

static void book_fault(sup_driver *d) {
    sup_events *e = &d->ev;
    d->pending_fault = -1;
    if (e->n_faults < SUP_MAX_FAULTS) {
        d->pending_fault = e->n_faults++;
        snprintf(e->kinds[d->pending_fault], sizeof e->kinds[0], "%s", d->kind);
        e->detect_s[d->pending_fault] = d->t_detect - d->t_stall;
        e->recover_s[d->pending_fault] = NAN;
    }
    d->fault_booked = 1;
    /* the steps rank 0 logged that no beat told (a rank killed while a successor took the
     * job over: its kill@10 was booked at step 8 and handed out again) */
    int logged = sup_metrics_step(d);
    if (logged > d->best_step) d->best_step = logged;
    /* an injected fault fires at the start of its step: the one that did
     * is at most the step after the last one done */
    d->faults_through = d->best_step + 1;
    d->t_recovery_from = d->t_detect;
    d->pending_recovery = 1;
}

/* After the stop: the ranks may have gone on a few steps in the grace
 * period (a SIGTERM'd job finishes its step and takes a final checkpoint;
 * no injected fault fires once it is stopping), so where the job stands,
 * and the faults it has passed, are known only now. */
static void book_stop(sup_driver *d) {
    d->step_at_fault = d->best_step;
    if (d->best_step > d->faults_through) d->faults_through = d->best_step;
}

/* Median and worst of the finite values of v[0..n). */
static void stats(const double *v, int n, double *med, double *worst) {
    double *t = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    int m = 0;
    for (int i = 0; t && i < n; i++)
        if (isfinite(v[i])) t[m++] = v[i];
    if (t && m) qsort(t, (size_t)m, sizeof *t, sup_cmp_double);
    *med = t && m ? t[m / 2] : NAN;
    *worst = t && m ? t[m - 1] : NAN;
    free(t);
}

/* The bottom line: faults by kind, detection and recovery times, steps
 * redone, effective training time ratio; printed and in the events. */
/* The steps made (past where the job started) at the mean step time, over
 * the wall time since the job started. */
double sup_ettr(const sup_driver *d) {
    double wall = ms_wall_now() - d->ev.t0;
    double step_s = d->step_ms_n ? d->step_ms_sum / (double)d->step_ms_n / 1e3 : 0;
    int from = d->start_step > 0 ? d->start_step : 0;
    double r = wall > 0 ? (double)(d->best_step - from) * step_s / wall : 0;
    return r < 1 ? r : 1; /* a ratio of the wall time: a mean inflated by a slow step is not more */
}

static void summary(sup_driver *d, const char *outcome) {
    sup_events *e = &d->ev;
    int n = e->n_faults < SUP_MAX_FAULTS ? e->n_faults : SUP_MAX_FAULTS;
    double wall = ms_wall_now() - e->t0, dmed, dmax, rmed, rmax;
    double ettr = sup_ettr(d);
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
    long dropped = d->heat.w ? sup_writer_dropped(d->heat.w, d->heat.wk) : 0;
    if (dropped) { /* the disk was too slow for them (SUP_HEAT_QUEUE) */
        cJSON_AddNumberToObject(f, "compute_rows_dropped", (double)dropped);
        fprintf(stderr,
                "megascale launch: warning: %ld row(s) of compute.jsonl dropped: the disk under "
                "the run directory was too slow for them\n",
                dropped);
    }
    sup_events_put(e, "summary", f);
    /* a time no fault has (none recovered: the job gave up or was stopped) reads "none" */
    char t[4][32];
    const double tv[4] = {dmed, dmax, rmed, rmax};
    for (int i = 0; i < 4; i++)
        if (n && isfinite(tv[i]))
            snprintf(t[i], sizeof t[i], i < 2 ? "%.2f s" : "%.1f s", tv[i]);
        else
            snprintf(t[i], sizeof t[i], "%s", n ? "none" : i < 2 ? "0.00 s" : "0.0 s");
    fprintf(stderr,
            "megascale launch: %s after %.1f s: %d step(s), %d fault(s) %s, %d restart(s), %d "
            "step(s) redone; detection p50 %s / worst %s, recovery p50 %s / worst %s; effective "
            "training time %.1f%%\n",
            outcome, wall, d->best_step, n, ktext ? ktext : "{}", d->restarts, e->redone, t[0],
            t[1], t[2], t[3], 100 * ettr);
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

/* Did the job refuse its options: a rank's usage error (cli_exit_code 2:
 * options that contradict each other or the layout, such as a world size
 * that --tp x --pp does not divide), said in its last beat or by mpirun's
 * exit code?  No restart or diag can change that.  (The beat often comes
 * first: the driver stops the job before mpirun can exit 2 itself.) */
int sup_refused_options(const sup_driver *d) {
    const sup_job *j = &d->job;
    return d->fault_usage ||
           (j->exited && !j->adopted && WIFEXITED(j->status) && WEXITSTATUS(j->status) == 2);
}

int sup_policy_verdict(const sup_driver *d, int prev_best, int *no_progress) {
    /* the progress the attempt made up to its fault (a beat of a later step
     * that comes in while the job stops does not change the verdict that
     * the fault's event announced) */
    int best = d->fault ? d->fault_best : d->best_step;
    /* restarts in a row: the job's first attempt is none (one that failed at once counted,
     * and --no-progress-restarts 3 gave up after 2 restarts, saying 3) */
    *no_progress = best > prev_best ? 0 : d->no_progress + (d->restarts > 0);
    if (*no_progress >= d->c->no_progress_limit) return SUP_EXIT_NO_PROGRESS;
    return d->restarts >= d->c->max_restarts ? SUP_EXIT_GAVE_UP : 0;
}

/* The restart policy after a fault: 0 to go on, else the exit code. */
static int policy(sup_driver *d, int prev_best) {
    /* kept only once the restart is made: a driver stopped in the back-off
     * leaves the fault to the next launch's policy, which counts it then */
    int no_progress, verdict = sup_policy_verdict(d, prev_best, &no_progress);
    if (verdict == SUP_EXIT_NO_PROGRESS) {
        d->no_progress = no_progress;
        fprintf(stderr,
                "megascale launch: giving up: %d restart(s) in a row made no progress "
                "past step %d (do not requeue this job: the same fault comes back)\n",
                d->no_progress, d->best_step);
        return SUP_EXIT_NO_PROGRESS;
    }
    if (verdict == SUP_EXIT_GAVE_UP) {
        fprintf(stderr,
                "megascale launch: giving up: the restart budget (--max-restarts %d) is "
                "spent\n",
                d->c->max_restarts);
        return SUP_EXIT_GAVE_UP;
    }
    /* doubled for each restart in a row that reached no new step (a fault
     * that comes back), back to --backoff once a restart made progress */
    double wait = d->c->backoff * (double)(1 << (no_progress < 5 ? no_progress : 5));
    if (wait > 30) wait = 30;
    /* a stop ends the wait; the control socket is answered meanwhile */
    for (double t0 = ms_now(), left; !g_stop && (left = wait - (ms_now() - t0)) > 0;)
        sup_serve_for(d, left < 0.02 ? (int)(left * 1e3) : 20);
    if (g_stop) return SUP_EXIT_STOPPED;
    d->no_progress = no_progress;
    d->restarts++;
    d->recovering = 0;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "restart", d->restarts);
    cJSON_AddNumberToObject(f, "after_s", wait);
    sup_events_put(&d->ev, "restart", f);
    return 0;
}

static void finish(sup_driver *d, const char *outcome, int code) {
    sup_heatlog_flush(&d->heat);
    summary(d, outcome);
    if (code == SUP_EXIT_DONE) {
        sup_events_put(&d->ev, "job_done", NULL);
    } else if (code != SUP_EXIT_STOPPED) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "exit", code);
        cJSON_AddStringToObject(f, "outcome", outcome);
        sup_events_put(&d->ev, "job_failed", f);
    }
    /* a stopped job resumes on the next launch.  Waited for (answering the
     * control socket meanwhile): then the events and rows queued before it
     * are on disk too, and the writer has little left to do at exit */
    sup_state_save(d, code != SUP_EXIT_STOPPED, 1);
}

/* After a stopped attempt: diag, evictions, the restart policy and its
 * back-off; 0 to start again, else the exit code (the job finished). */
static int recover_and_wait(sup_driver *d, int prev_best) {
    /* a SIGTERM/SIGINT/SIGHUP meanwhile ends the job here: no diag, no new start */
    int code = g_stop ? SUP_EXIT_STOPPED : sup_recover(d);
    if (!code) code = g_stop ? SUP_EXIT_STOPPED : policy(d, prev_best);
    if (code)
        finish(d,
               code == SUP_EXIT_STOPPED       ? "stopped"
               : code == SUP_EXIT_NO_PROGRESS ? "no progress"
               : code == SUP_EXIT_NO_NODES    ? "no nodes"
               : code == SUP_EXIT_STORAGE     ? "storage"
                                              : "gave up",
               code);
    return code;
}

/* After the attempt's fault (booked, and in the state): stop the job, then
 * diag, evictions, the restart policy and its back-off; 0 to start again,
 * else the exit code (the job finished).  prev_best: the best step when
 * the attempt started. */
static int after_fault(sup_driver *d, int prev_best) {
    sup_dash_update(d, 1); /* the culprit, before the stop takes its time */
    stop_attempt(d);
    sup_heatlog_flush(&d->heat);
    book_stop(d);
    d->recovering = 1, d->recover_prev_best = prev_best;
    sup_state_save(d, 0, 1); /* killed from here to the restart: the successor recovers */
    if (!g_stop && sup_refused_options(d) && d->options_ok) /* the same options trained before */
        fprintf(stderr,
                "megascale launch: the job refused its options on this start, with which an "
                "earlier start trained: taken for a fault of a node's environment (a lost "
                "mount, a file missing on one host), not of the options; diagnosing and "
                "restarting\n");
    else if (!g_stop && sup_refused_options(d)) {
        fprintf(stderr,
                "megascale launch: error: the job refused its options (%s, a usage error: the "
                "ranks' error above names the option); a restart would be refused the same way\n",
                d->fault_usage ? "a rank's last heartbeat" : "mpirun's exit code 2");
        finish(d, "usage", SUP_EXIT_USAGE);
        return SUP_EXIT_USAGE;
    }
    return recover_and_wait(d, prev_best);
}

static int run_loop(sup_driver *d) {
    char why[512] = "";
    int code = 0;
    if (d->adopt_pid || d->lost_pid) { /* the steps made while no driver watched */
        int m = sup_metrics_step(d);
        if (m > d->best_step) d->best_step = m;
    }
    int last = d->lost_pid ? latest_commit(d) : -1;
    if (d->lost_pid && last >= d->c->steps) { /* it finished: nothing to start again */
        fprintf(stderr,
                "megascale launch: the job (mpirun pid %d) ended while no driver watched it, "
                "having committed its last step (%d of %d): done\n",
                (int)d->lost_pid, last, d->c->steps);
        finish(d, "done", SUP_EXIT_DONE);
        return SUP_EXIT_DONE;
    }
    if (d->lost_pid && last >= 0 && stopped_step(d) == last) {
        /* stopped (SIGUSR1 to its mpirun, as to change its options) after
         * its final checkpoint: no fault, the restart below continues it */
        fprintf(stderr,
                "megascale launch: the job (mpirun pid %d) was stopped while no driver watched "
                "it, after its final checkpoint (step %d of %d): starting it again\n",
                (int)d->lost_pid, last, d->c->steps);
    } else if (d->lost_pid && last < d->c->steps) { /* short of its final checkpoint */
        char committed[64];
        if (last >= 0)
            snprintf(committed, sizeof committed, "step %d of %d committed", last, d->c->steps);
        else
            snprintf(committed, sizeof committed, "no step committed yet");
        sup_set_fault(d, "exit", -1, 0,
                      "the job (mpirun pid %d) ended while no driver watched it, before its "
                      "final checkpoint (%s): its ranks' last beats are lost",
                      (int)d->lost_pid, committed);
    }
    if (d->fault && !d->recovering) {
        /* taken over from a driver that died after a fault was seen (an
         * eviction once it was accepted), before the job had stopped, or
         * whose job then ended unwatched: this one stops it, taken over if
         * it still runs, and recovers (the fault counted once, the node
         * evicted, the restart counted) */
        if (d->adopt_pid) adopt_job(d);
        if (!d->fault_booked) book_fault(d);
        sup_state_save(d, 0, 1);
        code = after_fault(d, d->recover_prev_best);
    } else if (d->recovering) {
        /* taken over from a driver that died between a fault's stop and the
         * restart: this one recovers as that one would have (the restart is
         * counted, the policy and the back-off apply) */
        code = recover_and_wait(d, d->recover_prev_best);
    } else if (d->c->preflight && !d->adopt_pid && !g_stop) {
        if ((code = sup_preflight(d)) != 0) finish(d, "storage", code);
    }
    if (code) return code;
    if (g_stop && !d->adopt_pid) { /* a signal during the set-up: no job to start, or to stop */
        fprintf(stderr, "megascale launch: stopped (signal %d) before the job started\n",
                (int)g_stop);
        finish(d, "stopped", SUP_EXIT_STOPPED);
        return SUP_EXIT_STOPPED;
    }
    for (;;) {
        /* an attempt taken over keeps the best step its start had (saved) */
        int prev_best = d->adopt_pid ? d->recover_prev_best : d->best_step;
        d->recover_prev_best = prev_best;
        if (sup_nodes_choose(d->pool) != 0) {
            fprintf(stderr,
                    "megascale launch: error: %d healthy node(s) for a job of %d (see %s)\n",
                    sup_nodes_usable(d->pool), d->pool->needed, d->pool->blocklist_path);
            finish(d, "no nodes", SUP_EXIT_NO_NODES);
            return SUP_EXIT_NO_NODES;
        }
        int r = attempt(d, why, sizeof why);
        if (r < 0) {
            fprintf(stderr, "megascale launch: error: %s\n", why);
            stop_attempt(d);
            return SUP_EXIT_ERROR;
        }
        if (r == 1) {
            finish(d, "done", SUP_EXIT_DONE);
            return SUP_EXIT_DONE;
        }
        if (r == 2) { /* asked to stop: the ranks take a final checkpoint (SIGUSR1) */
            stop_attempt(d);
            /* a fault seen just before the stop, or while the job stopped (a rank killed
             * then): in this summary, and once only (the state says it is booked; the next
             * launch recovers from it).  Before, the summary said 0 faults */
            if (d->fault && !d->fault_booked) book_fault(d);
            finish(d, "stopped", SUP_EXIT_STOPPED);
            return SUP_EXIT_STOPPED;
        }
        book_fault(d);
        /* the fault, and the injected faults it has passed, in the state at
         * once: a driver killed from here until the next start is taken over
         * by one that neither forgets the fault nor hands it out again */
        sup_state_save(d, 0, 1);
        code = after_fault(d, prev_best);
        if (code) return code;
    }
}

/* The run directory's lock: one driver at a time. */
static int lock_run_dir(sup_driver *d, char *why, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/driver.lock", d->c->run_dir);
    d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d->lock_fd < 0) return snprintf(why, n, "%s: %s", path, strerror(errno)), -1;
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB) != 0)
        return snprintf(why, n,
                        "another driver runs with --run-dir %s (%s is locked); use "
                        "`megascale launch --ctl %s status`",
                        d->c->run_dir, path, d->c->run_dir),
               -1;
    return 0;
}

/* The heartbeat socket: the earlier driver's address when its job is taken
 * over (its ranks reconnect there), else a new port. */
static int open_sockets(sup_driver *d, char *why, size_t n) {
    const char *bind_addr = d->c->bind ? d->c->bind : "127.0.0.1";
    if (d->adopt_pid) {
        const char *colon = strrchr(d->addr, ':');
        int port = colon ? atoi(colon + 1) : 0;
        char host[64];
        snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - d->addr) : 0, d->addr);
        for (int k = 0; k < 50 && d->lfd < 0; k++) { /* the old socket may linger a moment */
            if (sup_listen(host, port, &d->lfd, d->addr, sizeof d->addr, why, n) != 0)
                usleep(100000);
        }
        if (d->lfd < 0) { /* cannot take it over: stop it, restart from its checkpoint */
            fprintf(stderr,
                    "megascale launch: cannot listen where the job beats (%s); stopping "
                    "it and restarting from its newest checkpoint\n",
                    why);
            sup_job_adopt(&d->job, d->adopt_pid);
            for (int i = 0; i < d->c->np; i++) /* only the ranks still the same processes */
                d->adopt_pids[i] = sup_pid_same(d->adopt_pids[i], d->adopt_starts[i]);
            sup_job_stop(&d->job, 1, d->c->grace, d->adopt_pids, d->c->np, NULL, NULL);
            memset(&d->job, 0, sizeof d->job);
            d->adopt_pid = 0;
            if (sup_make_token(d->token) != 0) return snprintf(why, n, "no random token"), -1;
        }
    }
    if (d->lfd < 0 && sup_listen(bind_addr, 0, &d->lfd, d->addr, sizeof d->addr, why, n) != 0)
        return -1;
    /* the control socket is the operator's, on this host: loopback whatever
     * --bind says, and a token of its own (the ranks hold the heartbeat's) */
    if (sup_make_token(d->ctl_token) != 0) return snprintf(why, n, "no random token"), -1;
    if (sup_listen("127.0.0.1", 0, &d->ctl_fd, d->ctl_addr, sizeof d->ctl_addr, why, n) != 0)
        return -1;
    return sup_ctl_write(d->c->run_dir, d->ctl_addr, d->ctl_token, why, n);
}

/* path made absolute against the working directory, into out. */
static void absolute(char *out, size_t n, const char *path) {
    char cwd[4096];
    if (path[0] != '/' && getcwd(cwd, sizeof cwd))
        snprintf(out, n, "%s/%s", cwd, path);
    else
        snprintf(out, n, "%s", path);
}

/* The job's metrics file (the train option's effective value, sup_config:
 * the command line, its --config files or an --out-dir; else
 * RUN_DIR/metrics.jsonl, which the driver then adds), absolute: the
 * dashboard reads it from anywhere. */
static void set_metrics_path(sup_driver *d) {
    const char *m = d->c->metrics;
    char rel[4200];
    d->own_metrics = !m || !*m;
    if (d->own_metrics)
        snprintf(rel, sizeof rel, "%s/metrics.jsonl", d->c->run_dir);
    else
        snprintf(rel, sizeof rel, "%s", m);
    absolute(d->metrics_path, sizeof d->metrics_path, rel);
}

/* The ranks' trace directory, as the trainer resolves it
 * (train_trace_dir): --trace-dir's effective value, "" for none or off;
 * else "trace" beside the metrics. */
static void set_trace_dir(sup_driver *d) {
    const char *t = d->c->trace_dir;
    d->trace_dir[0] = 0;
    if (t && (!strcmp(t, "none") || !strcmp(t, "off"))) return;
    if (t && *t) {
        absolute(d->trace_dir, sizeof d->trace_dir, t);
        return;
    }
    const char *slash = strrchr(d->metrics_path, '/'); /* absolute: there is one */
    snprintf(d->trace_dir, sizeof d->trace_dir, "%.*s/trace",
             slash ? (int)(slash - d->metrics_path) : 1, slash ? d->metrics_path : ".");
}

/* The ranks' peak cache (monitor/peakcache.h): the run dir, absolute, so
 * that a restart reads the peak the first start probed instead of probing
 * again on every rank; unless the train options name their own (or none). */
static void set_peak_cache(sup_driver *d) {
    d->peak_cache[0] = 0;
    if (!d->c->peak_cache_given) absolute(d->peak_cache, sizeof d->peak_cache, d->c->run_dir);
}

/* RUN_DIR/compute.jsonl, and the dashboard with --dashboard: its URL
 * printed and in RUN_DIR/dashboard.json (mode 0600: it holds the token). */
static int open_dashboard(sup_driver *d, char *why, size_t n) {
    const sup_config *c = d->c;
    char path[4200];
    snprintf(path, sizeof path, "%s/compute.jsonl", c->run_dir);
    if (sup_heatlog_open(&d->heat, d->writer, path, c->np, c->compute_log_max_bytes, why, n) != 0)
        return -1;
    if (c->dashboard_port < 0) return 0;
    d->dash_ranks = calloc((size_t)c->np, sizeof *d->dash_ranks);
    if (!d->dash_ranks) return snprintf(why, n, "out of memory"), -1;
    sup_dash_config dc = {c->run_dir, c->dashboard_bind, c->dashboard_port, 1, c->events};
    if (sup_dash_start(&d->dash, &dc, why, n) != 0) return -1;
    char text[512];
    snprintf(path, sizeof path, "%s/dashboard.json", c->run_dir);
    snprintf(text, sizeof text, "{\"v\": 1, \"url\": \"%s\", \"token\": \"%s\", \"pid\": %d}\n",
             sup_dash_url(d->dash), sup_dash_token(d->dash), (int)getpid());
    if (sup_file_private(path, text, why, n) != 0) return -1;
    fprintf(stderr, "megascale launch: dashboard: %s\n", sup_dash_url(d->dash));
    return 0;
}

static int check_config(const sup_config *c) {
    if (c->np < 1 || !c->run_dir || !*c->run_dir) {
        fprintf(stderr, "megascale launch: error: --np and --run-dir are required\n");
        return SUP_EXIT_USAGE;
    }
    if (c->faults && *c->faults && has_opt(c, "--inject-fault")) {
        fprintf(stderr, "megascale launch: error: --faults and the train option --inject-fault "
                        "exclude each other (the driver hands out --faults)\n");
        return SUP_EXIT_USAGE;
    }
    if (has_opt(c, "--node-map")) {
        fprintf(stderr, "megascale launch: error: the driver sets --node-map (MS_NODE_MAP) "
                        "itself; drop it from the train options\n");
        return SUP_EXIT_USAGE;
    }
    if (!c->ckpt_dir || !*c->ckpt_dir) {
        fprintf(stderr, "megascale launch: error: the train options need --ckpt-dir (or "
                        "--out-dir), on the command line or in their --config file: the driver "
                        "restarts the job from its checkpoints\n");
        return SUP_EXIT_USAGE;
    }
    if (!(c->hb_timeout >= 2) || !(c->progress_factor >= 1) || !(c->startup_timeout >= 1) ||
        !(c->grace >= 0) || !(c->backoff >= 0 && c->backoff <= 30) || c->max_restarts < 0 ||
        c->no_progress_limit < 1 || c->steps < 1) {
        fprintf(stderr, "megascale launch: error: --heartbeat-timeout must be >= 2, "
                        "--progress-factor >= 1, --startup-timeout >= 1, --grace >= 0, --backoff "
                        "in [0, 30], --max-restarts >= 0, --no-progress-restarts >= 1\n");
        return SUP_EXIT_USAGE;
    }
    if (c->straggler_rounds < 0 || !(c->straggler_score > 0 && c->straggler_score <= 1) ||
        !(c->loss_spike_z >= 0) || !(c->diag_timeout > 0) || !(c->diag_slow_factor >= 0) ||
        c->ckpt_fail_limit < 1) {
        fprintf(stderr, "megascale launch: error: --straggler-score must be in (0, 1], "
                        "--straggler-rounds, --loss-spike-z and --diag-slow-factor >= 0, "
                        "--diag-timeout > 0, --ckpt-fail-limit >= 1\n");
        return SUP_EXIT_USAGE;
    }
    if (c->preflight && !c->diag) {
        fprintf(stderr, "megascale launch: error: --preflight 1 runs the self-test, which "
                        "--diag 0 turns off: give one of them\n");
        return SUP_EXIT_USAGE;
    }
    return 0;
}

/* 1 (why said) when an entry of the fault plan targets a rank outside the
 * job, a node outside the pool, step 0, a step past --steps, or a checkpoint point at a step
 * no checkpoint is taken at: it could never fire. */
static int plan_unreachable(const sup_driver *d, char *why, size_t n) {
    for (int i = 0; i < d->plan.n; i++) {
        const ms_fault *f = &d->plan.f[i];
        int known = !f->node[0];
        for (int k = 0; !known && k < d->pool->n; k++)
            known = !strcmp(d->pool->name[k], f->node);
        if (f->rank >= d->c->np)
            return snprintf(why, n, "%s (entry %d): rank %d is not one of the job's %d ranks",
                            f->kind, i + 1, f->rank, d->c->np),
                   1;
        if (!known)
            return snprintf(why, n, "%s (entry %d): node %s is not in the job's pool (%s%s)",
                            f->kind, i + 1, f->node, d->pool->name[0],
                            d->pool->n > 1 ? ", ..." : ""),
                   1;
        if (f->step == 0)
            return snprintf(why, n, "%s (entry %d): step 0: steps count from 1", f->kind, i + 1), 1;
        /* without a step a checkpoint point fires at the first checkpoint of every start: it
         * was handed to each, and one point killed every start until --max-restarts */
        if (f->step < 0 && ms_fault_is_ckpt(f->kind))
            return snprintf(why, n,
                            "%s (entry %d): a checkpoint point needs @STEP under launch, the "
                            "step of the checkpoint it hits (without one it fires at the first "
                            "checkpoint of every start of the job)",
                            f->kind, i + 1),
                   1;
        /* a checkpoint point at a step no checkpoint is taken at (before, accepted, counted in
         * faults_planned, and never fired: a test that tested nothing) */
        const sup_config *c = d->c;
        int ckpt_step = f->step > 0 && ms_fault_is_ckpt(f->kind) && !f->from &&
                        f->step <= c->steps && c->ckpt_every_min <= 0;
        if (ckpt_step && f->step != c->steps && (c->ckpt_every <= 0 || f->step % c->ckpt_every))
            return snprintf(why, n,
                            "%s (entry %d): no checkpoint is taken at step %d (--ckpt-every %d "
                            "and the final one at --steps %d): it would never fire",
                            f->kind, i + 1, f->step, c->ckpt_every, c->steps),
                   1;
        if (d->c->steps > 0 && f->step > d->c->steps)
            return snprintf(why, n,
                            "%s (entry %d): step %d is past --steps %d: it would never fire%s",
                            f->kind, i + 1, f->step, d->c->steps,
                            d->c->faults && strstr(d->c->faults, "random=")
                                ? " (random=SEED/N/MAXSTEP/WORLD: MAXSTEP at most --steps)"
                                : ""),
                   1;
    }
    return 0;
}

int sup_run(const sup_config *c) {
    int code = check_config(c);
    if (code) return code;
    /* before anything is set up: a signal during the set-up (the lock, the state, a job taken
     * over) is seen by the loop, which stops the job; it killed the driver (exit 143), leaving
     * a taken-over job unwatched and a state file's temporary behind */
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* a closed terminal: stop the job, do not orphan it */
    signal(SIGPIPE, SIG_IGN);
    sup_driver *d = calloc(1, sizeof *d); /* large (the fault plan, the pool): not on the stack */
    if (d) d->pool = calloc(1, sizeof *d->pool);
    if (!d || !d->pool) {
        fprintf(stderr, "megascale launch: error: out of memory\n");
        if (d) free(d);
        return SUP_EXIT_ERROR;
    }
    d->c = c;
    d->stop_flag = &g_stop;
    d->lfd = d->ctl_fd = d->lock_fd = -1;
    d->fault_rank = d->fault_reporter = -1;
    d->evict_node = -1;
    d->ckpt_fault = d->pending_fault = -1;
    d->start_step = -1; /* where the job's first training start resumed: not known yet */
    char why[4400] = "", events[4200];
    code = SUP_EXIT_USAGE;
    if (!(d->writer = sup_writer_start(why, sizeof why))) {
        fprintf(stderr, "megascale launch: error: %s\n", why);
        free(d->pool);
        free(d);
        return SUP_EXIT_ERROR;
    }
    if (ms_fault_parse(&d->plan, c->faults, "--faults") != MS_OK) {
        fprintf(stderr, "megascale launch: error: %s\n", ms_errmsg());
        goto out;
    }
    if (sup_nodes_init(d->pool, c, why, sizeof why) != 0 ||
        sup_nodes_reachable(d->pool, c, c->bind ? c->bind : "127.0.0.1", why, sizeof why) != 0) {
        fprintf(stderr, "megascale launch: error: %s\n", why);
        goto out;
    }
    if (plan_unreachable(d, why, sizeof why)) { /* it would never fire: a test that tests nothing */
        fprintf(stderr, "megascale launch: error: --faults %s\n", why);
        goto out;
    }
    code = SUP_EXIT_ERROR;
    if (ms_mkdirs(c->run_dir) != MS_OK) {
        fprintf(stderr, "megascale launch: error: %s\n", ms_errmsg());
        goto out;
    }
    snprintf(events, sizeof events, "%s/events.jsonl", c->run_dir);
    snprintf(d->state_path, sizeof d->state_path, "%s/driver.json", c->run_dir);
    snprintf(d->hostfile_path, sizeof d->hostfile_path, "%s/hostfile.active", c->run_dir);
    snprintf(d->diag_dir, sizeof d->diag_dir, "%s/diag", c->run_dir);
    set_metrics_path(d);
    set_trace_dir(d);
    set_peak_cache(d);
    snprintf(d->ckpt_dir, sizeof d->ckpt_dir, "%s", c->ckpt_dir); /* command line or --config */
    /* diag checks the device the job uses */
    snprintf(d->device, sizeof d->device, "%s",
             c->device && !strcmp(c->device, "cuda") ? "cuda" : "");
    d->r = calloc((size_t)c->np, sizeof *d->r);
    d->adopt_pids = calloc((size_t)c->np, sizeof *d->adopt_pids);
    d->adopt_starts = calloc((size_t)c->np, sizeof *d->adopt_starts);
    d->adopt_hosts = calloc((size_t)c->np, sizeof *d->adopt_hosts);
    d->conns = calloc((size_t)4 * c->np + 16, sizeof *d->conns);
    if (!d->r || !d->adopt_pids || !d->adopt_starts || !d->adopt_hosts || !d->conns ||
        sup_make_token(d->token) != 0 || sup_straggler_init(&d->strag, c->np) != 0) {
        fprintf(stderr, "megascale launch: error: out of memory or no random token\n");
        goto out;
    }
    int resume = 0; /* -2: the options are not those of the job to take over (usage) */
    if (lock_run_dir(d, why, sizeof why) != 0 ||
        sup_events_open(&d->ev, d->writer, c->events ? c->events : events, why, sizeof why) != 0 ||
        sup_nodes_load_blocklist(d->pool, why, sizeof why) != 0 ||
        (resume = sup_state_resume(d, why, sizeof why)) != 0 ||
        open_sockets(d, why, sizeof why) != 0) {
        fprintf(stderr, "megascale launch: error: %s\n", why);
        if (resume == -2) code = SUP_EXIT_USAGE;
        goto out;
    }
    /* what the job's first start finds (a resumed driver's state says; a requeue's is its
     * ended job's) */
    if (!d->resumed && !d->requeued) {
        latest_id(d, d->latest0, sizeof d->latest0);
        ckpt_text(d, "job", d->job0, sizeof d->job0);
    }
    if (open_dashboard(d, why, sizeof why) != 0) {
        fprintf(stderr, "megascale launch: error: %s\n", why);
        goto out;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* ranks that lose mpirun become ours to reap */
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "np", c->np);
    cJSON_AddNumberToObject(f, "nodes", d->pool->needed);
    cJSON_AddNumberToObject(f, "spares", d->pool->n - d->pool->needed);
    cJSON_AddStringToObject(f, "heartbeat", d->addr);
    cJSON_AddStringToObject(f, "control", d->ctl_addr);
    cJSON_AddNumberToObject(f, "pid", getpid());
    if (d->plan.n) cJSON_AddNumberToObject(f, "faults_planned", d->plan.n);
    char pool[sizeof d->node_map];
    sup_nodes_pool(d->pool, pool, sizeof pool);
    cJSON_AddStringToObject(f, "pool", pool);
    cJSON_AddStringToObject(f, "metrics", d->metrics_path);
    if (d->own_metrics) cJSON_AddBoolToObject(f, "own_metrics", 1); /* RUN_DIR's: a copy's too */
    cJSON_AddNumberToObject(f, "straggler_score", c->straggler_score);
    if (d->dash) cJSON_AddStringToObject(f, "dashboard", sup_dash_addr(d->dash)); /* no token */
    sup_events_put(&d->ev, "job_start", f);
    /* the spares left: a node on the blocklist (evicted by an earlier job) is none */
    int usable = sup_nodes_usable(d->pool), blocked = d->pool->n - usable;
    char held[4300] = "";
    if (blocked > 0)
        snprintf(held, sizeof held, ", %d blocked (%s)", blocked, d->pool->blocklist_path);
    fprintf(stderr,
            "megascale launch: %d rank(s) on %d node(s) (+%d spare%s), heartbeats on %s, control "
            "on %s, events in %s\n",
            c->np, d->pool->needed, usable > d->pool->needed ? usable - d->pool->needed : 0, held,
            d->addr, d->ctl_addr, d->ev.path);
    code = run_loop(d);
out:
    if (d->lfd >= 0) close(d->lfd);
    if (d->ctl_fd >= 0) close(d->ctl_fd);
    for (int i = 0; i < d->n_conns; i++)
        close(d->conns[i].fd);
    for (int i = 0; i < d->n_ctl; i++)
        close(d->ctl[i].fd);
    sup_heatlog_close(&d->heat);
    sup_events_close(&d->ev);
    /* what the loop queued, on disk before the driver exits (and lets go of
     * its lock), unless the disk takes nothing for SUP_EXIT_FLUSH_S */
    sup_writer_stop(d->writer, SUP_EXIT_FLUSH_S);
    if (d->lock_fd >= 0) close(d->lock_fd); /* the run directory is a successor's */
    /* then a page left open reads the end (job_done, the summary) */
    sup_dash_finish(d->dash, SUP_DASH_LINGER_S);
    sup_dash_stop(d->dash);
    free(d->dash_ranks);
    sup_nodes_free(d->pool);
    sup_straggler_free(&d->strag);
    free(d->conns);
    free(d->adopt_pids);
    free(d->adopt_starts);
    free(d->adopt_hosts);
    free(d->r);
    free(d->pool);
    free(d);
    return code;
}
