/* sup_diag.c - `megascale diag` on the nodes after a fault: one mpirun,
 * one rank a node (so the comm check is an all-reduce among the nodes),
 * each printing its report as one JSON line; a node whose report does
 * not come back within the timeout failed.  Or one mpirun per node, all
 * at once (sup_diag_run_each: the second try, when some gave no report). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/shm_sweep.h"
#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

#define DIAG_OUT_MAX (1 << 20)
/* a stopped diag run: how long its mpirun has to end its ranks (SIGTERM) before SIGKILL */
#define DIAG_TERM_S 3.0

static const char *const SPEED_CHECK[SUP_DIAG_SPEEDS] = {"gemm", "memory"};
static const char *const SPEED_UNIT[SUP_DIAG_SPEEDS] = {"GFLOP/s", "GB/s"};

/* A failed check into r: its name on the failed list (once), its detail. */
static void add_failure(sup_diag_result *r, const char *name, const char *detail) {
    size_t fl = strlen(r->failed), dl = strlen(r->detail), nl = strlen(name);
    int listed = 0;
    for (const char *q = r->failed; (q = strstr(q, name)) != NULL; q += nl)
        listed |= (q == r->failed || q[-1] == ' ') && (q[nl] == ',' || !q[nl]);
    if (!listed && fl < sizeof r->failed)
        snprintf(r->failed + fl, sizeof r->failed - fl, "%s%s", fl ? ", " : "", name);
    if (detail && dl < sizeof r->detail)
        snprintf(r->detail + dl, sizeof r->detail - dl, "%s%s: %s", dl ? "; " : "", name, detail);
}

/* One report line into the result of its node. */
static void take_report(const char *line, size_t len, const sup_nodes *pool, const int *idx, int k,
                        sup_diag_result *out) {
    cJSON *o = cJSON_ParseWithLength(line, len);
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(o, "node");
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(o, "ok");
    const cJSON *checks = cJSON_GetObjectItemCaseSensitive(o, "checks");
    int j = -1;
    for (int i = 0; cJSON_IsString(node) && i < k; i++)
        if (!strcmp(pool->name[idx[i]], node->valuestring)) j = i;
    if (j < 0 || !cJSON_IsBool(ok)) {
        cJSON_Delete(o);
        return;
    }
    sup_diag_result *r = &out[j];
    r->reported = 1;
    r->ok = cJSON_IsTrue(ok);
    r->failed[0] = r->detail[0] = 0;
    memset(r->slow, 0, sizeof r->slow);
    r->hard = 0;
    for (const cJSON *c = cJSON_IsArray(checks) ? checks->child : NULL; c; c = c->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        const cJSON *cok = cJSON_GetObjectItemCaseSensitive(c, "ok");
        const cJSON *detail = cJSON_GetObjectItemCaseSensitive(c, "detail");
        const cJSON *value = cJSON_GetObjectItemCaseSensitive(c, "value");
        const cJSON *slow = cJSON_GetObjectItemCaseSensitive(c, "slow");
        if (!cJSON_IsString(name)) continue;
        int failed = !cJSON_IsTrue(cok), speed = -1;
        for (int s = 0; s < SUP_DIAG_SPEEDS; s++)
            if (!strcmp(name->valuestring, SPEED_CHECK[s])) speed = s;
        if (speed >= 0 && cJSON_IsNumber(value) && value->valuedouble > 0)
            r->speed[speed] = value->valuedouble;
        if (speed >= 0 && failed) r->slow[speed] = cJSON_IsTrue(slow) ? 1 : 2;
        r->hard |= failed && !(speed >= 0 && cJSON_IsTrue(slow));
        if (failed)
            add_failure(r, name->valuestring, cJSON_IsString(detail) ? detail->valuestring : NULL);
    }
    r->hard |= !r->ok && !r->failed[0]; /* failed, naming no check */
    cJSON_Delete(o);
}

int sup_diag_slow_only(const sup_diag_result *r) {
    return r->reported && !r->ok && !r->hard;
}

