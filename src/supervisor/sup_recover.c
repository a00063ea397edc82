/* sup_recover.c - after a fault: the self-test on the nodes, evictions and
 * spares; and the driver's own state file RUN_DIR/driver.json, so a
 * driver that was killed and started again takes over where it was (its
 * job, if that still runs; its counters and the blocklist in any case).
 * docs/operations.md, "The supervisor"; docs/formats.md, "Driver state". */
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

#define STATE_MAX_BYTES (4 << 20)

int sup_evict(sup_driver *d, int i, const char *by, const char *reason) {
    sup_nodes *p = d->pool;
    if (i < 0 || i >= p->n || p->blocked[i][0]) return 0;
    char why[600] = "";
    int rc = sup_nodes_block(p, i, reason, why, sizeof why);
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "node", p->name[i]);
    cJSON_AddStringToObject(f, "by", by);
    cJSON_AddStringToObject(f, "reason", reason);
    if (rc) cJSON_AddStringToObject(f, "blocklist_error", why);
    sup_events_put(&d->ev, "evict", f);
    fprintf(stderr,
            "megascale launch: evicted node %s (%s); %d healthy node(s) left for a job of %d\n",
            p->name[i], reason, sup_nodes_usable(p), p->needed);
    if (rc) fprintf(stderr, "megascale launch: warning: the blocklist was not saved: %s\n", why);
    return rc;
}

void sup_faults_format(const sup_driver *d, int diag, int after_step, const char *skip, char *buf,
                       size_t n) {
    ms_fault_plan *sub = calloc(1, sizeof *sub);
    buf[0] = 0;
    if (!sub) return;
    for (int i = 0; i < d->plan.n; i++)
        if (!strncmp(d->plan.f[i].kind, "diag:", 5) == !!diag &&
            !(skip && !strcmp(d->plan.f[i].kind, skip)))
            sub->f[sub->n++] = d->plan.f[i];
    ms_fault_format(sub, after_step, buf, n);
    free(sub);
}

/* The directory diag's storage check writes in: the checkpoint directory,
 * or, before the trainer has created it (a job that failed at start-up),
 * its nearest existing ancestor, so a directory not made yet does not read
 * as broken storage. */
static void storage_probe_dir(const char *dir, char *out, size_t n) {
    struct stat sb;
    snprintf(out, n, "%s", dir);
    while (stat(out, &sb) != 0 && strcmp(out, ".") && strcmp(out, "/"))
        ms_path_dir(out);
}

/* While diag runs: the control socket is answered (status; an eviction is
 * refused until the restart). */
static void serve_ctl(void *arg) {
    sup_serve_for(arg, 0);
}

/* The nodes' speeds compared with each other's: asked for, or by default
 * with a hostfile.  Nodes on one host share its processors: their speeds
 * tell the scheduler's shares apart, not the nodes. */
static int compare_peers(const sup_config *c) {
    return c->diag_peers > 0 || (c->diag_peers < 0 && c->hostfile);
}

/* A node's speeds compared with its own history: only with a hostfile.  On
 * one host the nodes' histories are the host's, measured under whatever else
 * ran there then (and the self-test runs on every node at once, each a share
 * of the same processors), so a busy moment failed most of the nodes at once
 * and evicted them, the spares too (bench/chaos --nodes 3 --spares 1: exit 6
 * after a crash).  The results are still kept in the history. */
static double history_slow_factor(const sup_config *c) {
    return c->hostfile ? c->diag_slow_factor : 0;
}

/* Before a node is failed as slow, against its own history or its peers:
 * every node measured once more, all at once as before (the same share of
 * a host each, the same traffic), each speed its best of the two runs, and
 * a check failed against the node's own history standing only if the
 * second run fails it too (sup_diag_best_of_two).  Noise only ever slows a
 * measurement; one run of nodes sharing a busy host's processors read a
 * healthy node's memory at 0.50 x the others' and evicted it (a CI run of
 * tests/supervisor/test_nodes.py), and one busy moment against a history
 * evicted a spare (diag:blip, a crash on 3 hosts: exit 6), while a node
 * that is slow stays slow in both.  A node that failed a check otherwise
 * (wrong results, storage, no report) is not measured again: it is evicted.
 * Only the speeds of the second run count: its other checks are the first
 * run's over again.  The nodes without a report are left out of it (an
 * unreachable host would hold up the one mpirun of all).  faults: the
 * second run's injected faults; peers: the factor of the nodes' comparison
 * with each other (0: none). */
static void measure_again(const sup_diag_config *dc0, const char *faults, const int *idx, int k,
                          sup_diag_result *res, double peers) {
    sup_diag_result *peek = malloc(sizeof *peek * (size_t)k);
    if (!peek) return;
    memcpy(peek, res, sizeof *peek * (size_t)k);
    if (peers > 0) sup_diag_peers(peek, k, peers);
    char why[600], names[2][SUP_MAX_NODES * SUP_NODE_NAME] = {"", ""};
    for (int j = 0; j < k; j++) {
        char *l = names[!res[j].ok]; /* [0]: slow against the others, [1]: its history */
        if (sup_diag_slow_only(&peek[j]))
            snprintf(l + strlen(l), sizeof names[0] - strlen(l), "%s%s", l[0] ? ", " : "",
                     dc0->pool->name[idx[j]]);
    }
    sup_diag_result *again = names[0][0] || names[1][0] ? calloc((size_t)k, sizeof *again) : NULL;
    if (again) {
        fprintf(stderr,
                "megascale launch: diag: %s%s%s%s%s; measuring every node once more before "
                "evicting\n",
                names[0], names[0][0] ? " slow against the other nodes" : "",
                names[0][0] && names[1][0] ? "; " : "", names[1],
                names[1][0] ? " slow against its own history" : "");
        sup_diag_config dc = *dc0;
        dc.faults = faults;
        int on[SUP_MAX_NODES], at[SUP_MAX_NODES], m = 0;
        for (int j = 0; j < k; j++)
            if (res[j].reported) at[m] = j, on[m++] = idx[j];
        if (sup_diag_run(&dc, on, m, again, why, sizeof why) == 0) {
            for (int i = 0; i < m; i++)
                sup_diag_best_of_two(&res[at[i]], &again[i]);
        } else {
            fprintf(stderr, "megascale launch: diag: the second run could not start: %s\n", why);
        }
    }
    free(again);
    free(peek);
}

