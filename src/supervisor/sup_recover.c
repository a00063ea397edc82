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

void sup_faults_format(const sup_driver *d, int diag, int after_step, char *buf, size_t n) {
    ms_fault_plan *sub = calloc(1, sizeof *sub);
    buf[0] = 0;
    if (!sub) return;
    for (int i = 0; i < d->plan.n; i++)
        if (!strncmp(d->plan.f[i].kind, "diag:", 5) == !!diag) sub->f[sub->n++] = d->plan.f[i];
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

/* The self-test on every node not on the blocklist; evicts the ones that
 * fail.  0 to go on, or SUP_EXIT_STORAGE. */
static int diagnose(sup_driver *d) {
    sup_nodes *p = d->pool;
    const sup_config *c = d->c;
    int idx[SUP_MAX_NODES], k = 0;
    for (int i = 0; i < p->n; i++)
        if (!p->blocked[i][0]) idx[k++] = i;
    if (!k) return 0;
    sup_diag_result *res = calloc((size_t)k, sizeof *res);
    char faults[4096], why[600] = "", probe[sizeof d->ckpt_dir];
    storage_probe_dir(d->ckpt_dir, probe, sizeof probe);
    sup_faults_format(d, 1, -1, faults, sizeof faults);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    sup_diag_config dc = {.mpirun = c->mpirun ? c->mpirun : "mpirun",
                          .bin = c->bin,
                          .storage_dir = d->ckpt_dir[0] ? probe : NULL,
                          .history_dir = d->diag_dir,
                          .device = d->device[0] ? d->device : NULL,
                          .faults = faults,
                          .stop = d->stop_flag,
                          .timeout = c->diag_timeout,
                          .slow_factor = c->diag_slow_factor,
                          .threads = c->hostfile ? 0 : (int)(cores / k > 1 ? cores / k : 1),
                          .pool = p,
                          .hostfile = c->hostfile ? d->hostfile_path : NULL,
                          .tick = serve_ctl,
                          .tick_arg = d};
    double t0 = ms_now();
    ms_mkdirs(d->diag_dir); /* here, not by each diag rank at once */
    int rc = res ? sup_diag_run(&dc, idx, k, res, why, sizeof why) : -1;
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
    double took = ms_now() - t0;
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
        sup_events_put(&d->ev, "diag", f);
        fprintf(stderr, "megascale launch: diag: node %s: %s%s%s\n", p->name[idx[j]],
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
        int code = diagnose(d);
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
    cJSON_AddStringToObject(o, "node_map", d->node_map);
    cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
    for (int i = 0; i < d->c->np; i++) {
        cJSON *r = cJSON_CreateArray();
        cJSON_AddItemToArray(r, cJSON_CreateNumber(running ? d->r[i].pid : 0));
        cJSON_AddItemToArray(r, cJSON_CreateNumber((double)d->r[i].pid_start));
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
    cJSON_AddNumberToObject(o, "max_interval", d->max_interval);
    cJSON_AddNumberToObject(o, "t0", d->ev.t0);
    cJSON_AddNumberToObject(o, "anomalies", d->n_anomalies);
    cJSON_AddStringToObject(o, "latest0", d->latest0);
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
    pid_t p = (pid_t)pid;
    if (p <= 0 || start <= 0 || !sup_pid_alive(p)) return 0;
    return sup_pid_start(p) == (unsigned long long)start ? p : 0;
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
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(o, "finished");
    if (!bad && cJSON_IsTrue(fin)) { /* that job ended: this is a new one */
        cJSON_Delete(o);
        return 0;
    }
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(o, "token");
    const cJSON *hb = cJSON_GetObjectItemCaseSensitive(o, "heartbeat");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks");
    const cJSON *faults = cJSON_GetObjectItemCaseSensitive(o, "faults");
    double prev_pid = num(o, "pid", &bad), mp = num(o, "mpirun_pid", &bad),
           mps = num(o, "mpirun_start", &bad);
    d->restarts = (int)num(o, "restarts", &bad);
    d->no_progress = (int)num(o, "no_progress", &bad);
    d->best_step = (int)num(o, "best_step", &bad);
    d->start_step = (int)num(o, "start_step", &bad);
    d->faults_through = (int)num(o, "faults_through", &bad);
    d->ev.redone = (int)num(o, "redone", &bad);
    d->step_ms_sum = num(o, "step_ms_sum", &bad);
    d->step_ms_n = (long)num(o, "step_ms_n", &bad);
    d->max_interval = num(o, "max_interval", &bad);
    d->n_anomalies = (int)num(o, "anomalies", &bad);
    double t0 = num(o, "t0", &bad);
    d->attempt_no = (int)num(o, "attempt", &bad);
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
    const cJSON *l0 = cJSON_GetObjectItemCaseSensitive(o, "latest0"); /* absent: any commit */
    snprintf(d->latest0, sizeof d->latest0, "%s", cJSON_IsString(l0) ? l0->valuestring : "");
    for (const cJSON *f = faults->child; f && d->ev.n_faults < SUP_MAX_FAULTS; f = f->next) {
        const cJSON *k = cJSON_GetArrayItem(f, 0), *de = cJSON_GetArrayItem(f, 1),
                    *re = cJSON_GetArrayItem(f, 2);
        if (!cJSON_IsString(k) || !cJSON_IsNumber(de) || !cJSON_IsNumber(re)) continue;
        int i = d->ev.n_faults++;
        snprintf(d->ev.kinds[i], sizeof d->ev.kinds[i], "%s", k->valuestring);
        d->ev.detect_s[i] = de->valuedouble >= 0 ? de->valuedouble : NAN;
        d->ev.recover_s[i] = re->valuedouble >= 0 ? re->valuedouble : NAN;
    }
    const cJSON *pf = cJSON_GetObjectItemCaseSensitive(o, "pending_fault"); /* absent: none */
    const cJSON *saf = cJSON_GetObjectItemCaseSensitive(o, "step_at_fault");
    const cJSON *rfrom = cJSON_GetObjectItemCaseSensitive(o, "recovery_from");
    if (cJSON_IsNumber(pf) && pf->valuedouble >= 0 && pf->valuedouble < d->ev.n_faults &&
        cJSON_IsNumber(saf) && cJSON_IsNumber(rfrom) && rfrom->valuedouble > 0) {
        d->pending_recovery = 1;
        d->pending_fault = (int)pf->valuedouble;
        d->step_at_fault = (int)saf->valuedouble;
        d->t_recovery_from = ms_now() - (ms_wall_now() - rfrom->valuedouble);
    }
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(o, "recovering"); /* absent: no */
    const cJSON *rpb = cJSON_GetObjectItemCaseSensitive(o, "recover_prev_best");
    pid_t job = same_process(mp, mps);
    int adopted = 0;
    /* stopped after a fault, not restarted yet: no job to adopt, the restart is this one's */
    d->recovering = cJSON_IsTrue(rec) && !job;
    d->recover_prev_best = cJSON_IsNumber(rpb) ? (int)rpb->valuedouble : d->best_step;
    if (job) {
        /* its ranks reconnect to the same address with the same token */
        snprintf(d->token, sizeof d->token, "%s", tok->valuestring);
        snprintf(d->addr, sizeof d->addr, "%s", hb->valuestring);
        d->adopt_pid = job;
        adopted = 1;
    }
    int i = 0;
    for (const cJSON *r = ranks->child; r && i < d->c->np; r = r->next, i++) {
        const cJSON *pid = cJSON_GetArrayItem(r, 0), *st = cJSON_GetArrayItem(r, 1);
        if (!cJSON_IsNumber(pid) || !cJSON_IsNumber(st)) continue;
        pid_t p = same_process(pid->valuedouble, st->valuedouble);
        d->adopt_pids[i] = p;
        d->adopt_starts[i] = p ? (unsigned long long)st->valuedouble : 0;
        if (p && !adopted) kill(p, SIGKILL); /* a rank its mpirun left behind */
    }
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "previous_pid", prev_pid);
    cJSON_AddBoolToObject(f, "adopted", adopted);
    cJSON_AddNumberToObject(f, "step", d->best_step);
    cJSON_AddNumberToObject(f, "restarts", d->restarts);
    sup_events_put(&d->ev, "driver_resumed", f);
    fprintf(stderr,
            "megascale launch: resuming from %s (driver pid %.0f is gone): %s at step %d, %d "
            "restart(s) so far\n",
            d->state_path, prev_pid,
            adopted ? "its job still runs and is taken over" : "its job is gone; restarting it",
            d->best_step, d->restarts);
    cJSON_Delete(o);
    return 0;
}