void sup_diag_best_of_two(sup_diag_result *r, const sup_diag_result *again) {
    if (!again->reported) return;
    int left = 0;
    char first[sizeof r->detail], passed[64] = "";
    for (int s = 0; s < SUP_DIAG_SPEEDS; s++) {
        if (again->speed[s] > r->speed[s]) r->speed[s] = again->speed[s];
        if (r->slow[s] == 1 && !again->slow[s]) {
            r->slow[s] = 0;
            snprintf(passed + strlen(passed), sizeof passed - strlen(passed), "%s%s",
                     passed[0] ? ", " : "", SPEED_CHECK[s]);
        }
        left += r->slow[s] != 0;
    }
    if (r->ok || r->hard) return;
    snprintf(first, sizeof first, "%s", r->detail);
    if (!left) { /* slow the first time only */
        r->ok = 1;
        r->failed[0] = 0;
        snprintf(r->detail, sizeof r->detail, "passed when measured once more (the first time: %s)",
                 first);
        return;
    }
    r->failed[0] = 0; /* the checks still failed, named again */
    for (int s = 0; s < SUP_DIAG_SPEEDS; s++)
        if (r->slow[s]) add_failure(r, SPEED_CHECK[s], NULL);
    snprintf(r->detail, sizeof r->detail, "%s; slow again when measured once more%s%s%s", first,
             passed[0] ? " (" : "", passed, passed[0] ? " passed then)" : "");
}

int sup_diag_peers(sup_diag_result *res, int k, double factor) {
    if (k > SUP_MAX_NODES) k = SUP_MAX_NODES;
    double others[SUP_MAX_NODES], med[SUP_MAX_NODES];
    int slow[SUP_MAX_NODES] = {0}, n_failed = 0;
    for (int s = 0; s < SUP_DIAG_SPEEDS; s++) {
        /* judged against the speeds before any was failed here: the
         * medians do not depend on the order of the nodes */
        int has[SUP_MAX_NODES] = {0};
        for (int j = 0; j < k; j++) {
            int m = 0;
            for (int i = 0; i < k; i++)
                if (i != j && res[i].reported && res[i].speed[s] > 0) others[m++] = res[i].speed[s];
            if (!m || !res[j].reported || !(res[j].speed[s] > 0)) continue;
            qsort(others, (size_t)m, sizeof *others, sup_cmp_double);
            med[j] = m % 2 ? others[m / 2] : 0.5 * (others[m / 2 - 1] + others[m / 2]);
            has[j] = 1;
        }
        for (int j = 0; j < k; j++) {
            if (!has[j] || !(res[j].speed[s] < factor * med[j])) continue;
            char d[200];
            snprintf(d, sizeof d,
                     "%.4g %s, %.2f x the median %.4g %s of the other nodes (below %g)",
                     res[j].speed[s], SPEED_UNIT[s], res[j].speed[s] / med[j], med[j],
                     SPEED_UNIT[s], factor);
            add_failure(&res[j], SPEED_CHECK[s], d);
            res[j].ok = 0;
            n_failed += !slow[j];
            slow[j] = 1;
        }
    }
    return n_failed;
}

/* One diag mpirun in flight: its process group and the read end of its
 * stdout; what it printed so far. */
typedef struct {
    pid_t pid;
    int fd;
    char *buf;
    size_t len;
} diag_proc;