/* 1 (res freed, an event and a line said why) when the driver was asked to stop
 * while diag ran: diag gives up at once on the stop flag, and the nodes that had not
 * reported yet must not be run again or evicted for it.  Before, they were taken for
 * silent nodes: run alone (which stopped at once too) and evicted as "no report", a
 * healthy node on the blocklist for every later launch (exit 6 where no spare was left). */
static int stopped(sup_driver *d, sup_diag_result *res) {
    if (!d->stop_flag || !*d->stop_flag) return 0;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "error", "stopped: the driver was asked to stop");
    sup_events_put(&d->ev, "diag", f);
    fprintf(stderr, "megascale launch: diag stopped (the driver was asked to stop); nothing "
                    "evicted\n");
    free(res);
    return 1;
}

/* The self-test on every node not on the blocklist; evicts the ones that
 * fail.  when: "fault" (after one) or "preflight" (before the first
 * start), in its events.  0 to go on, or SUP_EXIT_STORAGE. */
static int diagnose(sup_driver *d, const char *when) {
    sup_nodes *p = d->pool;
    const sup_config *c = d->c;
    int idx[SUP_MAX_NODES], k = 0;
    for (int i = 0; i < p->n; i++)
        if (!p->blocked[i][0]) idx[k++] = i;
    if (!k) return 0;
    sup_diag_result *res = calloc((size_t)k, sizeof *res);
    char faults[MS_FAULT_SPEC_MAX], why[600] = "", probe[sizeof d->ckpt_dir];
    storage_probe_dir(d->ckpt_dir, probe, sizeof probe);
    sup_faults_format(d, 1, -1, NULL, faults, sizeof faults);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    sup_diag_config dc = {.mpirun = c->mpirun ? c->mpirun : "mpirun",
                          .bin = c->bin,
                          .storage_dir = d->ckpt_dir[0] ? probe : NULL,
                          .history_dir = d->diag_dir,
                          .device = d->device[0] ? d->device : NULL,
                          .faults = faults,
                          .stop = d->stop_flag,
                          .timeout = c->diag_timeout,
                          .slow_factor = history_slow_factor(c),
                          .threads = c->hostfile ? 0 : (int)(cores / k > 1 ? cores / k : 1),
                          .pool = p,
                          .hostfile = c->hostfile ? d->hostfile_path : NULL,
                          .tick = serve_ctl,
                          .tick_arg = d};
    double t0 = ms_now();
    ms_mkdirs(d->diag_dir); /* here, not by each diag rank at once */
    int rc = res ? sup_diag_run(&dc, idx, k, res, why, sizeof why) : -1;
    if (stopped(d, res)) return 0;
    int missing = 0;
    for (int j = 0; rc == 0 && j < k; j++)
        missing += !res[j].reported;
    /* mpirun failed to start, or some nodes gave no report: once more before
     * a node is evicted for silence, each silent node alone (all at once,
     * within one timeout).  Alone, because
     * one unreachable host (a link down: its daemon never calls back) stops
     * the one mpirun of every node, so that nobody reports; and a node that
     * stays silent even alone is the one at fault.  (A second try also
     * covers the reports seen missing right after a stopped job, on the
     * nodes it ran on: 2 of 3 in a few CI runs.) */
    if (res && (rc != 0 || missing)) {
        char what[64];
        snprintf(what, sizeof what, "%d node(s) gave no report", missing);
        fprintf(stderr, "megascale launch: diag: %s; running it again on each of them alone\n",
                rc ? why : what);
        if (rc != 0) memset(res, 0, sizeof *res * (size_t)k);
        int silent[SUP_MAX_NODES], ns = 0;
        sup_diag_result *again = calloc((size_t)k, sizeof *again);
        for (int j = 0; j < k; j++)
            if (!res[j].reported) silent[ns++] = idx[j];
        if (!again) snprintf(why, sizeof why, "out of memory");
        rc = again ? sup_diag_run_each(&dc, silent, ns, again, why, sizeof why) : -1;
        for (int j = 0, s = 0; again && j < k; j++)
            if (!res[j].reported) res[j] = again[s++];
        free(again);
        if (stopped(d, res)) return 0;
    }
    if (!res || rc != 0) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "error", res ? why : "out of memory");
        sup_events_put(&d->ev, "diag", f);
        fprintf(stderr, "megascale launch: diag could not run: %s; nothing evicted\n",
                res ? why : "out of memory");
        free(res);
        return 0;
    }
    /* the second run without diag:blip: a node slow the first time only */
    char again[sizeof faults];
    sup_faults_format(d, 1, -1, "diag:blip", again, sizeof again);
    measure_again(&dc, again, idx, k, res, compare_peers(c) ? c->diag_slow_factor : 0);
    if (stopped(d, res)) return 0;
    double took = ms_now() - t0;
    if (compare_peers(c)) sup_diag_peers(res, k, c->diag_slow_factor);
    int reported = 0, failing = 0, storage = 0;
    for (int j = 0; j < k; j++) {
        sup_diag_result *r = &res[j];
        reported += r->reported;
        failing += !r->ok;
        storage += r->reported && strstr(r->failed, "storage") != NULL;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "node", p->name[idx[j]]);
        cJSON_AddBoolToObject(f, "ok", r->ok);
        cJSON_AddBoolToObject(f, "reported", r->reported);
        cJSON_AddStringToObject(f, "failed", r->failed);
        cJSON_AddStringToObject(f, "detail", r->detail);
        cJSON_AddNumberToObject(f, "diag_s", took);
        cJSON_AddStringToObject(f, "when", when);
        sup_events_put(&d->ev, "diag", f);
        fprintf(stderr, "megascale launch: %s: node %s: %s%s%s\n",
                strcmp(when, "preflight") ? "diag" : "pre-flight diag", p->name[idx[j]],
                r->ok ? "PASS" : "FAIL", r->ok ? "" : ": ", r->ok ? "" : r->detail);
    }
    int code = 0;
    if (reported == 0) {
        fprintf(stderr, "megascale launch: diag: no node reported; nothing evicted\n");
    } else if (failing == k && storage == k) {
        fprintf(stderr,
                "megascale launch: giving up: the checkpoint storage (%s) fails the self-test on "
                "every node (%s); free space or repair it, then run the same command again\n",
                d->ckpt_dir, res[0].detail);
        code = SUP_EXIT_STORAGE;
    } else if (failing == k) {
        fprintf(stderr, "megascale launch: diag: every node failed, which points away from the "
                        "nodes (a shared cause); nothing evicted\n");
    } else {
        for (int j = 0; j < k; j++) {
            if (res[j].ok) continue;
            char reason[160];
            snprintf(reason, sizeof reason, "diag failed: %s",
                     res[j].reported ? res[j].failed : "no report");
            sup_evict(d, idx[j], "diag", reason);
        }
    }
    free(res);
    return code;
}