/* Start diag on nodes idx[0..k) (hostfile: where their hostfile goes). */
static int diag_spawn(const sup_diag_config *c, const int *idx, int k, const char *hostfile,
                      diag_proc *dp, char *why, size_t n) {
    memset(dp, 0, sizeof *dp);
    dp->fd = -1;
    char map[SUP_MAX_NODES * SUP_NODE_NAME], np[16], threads[16], slow[32];
    sup_nodes_map(c->pool, idx, k, map, sizeof map);
    snprintf(np, sizeof np, "%d", k);
    snprintf(threads, sizeof threads, "%d", c->threads);
    snprintf(slow, sizeof slow, "%g", c->slow_factor);
    if (hostfile && sup_nodes_write_hostfile(c->pool, idx, k, 1, hostfile, why, n) != 0) return -1;
    const char *argv[48];
    int a = 0;
    argv[a++] = c->mpirun;
    if (getuid() == 0) argv[a++] = "--allow-run-as-root";
    if (hostfile)
        argv[a++] = "--hostfile", argv[a++] = hostfile, argv[a++] = "--map-by", argv[a++] = "node";
    else
        argv[a++] = "--oversubscribe";
    argv[a++] = "-np", argv[a++] = np;
    argv[a++] = c->bin, argv[a++] = "diag", argv[a++] = "--json";
    argv[a++] = "--fail-exit", argv[a++] = "0"; /* a failing rank must not end the others */
    argv[a++] = "--node-map", argv[a++] = map;
    argv[a++] = "--threads", argv[a++] = threads;
    argv[a++] = "--slow-factor", argv[a++] = slow;
    argv[a++] = "--gemm-n", argv[a++] = "128";
    /* the speed at 1024^3 on a CPU (2 GFLOP a product, tens of ms): diag
     * is on the recovery's path, and 2048^3 cost it about a second (bench/chaos,
     * docs/perf.md); a GPU's default, 8192^3 in bf16, takes milliseconds */
    if (!c->device || !strcmp(c->device, "cpu")) argv[a++] = "--gemm-speed-n", argv[a++] = "1024";
    argv[a++] = "--mem-mb", argv[a++] = "64";
    argv[a++] = "--storage-mb", argv[a++] = "8";
    if (c->device) argv[a++] = "--device", argv[a++] = c->device;
    if (c->history_dir) argv[a++] = "--history-dir", argv[a++] = c->history_dir;
    if (c->storage_dir) argv[a++] = "--storage-dir", argv[a++] = c->storage_dir;
    if (c->faults && *c->faults) argv[a++] = "--inject-fault", argv[a++] = c->faults;
    argv[a] = NULL;

    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return snprintf(why, n, "pipe: %s", strerror(errno)), -1;
    if (!(dp->buf = malloc(DIAG_OUT_MAX + 1))) {
        close(fds[0]), close(fds[1]);
        return snprintf(why, n, "out of memory"), -1;
    }
    fflush(NULL);
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        free(dp->buf), dp->buf = NULL;
        return snprintf(why, n, "fork: %s", strerror(errno)), -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        /* a driver killed (-9) during diag: mpirun is told, and ends its ranks (nothing
         * adopts a diag run, as a successor adopts the job) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        dup2(fds[1], 1);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "megascale launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    close(fds[1]);
    dp->pid = pid;
    dp->fd = fds[0];
    return 0;
}

/* Read every run's output until it closes or the timeout passes (then its
 * process group is killed); 1 if the timeout passed. */
static int diag_collect(diag_proc *dp, int m, const sup_diag_config *c) {
    double timeout = c->timeout;
    const volatile sig_atomic_t *stop = c->stop;
    double t_end = ms_now() + timeout;
    int open_n = m, timed_out = 0;
    struct pollfd p[SUP_MAX_NODES];
    while (open_n > 0) {
        int left = (int)((t_end - ms_now()) * 1e3);
        if (left <= 0 || (stop && *stop)) { /* the driver was told to stop: no waiting */
            timed_out = 1;
            break;
        }
        for (int i = 0; i < m; i++)
            p[i] = (struct pollfd){.fd = dp[i].fd, .events = POLLIN};
        if (poll(p, (nfds_t)m, left < 200 ? left : 200) < 0 && errno != EINTR) break;
        if (c->tick) c->tick(c->tick_arg);
        for (int i = 0; i < m; i++) {
            if (dp[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t got = dp[i].len < DIAG_OUT_MAX
                              ? read(dp[i].fd, dp[i].buf + dp[i].len, DIAG_OUT_MAX - dp[i].len)
                              : read(dp[i].fd, (char[256]){0}, 256);
            if (got > 0 && dp[i].len < DIAG_OUT_MAX) dp[i].len += (size_t)got;
            if (got <= 0) close(dp[i].fd), dp[i].fd = -1, open_n--;
        }
    }
    for (int i = 0; i < m; i++) /* mpirun ends its ranks on SIGTERM (SIGKILL left them) */
        if (timed_out) kill(-dp[i].pid, SIGTERM);
    const double t_term = ms_now() + DIAG_TERM_S; /* one grace for all of them */
    for (int i = 0; i < m; i++) {
        if (dp[i].fd >= 0) close(dp[i].fd), dp[i].fd = -1;
        int st = 0;
        while (timed_out && ms_now() < t_term) {
            pid_t w = waitpid(dp[i].pid, &st, WNOHANG);
            if (w == dp[i].pid || (w < 0 && errno != EINTR)) break;
            usleep(20000);
        }
        if (timed_out) kill(-dp[i].pid, SIGKILL);
        while (waitpid(dp[i].pid, &st, 0) < 0 && errno == EINTR) {
        }
        kill(-dp[i].pid, SIGKILL); /* anything of its group left */
        if (timed_out && !sup_pid_alive(dp[i].pid)) { /* a killed mpirun's session directory */
            char tmp[512];
            sup_mpirun_tmpdir(tmp, sizeof tmp);
            ms_sweep_mpirun_session(tmp, (long)dp[i].pid);
        }
    }
    if (timed_out) { /* and its ranks' shared-memory segments here */
        ms_sweep_result r;
        ms_sweep_mpi_shm(1, &r);
    }
    return timed_out;
}

/* The reports in a run's output into out (nodes idx[0..k)); frees it. */
static void diag_take(diag_proc *dp, const sup_nodes *pool, const int *idx, int k,
                      sup_diag_result *out, int timed_out) {
    for (size_t i = 0; dp->buf && i < dp->len;) {
        char *nl = memchr(dp->buf + i, '\n', dp->len - i);
        size_t e = nl ? (size_t)(nl - dp->buf) : dp->len;
        if (e > i && dp->buf[i] == '{') take_report(dp->buf + i, e - i, pool, idx, k, out);
        i = e + 1;
    }
    free(dp->buf);
    dp->buf = NULL;
    for (int j = 0; j < k; j++)
        if (!out[j].reported)
            snprintf(out[j].detail, sizeof out[j].detail, "no report from node %s %s",
                     pool->name[idx[j]],
                     timed_out ? "within the diag timeout" : "(the self-test did not run there)");
}

int sup_diag_run(const sup_diag_config *c, const int *idx, int k, sup_diag_result *out, char *why,
                 size_t n) {
    memset(out, 0, sizeof *out * (size_t)k);
    diag_proc dp;
    if (diag_spawn(c, idx, k, c->hostfile, &dp, why, n) != 0) return -1;
    int timed_out = diag_collect(&dp, 1, c);
    diag_take(&dp, c->pool, idx, k, out, timed_out);
    return 0;
}

int sup_diag_run_each(const sup_diag_config *c, const int *idx, int k, sup_diag_result *out,
                      char *why, size_t n) {
    diag_proc dp[SUP_MAX_NODES];
    int m = 0, rc = 0;
    MS_CHECK(k <= SUP_MAX_NODES);
    for (int j = 0; j < k; j++) {
        memset(&out[j], 0, sizeof out[j]);
        char hf[4300];
        if (c->hostfile) snprintf(hf, sizeof hf, "%s.%s", c->hostfile, c->pool->name[idx[j]]);
        if (diag_spawn(c, &idx[j], 1, c->hostfile ? hf : NULL, &dp[m], why, n) != 0) {
            rc = -1;
            break;
        }
        m++;
    }
    int timed_out = m ? diag_collect(dp, m, c) : 0;
    for (int j = 0; j < m; j++) {
        diag_take(&dp[j], c->pool, &idx[j], 1, &out[j], timed_out);
        if (c->hostfile) { /* the per-node hostfiles are of this run only */
            char hf[4300];
            snprintf(hf, sizeof hf, "%s.%s", c->hostfile, c->pool->name[idx[j]]);
            unlink(hf);
        }
    }
    return rc;
}