int sup_recover(sup_driver *d) {
    if (d->evict_node >= 0)
        sup_evict(d, d->evict_node, !strcmp(d->kind, "straggler") ? "straggler" : "manual",
                  d->evict_reason);
    if (d->c->diag && strcmp(d->kind, "evicted")) {
        int code = diagnose(d, "fault");
        if (code) return code;
    }
    if (sup_nodes_choose(d->pool) != 0) {
        fprintf(stderr,
                "megascale launch: giving up: %d healthy node(s) left for a job of %d (the "
                "blocklist, %s, says why; add nodes or spares, or edit it)\n",
                sup_nodes_usable(d->pool), d->pool->needed, d->pool->blocklist_path);
        return SUP_EXIT_NO_NODES;
    }
    return 0;
}

int sup_preflight(sup_driver *d) {
    fprintf(stderr, "megascale launch: pre-flight: diag on every node before the first start\n");
    return diagnose(d, "preflight");
}

/* ---- the driver's state file ----------------------------------------------- */

void sup_state_save(sup_driver *d, int finished, int sync) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "v", 1);
    cJSON_AddNumberToObject(o, "pid", getpid());
    cJSON_AddBoolToObject(o, "finished", finished);
    cJSON_AddStringToObject(o, "token", d->token);
    cJSON_AddStringToObject(o, "heartbeat", d->addr);
    cJSON_AddNumberToObject(o, "attempt", d->attempt_no);
    int running = d->job.pid && !d->job.exited;
    cJSON_AddNumberToObject(o, "mpirun_pid", running ? d->job.pid : 0);
    cJSON_AddNumberToObject(o, "mpirun_start", running ? (double)sup_pid_start(d->job.pid) : 0);
    /* forked, held before its exec (sup_job_start): a successor finds no job */
    cJSON_AddBoolToObject(o, "mpirun_held", running && d->job.held);
    cJSON_AddStringToObject(o, "node_map", d->node_map);
    cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
    for (int i = 0; i < d->c->np; i++) {
        cJSON *r = cJSON_CreateArray();
        cJSON_AddItemToArray(r, cJSON_CreateNumber(running ? d->r[i].pid : 0));
        cJSON_AddItemToArray(r, cJSON_CreateNumber((double)d->r[i].pid_start));
        cJSON_AddItemToArray(r, cJSON_CreateString(d->r[i].host));
        cJSON_AddItemToArray(ranks, r);
    }
    cJSON_AddNumberToObject(o, "restarts", d->restarts);
    cJSON_AddNumberToObject(o, "no_progress", d->no_progress);
    cJSON_AddBoolToObject(o, "recovering", d->recovering);
    cJSON_AddNumberToObject(o, "recover_prev_best", d->recover_prev_best);
    /* the fault being recovered from: a successor books its recovery time
     * (from its detection, as a wall time) and the steps its restart redoes */
    cJSON_AddNumberToObject(o, "pending_fault", d->pending_recovery ? d->pending_fault : -1);
    cJSON_AddNumberToObject(o, "step_at_fault", d->step_at_fault);
    cJSON_AddNumberToObject(o, "recovery_from",
                            d->pending_recovery ? ms_wall_now() - (ms_now() - d->t_recovery_from)
                                                : 0);
    cJSON_AddNumberToObject(o, "best_step", d->best_step);
    cJSON_AddNumberToObject(o, "start_step", d->start_step);
    cJSON_AddNumberToObject(o, "faults_through", d->faults_through);
    cJSON_AddNumberToObject(o, "redone", d->ev.redone);
    cJSON_AddNumberToObject(o, "step_ms_sum", d->step_ms_sum);
    cJSON_AddNumberToObject(o, "step_ms_n", (double)d->step_ms_n);
    cJSON_AddNumberToObject(o, "timed_step", d->timed_step);
    cJSON_AddNumberToObject(o, "max_interval", d->interval.cur); /* of the current bucket */
    cJSON_AddNumberToObject(o, "interval_prev", d->interval.prev);
    cJSON_AddNumberToObject(o, "interval_bucket", d->interval.bucket);
    cJSON_AddNumberToObject(o, "first_interval", d->first_interval);
    cJSON_AddNumberToObject(o, "t0", d->ev.t0);
    cJSON_AddNumberToObject(o, "anomalies", d->n_anomalies);
    cJSON_AddNumberToObject(o, "ckpt_warned", d->ckpt_warned);
    int redone = 0, skipped = 0; /* the attempt's, as its ranks' beats said them */
    for (int i = 0; i < d->c->np; i++)
        redone = d->r[i].redone > redone ? d->r[i].redone : redone,
        skipped = d->r[i].skipped > skipped ? d->r[i].skipped : skipped;
    cJSON_AddNumberToObject(o, "ranks_redone", redone);
    cJSON_AddNumberToObject(o, "ranks_skipped", skipped);
    cJSON_AddNumberToObject(o, "nan_step", d->nan_step);
    cJSON_AddNumberToObject(o, "skip_step", d->skip_step);
    cJSON_AddNumberToObject(o, "straggler_warned", d->straggler_warned);
    /* the loss-spike detector's history: a successor goes on with it (before, it started
     * afresh and missed every spike of its first 16 steps) */
    const sup_spike *sp = &d->spike;
    cJSON *spike = cJSON_AddObjectToObject(o, "spike");
    if (spike) {
        cJSON_AddItemToObject(spike, "changes", cJSON_CreateDoubleArray(sp->v, sp->n));
        cJSON_AddNumberToObject(spike, "next", sp->next);
        cJSON_AddNumberToObject(spike, "prev", sp->have_prev ? sp->prev : 0);
        cJSON_AddNumberToObject(spike, "last_step", sp->last_step);
        cJSON_AddBoolToObject(spike, "have_prev", sp->have_prev);
        cJSON_AddBoolToObject(spike, "skip_next", sp->skip_next);
    }
    cJSON_AddStringToObject(o, "latest0", d->latest0);
    cJSON_AddStringToObject(o, "job0", d->job0);
    /* a start trained with these options: a successor with the same ones
     * takes a later refusal of them for a node's fault (sup_driver.c) */
    cJSON_AddBoolToObject(o, "options_ok", d->options_ok);
    /* the job's options: a successor that would take the running job over
     * with others refuses (sup_state_resume) */
    cJSON_AddNumberToObject(o, "np", d->c->np);
    cJSON_AddNumberToObject(o, "nodes", d->pool->needed);
    char *pool = malloc(sizeof d->node_map);
    if (pool) sup_nodes_pool(d->pool, pool, sizeof d->node_map);
    cJSON_AddStringToObject(o, "pool", pool ? pool : "");
    free(pool);
    cJSON_AddStringToObject(o, "fault_plan", d->c->faults ? d->c->faults : "");
    cJSON *train = cJSON_AddArrayToObject(o, "train");
    for (int i = 0; i < d->c->train_argc; i++)
        cJSON_AddItemToArray(train, cJSON_CreateString(d->c->train_argv[i]));
    cJSON *eff = d->c->train_effective ? cJSON_Parse(d->c->train_effective) : NULL;
    if (eff) cJSON_AddItemToObject(o, "train_effective", eff);
    /* the attempt's fault from the moment it is seen (an eviction from the
     * moment it is accepted) to the restart: a successor stops the job,
     * counts the fault once and evicts the node */
    if (d->fault) {
        cJSON *f = cJSON_AddObjectToObject(o, "fault");
        cJSON_AddStringToObject(f, "kind", d->kind);
        cJSON_AddNumberToObject(f, "rank", d->fault_rank);
        cJSON_AddNumberToObject(f, "step", d->fault_step);
        cJSON_AddNumberToObject(f, "best", d->fault_best);
        cJSON_AddStringToObject(f, "detail", d->detail);
        cJSON_AddNumberToObject(f, "at", ms_wall_now() - (ms_now() - d->t_detect));
        cJSON_AddNumberToObject(f, "detect_s", d->t_detect - d->t_stall);
        cJSON_AddBoolToObject(f, "booked", d->fault_booked);
        cJSON_AddStringToObject(f, "evict_node",
                                d->evict_node >= 0 ? d->pool->name[d->evict_node] : "");
        cJSON_AddStringToObject(f, "evict_reason", d->evict_reason);
    }
    cJSON *faults = cJSON_AddArrayToObject(o, "faults");
    int nf = d->ev.n_faults < SUP_MAX_FAULTS ? d->ev.n_faults : SUP_MAX_FAULTS;
    for (int i = 0; i < nf; i++) {
        cJSON *f = cJSON_CreateArray();
        cJSON_AddItemToArray(f, cJSON_CreateString(d->ev.kinds[i]));
        cJSON_AddItemToArray(
            f, cJSON_CreateNumber(isfinite(d->ev.detect_s[i]) ? d->ev.detect_s[i] : -1));
        cJSON_AddItemToArray(
            f, cJSON_CreateNumber(isfinite(d->ev.recover_s[i]) ? d->ev.recover_s[i] : -1));
        cJSON_AddItemToArray(faults, f);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t len = text ? strlen(text) : 0;
    char *line = text ? malloc(len + 2) : NULL;
    if (!line) {
        fprintf(stderr, "megascale launch: warning: %s not saved: out of memory\n", d->state_path);
        cJSON_free(text);
        return;
    }
    memcpy(line, text, len);
    memcpy(line + len, "\n", 2);
    cJSON_free(text);
    /* the writer thread writes it to a temp file and renames it over (a
     * reader never sees half a state), not fsynced: it is rewritten every
     * second, and an fsync behind a checkpoint's writes could stall for
     * seconds */
    unsigned long gen = sup_writer_replace(d->writer, d->state_path, line);
    if (!sync) return;
    double t0 = ms_now();
    while (sup_writer_wait(d->writer, gen, 0.02) != 0) {
        if (ms_now() - t0 > SUP_SAVE_WAIT_S) {
            fprintf(stderr,
                    "megascale launch: warning: %s not on disk after %.0f s (the disk under the "
                    "run directory is stalled); going on without it\n",
                    d->state_path, SUP_SAVE_WAIT_S);
            break;
        }
        sup_serve_for(d, 0); /* the beats and the control socket meanwhile */
    }
}

static double num(const cJSON *o, const char *k, int *bad) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) {
        *bad = 1;
        return 0;
    }
    return x->valuedouble;
}

/* The pid, if it is still the process the state names: alive with the
 * same start time.  A start time of 0 (unknown) verifies nothing: such a
 * pid may have been reused by anything, and is never adopted or killed. */
static pid_t same_process(double pid, double start) {
    return pid > 0 && start > 0 ? sup_pid_same((pid_t)pid, (unsigned long long)start) : 0;
}

static const cJSON *item(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* 1 if two option values are the same: the same text, or numbers equal
 * as numbers (--lr 0.001 and --lr 1e-3). */
static int same_value(const char *a, const char *b) {
    if (!strcmp(a, b)) return 1;
    char *ea = NULL, *eb = NULL;
    double x = strtod(a, &ea), y = strtod(b, &eb);
    return ea != a && eb != b && !*ea && !*eb && isfinite(x) && x == y;
}

/* The first train option whose value differs between the saved argv and
 * c's, as "--name: the job has A, this command gives B" into out ("" if
 * none).  Options are compared by value (the last one given counts; numbers
 * as numbers), so the same options in another order or spelling are the
 * same. */
/* The same by the options' effective values (saved: the state's "train_effective"): the
 * first option whose value differs, whichever way it was given (the command line, a --config
 * file, the environment).  1 if both sides have them (out says the difference, "" if none),
 * 0 if not (an older state: the argv are compared). */
/* 1 if a --resume value means auto: none (null, "") or "auto". */
static int resume_auto(const cJSON *v) {
    return cJSON_IsNull(v) ||
           (cJSON_IsString(v) && (!*v->valuestring || !strcmp(v->valuestring, "auto")));
}

static int effective_diff(const sup_config *c, const cJSON *saved, char *out, size_t n) {
    /* the options the driver gives each start itself (a --config that is the out-dir's
     * train.cfg, which the job's rank 0 rewrote, holds them), or the user's first start only */
    static const char *const managed[] = {"restart-job",     "peak-cache", "metrics",
                                          "heartbeat",       "node-map",   "inject-fault",
                                          "heartbeat-token", "ckpt-fault", NULL};
    cJSON *mine = c->train_effective ? cJSON_Parse(c->train_effective) : NULL;
    out[0] = 0;
    if (!cJSON_IsObject(saved) || !cJSON_IsObject(mine)) {
        cJSON_Delete(mine);
        return 0;
    }
    for (int side = 0; side < 2 && !out[0]; side++) {
        const cJSON *e, *of = side ? (const cJSON *)mine : saved;
        cJSON_ArrayForEach(e, of) {
            const cJSON *was = cJSON_GetObjectItemCaseSensitive(saved, e->string),
                        *is = cJSON_GetObjectItemCaseSensitive(mine, e->string);
            int skip = !was || !is; /* an option of another version: not compared */
            for (int k = 0; !skip && managed[k]; k++)
                skip = !strcmp(e->string, managed[k]);
            /* --resume: none is auto (the driver gives each start --resume auto, and a
             * train.cfg rank 0 rewrote says so); a PATH, or --new-run 1, is the user's choice,
             * compared (a --new-run after a finished job is a new job) */
            if (!skip && !strcmp(e->string, "resume")) skip = resume_auto(was) && resume_auto(is);
            int same =
                skip || (cJSON_Compare(was, is, 1) || (cJSON_IsNumber(was) && cJSON_IsNumber(is) &&
                                                       was->valuedouble == is->valuedouble));
            if (same) continue;
            char *a = was ? cJSON_PrintUnformatted(was) : NULL,
                 *b = is ? cJSON_PrintUnformatted(is) : NULL;
            snprintf(out, n,
                     "train option --%s: the job has %.300s, this command gives %.300s (its "
                     "value from the command line, a --config file or the environment)",
                     e->string, a ? a : "none", b ? b : "none");
            cJSON_free(a);
            cJSON_free(b);
            break;
        }
    }
    cJSON_Delete(mine);
    return 1;
}

static void train_diff(const sup_config *c, const cJSON *saved, const cJSON *effective, char *out,
                       size_t n) {
    /* by value where both sides know them: a --config file changed under the same command
     * line was taken over without a word (and its new lr ran after the next restart), and
     * an option given on the command line with the value its --config file had was refused */
    if (effective_diff(c, effective, out, n)) return;
    int k = cJSON_GetArraySize(saved);
    char **a = calloc((size_t)k + 1, sizeof *a);
    out[0] = 0;
    if (!a) return;
    for (int i = 0; i < k; i++) {
        const cJSON *x = cJSON_GetArrayItem(saved, i);
        a[i] = cJSON_IsString(x) ? x->valuestring : "";
    }
    for (int side = 0; side < 2 && !out[0]; side++) {
        char *const *v = side ? c->train_argv : a;
        int m = side ? c->train_argc : k;
        for (int i = 0; i < m && !out[0]; i++) {
            if (strncmp(v[i], "--", 2)) continue;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)strcspn(v[i], "="), v[i]);
            const char *was = sup_argv_value(a, k, name);
            const char *is = sup_argv_value(c->train_argv, c->train_argc, name);
            if ((was || is) && (!was || !is || !same_value(was, is)))
                snprintf(out, n, "train option %s: the job has %s, this command gives %s", name,
                         was ? was : "none", is ? is : "none");
        }
    }
    free(a);
}

/* The first of this driver's options (d->c) that differs from those the
 * state o saved, as "--name: the job has A, this command gives B" into
 * what ("" if none).  A state without them (an older driver's) differs in
 * none. */
static void options_diff(const sup_driver *d, const cJSON *o, char *what, size_t wn) {
    const cJSON *np = item(o, "np"), *nodes = item(o, "nodes"), *pool = item(o, "pool"),
                *train = item(o, "train");
    what[0] = 0;
    char *mine = malloc(sizeof d->node_map);
    if (mine) sup_nodes_pool(d->pool, mine, sizeof d->node_map);
    if (cJSON_IsNumber(np) && (int)np->valuedouble != d->c->np)
        snprintf(what, wn, "--np: the job has %d, this command gives %d", (int)np->valuedouble,
                 d->c->np);
    else if (cJSON_IsNumber(nodes) && (int)nodes->valuedouble != d->pool->needed)
        snprintf(what, wn, "--nodes: the job runs on %d node(s), this command gives %d",
                 (int)nodes->valuedouble, d->pool->needed);
    else if (cJSON_IsString(pool) && mine && strcmp(pool->valuestring, mine))
        snprintf(what, wn,
                 "--spares/--hostfile: the job's node pool is %.500s, this command's is %.500s",
                 pool->valuestring, mine);
    else if (cJSON_IsArray(train))
        train_diff(d->c, train, item(o, "train_effective"), what, wn);
    free(mine);
}

/* A running job's fault plan (the state's "fault_plan", absent in older
 * states) that is not this command's --faults, as what (else ""): its
 * ranks have the job's plan, so the new one's entries would never fire.
 * (Not an option the ranks refuse: a job not running takes the new one.) */
static void plan_diff(const sup_driver *d, const cJSON *o, char *what, size_t wn) {
    const cJSON *saved = item(o, "fault_plan");
    const char *plan = d->c->faults ? d->c->faults : "";
    what[0] = 0;
    if (cJSON_IsString(saved) && strcmp(saved->valuestring, plan))
        snprintf(what, wn, "--faults: the job's plan is '%.400s', this command's '%.400s'",
                 saved->valuestring, plan);
}

/* why, for a running job (its mpirun: job) whose options differ from this
 * command's as what (options_diff) says; -2. */
static int refuse_options(const sup_driver *d, pid_t job, const char *what, char *why, size_t n) {
    snprintf(why, n,
             "%s: its job still runs (mpirun pid %d) with other options than this command's: "
             "%s; run the same command to take it over, or stop the job first (kill -USR1 %d: "
             "its ranks take a final checkpoint and exit) and launch again: the restart takes "
             "the new options",
             d->state_path, (int)job, what, (int)job);
    return -2;
}

/* The fault the earlier driver was acting on (the state's "fault"):
 * 0, or -1 if it is not one. */
static int restore_fault(sup_driver *d, const cJSON *f) {
    const cJSON *kind = item(f, "kind"), *detail = item(f, "detail"), *en = item(f, "evict_node"),
                *er = item(f, "evict_reason");
    int bad = 0;
    double rank = num(f, "rank", &bad), step = num(f, "step", &bad), at = num(f, "at", &bad),
           det = num(f, "detect_s", &bad);
    if (bad || !cJSON_IsString(kind) || !cJSON_IsString(detail) || !cJSON_IsString(en) ||
        !cJSON_IsString(er))
        return -1;
    d->fault = 1;
    snprintf(d->kind, sizeof d->kind, "%s", kind->valuestring);
    snprintf(d->detail, sizeof d->detail, "%s", detail->valuestring);
    d->fault_rank = rank >= 0 && rank < d->c->np ? (int)rank : -1;
    d->fault_step = (int)step;
    const cJSON *best = item(f, "best"); /* absent in older states: the state's best step */
    d->fault_best = cJSON_IsNumber(best) ? (int)best->valuedouble : d->best_step;
    d->t_detect = ms_now() - (ms_wall_now() - at);
    d->t_stall = d->t_detect - (det > 0 ? det : 0);
    d->fault_booked = cJSON_IsTrue(item(f, "booked"));
    d->evict_node = en->valuestring[0] ? sup_nodes_find(d->pool, en->valuestring) : -1;
    snprintf(d->evict_reason, sizeof d->evict_reason, "%s", er->valuestring);
    return 0;
}

/* The state's ranks ([pid, start, host] each): with the job taken over
 * (adopted), their identities, also of one whose process is gone (a crash
 * before it reconnects: sup_watch; a pid is never signalled unless still
 * the same process); else a rank its mpirun left behind is killed. */
static void resume_ranks(sup_driver *d, const cJSON *ranks, int adopted) {
    int i = 0;
    for (const cJSON *r = ranks->child; r && i < d->c->np; r = r->next, i++) {
        const cJSON *pid = cJSON_GetArrayItem(r, 0), *st = cJSON_GetArrayItem(r, 1);
        const cJSON *host = cJSON_GetArrayItem(r, 2); /* absent in older states */
        if (!cJSON_IsNumber(pid) || !cJSON_IsNumber(st)) continue;
        pid_t p = same_process(pid->valuedouble, st->valuedouble);
        if (p && !adopted) kill(p, SIGKILL);
        int known = adopted && pid->valuedouble > 0 && st->valuedouble > 0;
        d->adopt_pids[i] = known ? (pid_t)pid->valuedouble : 0;
        d->adopt_starts[i] = known ? (unsigned long long)st->valuedouble : 0;
        snprintf(d->adopt_hosts[i], sizeof d->adopt_hosts[i], "%s",
                 adopted && cJSON_IsString(host) ? host->valuestring : "");
    }
}

/* The state's counters into d; 1 if one is missing or not a number (its
 * start time t0 into *t0, taken only once the state is known good). */
/* The loss-spike detector's history from a state's "spike" (absent in older states, or
 * not well formed: none, as a new driver's). */
static void resume_spike(sup_spike *sp, const cJSON *o) {
    memset(sp, 0, sizeof *sp);
    const cJSON *ch = item(o, "changes"), *nx = item(o, "next"), *pv = item(o, "prev"),
                *ls = item(o, "last_step");
    int n = cJSON_GetArraySize(ch);
    if (!cJSON_IsObject(o) || !cJSON_IsArray(ch) || n > SUP_SPIKE_WINDOW || !cJSON_IsNumber(nx) ||
        !(nx->valuedouble >= 0 && nx->valuedouble < SUP_SPIKE_WINDOW) || !cJSON_IsNumber(pv) ||
        !isfinite(pv->valuedouble) || !cJSON_IsNumber(ls) ||
        !(ls->valuedouble >= 0 && ls->valuedouble < 1e9))
        return;
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(ch, i);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) {
            memset(sp, 0, sizeof *sp);
            return;
        }
        sp->v[i] = x->valuedouble;
    }
    sp->n = n;
    sp->next = n < SUP_SPIKE_WINDOW ? n : (int)nx->valuedouble; /* the ring fills in order */
    sp->prev = pv->valuedouble;
    sp->last_step = (int)ls->valuedouble;
    sp->have_prev = cJSON_IsTrue(item(o, "have_prev"));
    sp->skip_next = cJSON_IsTrue(item(o, "skip_next"));
}

/* A count a state holds: 0 when absent (an older state) or out of range. */
static int count_or_0(const cJSON *x) {
    return cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < 1e9 ? (int)x->valuedouble
                                                                            : 0;
}

static int resume_counters(sup_driver *d, const cJSON *o, double *t0) {
    int bad = 0;
    d->restarts = (int)num(o, "restarts", &bad);
    d->no_progress = (int)num(o, "no_progress", &bad);
    d->best_step = (int)num(o, "best_step", &bad);
    d->start_step = (int)num(o, "start_step", &bad);
    d->faults_through = (int)num(o, "faults_through", &bad);
    d->ev.redone = (int)num(o, "redone", &bad);
    d->step_ms_sum = num(o, "step_ms_sum", &bad);
    d->step_ms_n = (long)num(o, "step_ms_n", &bad);
    /* absent in older states: their steps up to the best one were timed */
    const cJSON *ts = item(o, "timed_step");
    d->timed_step = cJSON_IsNumber(ts) ? (int)ts->valuedouble : d->best_step;
    d->interval.cur = num(o, "max_interval", &bad);
    /* absent in older states: their longest step, of the current bucket */
    const cJSON *ip = item(o, "interval_prev"), *ib = item(o, "interval_bucket");
    d->interval.prev = cJSON_IsNumber(ip) && isfinite(ip->valuedouble) ? ip->valuedouble : 0;
    d->interval.bucket = cJSON_IsNumber(ib)
                             ? (int)ib->valuedouble
                             : (d->best_step > 0 ? d->best_step : 0) / SUP_INTERVAL_WINDOW;
    /* absent in older states: the limit waits for a later step's time */
    const cJSON *fi = item(o, "first_interval");
    d->first_interval = cJSON_IsNumber(fi) && isfinite(fi->valuedouble) ? fi->valuedouble : 0;
    d->n_anomalies = (int)num(o, "anomalies", &bad);
    const cJSON *cw = item(o, "ckpt_warned"); /* absent in older states: none said */
    d->ckpt_warned_adopt = count_or_0(cw);
    /* absent in older states: none said */
    d->redone_adopt = count_or_0(item(o, "ranks_redone"));
    d->skipped_adopt = count_or_0(item(o, "ranks_skipped"));
    d->nan_step_adopt = count_or_0(item(o, "nan_step"));
    d->skip_step_adopt = count_or_0(item(o, "skip_step"));
    d->straggler_warned_adopt = count_or_0(item(o, "straggler_warned")) > 0;
    resume_spike(&d->spike, item(o, "spike"));
    *t0 = num(o, "t0", &bad);
    d->attempt_no = (int)num(o, "attempt", &bad);
    return bad;
}

/* The summary's faults so far (the state's "faults": [kind, detect_s,
 * recover_s] each, -1 for a time not known), and the one whose recovery
 * is not complete yet (the successor books its recovery time). */
static void resume_faults(sup_driver *d, const cJSON *o, const cJSON *faults) {
    for (const cJSON *f = faults->child; f && d->ev.n_faults < SUP_MAX_FAULTS; f = f->next) {
        const cJSON *k = cJSON_GetArrayItem(f, 0), *de = cJSON_GetArrayItem(f, 1),
                    *re = cJSON_GetArrayItem(f, 2);
        if (!cJSON_IsString(k) || !cJSON_IsNumber(de) || !cJSON_IsNumber(re)) continue;
        int i = d->ev.n_faults++;
        snprintf(d->ev.kinds[i], sizeof d->ev.kinds[i], "%s", k->valuestring);
        d->ev.detect_s[i] = de->valuedouble >= 0 ? de->valuedouble : NAN;
        d->ev.recover_s[i] = re->valuedouble >= 0 ? re->valuedouble : NAN;
    }
    const cJSON *pf = item(o, "pending_fault"); /* absent: none */
    const cJSON *saf = item(o, "step_at_fault");
    const cJSON *rfrom = item(o, "recovery_from");
    if (cJSON_IsNumber(pf) && pf->valuedouble >= 0 && pf->valuedouble < d->ev.n_faults &&
        cJSON_IsNumber(saf) && cJSON_IsNumber(rfrom) && rfrom->valuedouble > 0) {
        d->pending_recovery = 1;
        d->pending_fault = (int)pf->valuedouble;
        d->step_at_fault = (int)saf->valuedouble;
        d->t_recovery_from = ms_now() - (ms_wall_now() - rfrom->valuedouble);
    }
}

/* The driver_resumed event and the line that says what this driver does. */
static void say_resumed(sup_driver *d, double prev_pid, int adopted) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "previous_pid", prev_pid);
    cJSON_AddBoolToObject(f, "adopted", adopted);
    cJSON_AddNumberToObject(f, "step", d->best_step);
    cJSON_AddNumberToObject(f, "restarts", d->restarts);
    if (d->fault) cJSON_AddStringToObject(f, "fault", d->kind);
    sup_events_put(&d->ev, "driver_resumed", f);
    char fault[200] = "";
    if (d->fault)
        snprintf(fault, sizeof fault, "; %s the fault it saw (%s%s%s)",
                 adopted ? "stopping it for" : "recovering from", d->kind,
                 d->evict_node >= 0 ? ", node " : "",
                 d->evict_node >= 0 ? d->pool->name[d->evict_node] : "");
    if (adopted)
        fprintf(stderr,
                "megascale launch: resuming from %s (driver pid %.0f is gone): its job still "
                "runs and is taken over at step %d, %d restart(s) so far%s\n",
                d->state_path, prev_pid, d->best_step, d->restarts, fault);
    else /* the job may have run on after the state was saved: its commits say where */
        fprintf(stderr,
                "megascale launch: resuming from %s (driver pid %.0f is gone): its job is gone "
                "(the state last saw step %d, %d restart(s) so far); its checkpoints say what "
                "comes next%s\n",
                d->state_path, prev_pid, d->best_step, d->restarts, fault);
}

/* A new job after one that ended (gave up, no progress, no nodes, the
 * storage; or done) in this run directory with the same train options: a
 * requeue of that job.  Its first start's set-up (--resume PATH's rollback
 * or load, --new-run's move) was made: the new job inherits what that first
 * start found (latest0, job0) and whether a start trained, so that its own
 * first start continues the training (--resume auto once the ended job had a
 * commit, else --restart-job) instead of doing the set-up again and setting
 * the job's progress aside. */
static void inherit_start(sup_driver *d, const cJSON *o) {
    const cJSON *train = item(o, "train"), *l0 = item(o, "latest0"), *j0 = item(o, "job0");
    char what[1400];
    if (!cJSON_IsArray(train) || !cJSON_IsString(l0) || !cJSON_IsString(j0)) return;
    train_diff(d->c, train, item(o, "train_effective"), what, sizeof what);
    if (what[0]) return; /* other options: a new job of its own */
    snprintf(d->latest0, sizeof d->latest0, "%s", l0->valuestring);
    snprintf(d->job0, sizeof d->job0, "%s", j0->valuestring);
    d->options_ok = cJSON_IsTrue(item(o, "options_ok"));
    d->requeued = 1;
    if ((d->c->resume[0] && strcmp(d->c->resume, "auto")) || d->c->new_run)
        fprintf(stderr,
                "megascale launch: the job that ended in %s had these train options: this one "
                "continues its training (its first start's %s is not done again)\n",
                d->c->run_dir, d->c->new_run ? "--new-run" : "--resume PATH");
}

int sup_state_resume(sup_driver *d, char *why, size_t n) {
    struct stat sb;
    if (stat(d->state_path, &sb) != 0) return 0; /* a new job */
    char *text = NULL;
    size_t len = 0;
    if (ms_file_read_max(d->state_path, STATE_MAX_BYTES, &text, &len) != MS_OK)
        return snprintf(why, n, "%s", ms_errmsg()), -1;
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    int bad = !cJSON_IsObject(o) || num(o, "v", &bad) != 1;
    const cJSON *fin = item(o, "finished");
    if (!bad && cJSON_IsTrue(fin)) { /* that job ended: this is a new one */
        inherit_start(d, o);
        cJSON_Delete(o);
        return 0;
    }
    const cJSON *tok = item(o, "token"), *hb = item(o, "heartbeat"), *ranks = item(o, "ranks"),
                *faults = item(o, "faults");
    double prev_pid = num(o, "pid", &bad), mp = num(o, "mpirun_pid", &bad),
           mps = num(o, "mpirun_start", &bad), t0 = 0;
    bad |= resume_counters(d, o, &t0);
    if (bad || fin == NULL || !cJSON_IsString(tok) || strlen(tok->valuestring) != 32 ||
        !cJSON_IsString(hb) || strlen(hb->valuestring) >= sizeof d->addr || !cJSON_IsArray(ranks) ||
        !cJSON_IsArray(faults)) {
        cJSON_Delete(o);
        return snprintf(why, n,
                        "%s: not a driver state this version can read; move it away to start "
                        "the job afresh (the checkpoints and the blocklist are kept)",
                        d->state_path),
               -1;
    }
    d->ev.t0 = t0;
    d->resumed = 1;
    const cJSON *l0 = item(o, "latest0"); /* absent: any commit */
    snprintf(d->latest0, sizeof d->latest0, "%s", cJSON_IsString(l0) ? l0->valuestring : "");
    const cJSON *j0 = item(o, "job0"); /* absent: not known (no --restart-job) */
    snprintf(d->job0, sizeof d->job0, "%s", cJSON_IsString(j0) ? j0->valuestring : "-");
    resume_faults(d, o, faults);
    const cJSON *rec = item(o, "recovering"); /* absent: no */
    const cJSON *rpb = item(o, "recover_prev_best");
    pid_t job = same_process(mp, mps);
    /* its driver died before it let that mpirun run: it ends at once, if
     * not yet gone (its gate closed); no job ran, so none was lost.  Unless
     * it runs another program than this one (the state said held, but the
     * driver let it exec mpirun and died before the next state was on
     * disk): that is the job, adopted as any */
    int held = cJSON_IsTrue(item(o, "mpirun_held")) && !(job && sup_pid_execd(job));
    if (held && job) kill(job, SIGKILL);
    if (held) job = 0, mp = 0;
    char what[1400];
    options_diff(d, o, what, sizeof what);
    if (job && !what[0]) plan_diff(d, o, what, sizeof what);
    if (job && what[0]) { /* the job and the files untouched */
        cJSON_Delete(o);
        return refuse_options(d, job, what, why, n);
    }
    /* a start trained with the saved options: with the same ones here, a
     * later refusal of them is a node's fault, not a usage error (absent
     * in older states: not known) */
    d->options_ok = cJSON_IsTrue(item(o, "options_ok")) && !what[0];
    const cJSON *fo = item(o, "fault"); /* absent: none */
    if (fo && (!cJSON_IsObject(fo) || restore_fault(d, fo) != 0)) {
        cJSON_Delete(o);
        return snprintf(why, n,
                        "%s: its \"fault\" is not one this version can read; move the file away "
                        "to start the job afresh (the checkpoints and the blocklist are kept)",
                        d->state_path),
               -1;
    }
    int adopted = 0;
    /* stopped after a fault, not restarted yet: no job to adopt, the restart is this one's */
    d->recovering = cJSON_IsTrue(rec) && !job;
    /* it ran, with nothing to say it was stopped, and is gone: it ended
     * while no driver watched (run_loop counts that as a fault) */
    d->lost_pid = mp > 0 && mps > 0 && !job && !cJSON_IsTrue(rec) && !d->fault ? (pid_t)mp : 0;
    d->recover_prev_best = cJSON_IsNumber(rpb) ? (int)rpb->valuedouble : d->best_step;
    if (d->fault) { /* the verdict its event announced, made again from the same counters */
        int np;
        d->fault_final = sup_policy_verdict(d, d->recover_prev_best, &np) != 0;
    }
    if (job) {
        /* its ranks reconnect to the same address with the same token */
        snprintf(d->token, sizeof d->token, "%s", tok->valuestring);
        snprintf(d->addr, sizeof d->addr, "%s", hb->valuestring);
        d->adopt_pid = job;
        adopted = 1;
    }
    if (mp > 0 && !job) { /* its mpirun is gone: what a killed one left here goes */
        sup_job gone;
        sup_job_adopt(&gone, (pid_t)mp);
        gone.exited = 1;
        sup_job_sweep(&gone);
        if (gone.swept_segments || gone.swept_session)
            fprintf(stderr,
                    "megascale launch: the job's mpirun (pid %d) is gone; removed what killed "
                    "Open MPI jobs left on this host: %d shared-memory segment(s) (%.1f MB)%s\n",
                    (int)mp, gone.swept_segments, gone.swept_mb,
                    gone.swept_session ? " and its session directory" : "");
    }
    resume_ranks(d, ranks, adopted);
    /* the steps made while no driver watched, said in driver_resumed (before, the state's
     * older step: "taken over at step 37" of a job at step 60) */
    if (job || d->lost_pid) {
        int m = sup_metrics_step(d);
        if (m > d->best_step) d->best_step = m;
    }
    say_resumed(d, prev_pid, adopted);
    cJSON_Delete(o);
    return 0;
}
