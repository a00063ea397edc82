/* sup_diag.c - `megascale diag` on the nodes after a fault: one mpirun,
 * one rank a node (so the comm check is an all-reduce among the nodes),
 * each printing its report as one JSON line; a node whose report does
 * not come back within the timeout failed. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

#define DIAG_OUT_MAX (1 << 20)
#define DIAG_ERR_TAIL 2048

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
    size_t fl = 0, dl = 0;
    r->failed[0] = r->detail[0] = 0;
    for (const cJSON *c = cJSON_IsArray(checks) ? checks->child : NULL; c; c = c->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        const cJSON *cok = cJSON_GetObjectItemCaseSensitive(c, "ok");
        const cJSON *detail = cJSON_GetObjectItemCaseSensitive(c, "detail");
        if (!cJSON_IsString(name) || cJSON_IsTrue(cok)) continue;
        if (fl < sizeof r->failed)
            fl += (size_t)snprintf(r->failed + fl, sizeof r->failed - fl, "%s%s", fl ? ", " : "",
                                   name->valuestring);
        if (dl < sizeof r->detail && cJSON_IsString(detail))
            dl += (size_t)snprintf(r->detail + dl, sizeof r->detail - dl, "%s%s: %s",
                                   dl ? "; " : "", name->valuestring, detail->valuestring);
    }
    cJSON_Delete(o);
}

int sup_diag_run(const sup_diag_config *c, const int *idx, int k, sup_diag_result *out, char *why,
                 size_t n) {
    memset(out, 0, sizeof *out * (size_t)k);
    char map[SUP_MAX_NODES * SUP_NODE_NAME], np[16], threads[16], slow[32];
    sup_nodes_map(c->pool, idx, k, map, sizeof map);
    snprintf(np, sizeof np, "%d", k);
    snprintf(threads, sizeof threads, "%d", c->threads);
    snprintf(slow, sizeof slow, "%g", c->slow_factor);
    if (c->hostfile && sup_nodes_write_hostfile(c->pool, idx, k, 1, c->hostfile, why, n) != 0)
        return -1;
    const char *argv[48];
    int a = 0;
    argv[a++] = c->mpirun;
    if (getuid() == 0) argv[a++] = "--allow-run-as-root";
    if (c->hostfile)
        argv[a++] = "--hostfile", argv[a++] = c->hostfile, argv[a++] = "--map-by",
        argv[a++] = "node";
    else
        argv[a++] = "--oversubscribe";
    argv[a++] = "-np", argv[a++] = np;
    argv[a++] = c->bin, argv[a++] = "diag", argv[a++] = "--json";
    argv[a++] = "--fail-exit", argv[a++] = "0"; /* a failing rank must not end the others */
    argv[a++] = "--node-map", argv[a++] = map;
    argv[a++] = "--threads", argv[a++] = threads;
    argv[a++] = "--slow-factor", argv[a++] = slow;
    argv[a++] = "--gemm-n", argv[a++] = "128";
    argv[a++] = "--mem-mb", argv[a++] = "64";
    argv[a++] = "--storage-mb", argv[a++] = "8";
    if (c->device) argv[a++] = "--device", argv[a++] = c->device;
    if (c->history_dir) argv[a++] = "--history-dir", argv[a++] = c->history_dir;
    if (c->storage_dir) argv[a++] = "--storage-dir", argv[a++] = c->storage_dir;
    if (c->faults && *c->faults) argv[a++] = "--inject-fault", argv[a++] = c->faults;
    argv[a] = NULL;

    int fds[2], efd[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return snprintf(why, n, "pipe: %s", strerror(errno)), -1;
    if (pipe2(efd, O_CLOEXEC) != 0) {
        close(fds[0]), close(fds[1]);
        return snprintf(why, n, "pipe: %s", strerror(errno)), -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]), close(efd[0]), close(efd[1]);
        return snprintf(why, n, "fork: %s", strerror(errno)), -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fds[1], 1);
        dup2(efd[1], 2);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "megascale launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    close(fds[1]);
    close(efd[1]);
    char *buf = malloc(DIAG_OUT_MAX + 1);
    size_t len = 0;
    char err[DIAG_ERR_TAIL + 1]; /* the tail of what mpirun and the ranks said on stderr */
    size_t elen = 0;
    double t_end = ms_now() + c->timeout;
    int timed_out = 0, open_fds = 2;
    struct pollfd p[2] = {{.fd = fds[0], .events = POLLIN}, {.fd = efd[0], .events = POLLIN}};
    double out_closed = 0; /* when stdout closed: stderr gets 1 s more, not the timeout */
    while (open_fds > 0 && !(out_closed > 0 && ms_now() > out_closed + 1.0)) {
        int left = (int)((t_end - ms_now()) * 1e3);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        if (poll(p, 2, left < 200 ? left : 200) < 0 && errno != EINTR) break;
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t got = buf && len < DIAG_OUT_MAX ? read(fds[0], buf + len, DIAG_OUT_MAX - len)
                                                    : read(fds[0], (char[256]){0}, 256);
            if (got <= 0) p[0].fd = -1, open_fds--, out_closed = ms_now();
            if (got > 0 && buf && len < DIAG_OUT_MAX) len += (size_t)got;
        }
        if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            char chunk[1024];
            _Static_assert(sizeof chunk < DIAG_ERR_TAIL, "one read fits the tail");
            ssize_t got = read(efd[0], chunk, sizeof chunk);
            if (got <= 0) {
                p[1].fd = -1, open_fds--;
            } else { /* passed on (the driver's log), and its tail kept */
                ssize_t w = write(2, chunk, (size_t)got);
                (void)w;
                size_t g = (size_t)got; /* < DIAG_ERR_TAIL (chunk's size) */
                size_t keep = elen + g > DIAG_ERR_TAIL ? DIAG_ERR_TAIL - g : elen;
                memmove(err, err + elen - keep, keep);
                memcpy(err + keep, chunk, g);
                elen = keep + g;
            }
        }
    }
    close(fds[0]);
    close(efd[0]);
    if (timed_out) kill(-pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    kill(-pid, SIGKILL); /* anything of its group left */
    err[elen] = 0;
    char said[DIAG_ERR_TAIL + 64]; /* its last lines on one line, for the event */
    size_t sl = 0;
    for (size_t i = 0; i < elen && sl + 2 < sizeof said; i++) {
        char ch = err[i] == '\n' || err[i] == '\r' || err[i] == '\t' ? ' ' : err[i];
        if ((unsigned char)ch < 0x20 || (ch == ' ' && sl && said[sl - 1] == ' ')) continue;
        said[sl++] = ch;
    }
    said[sl] = 0;
    char status[64];
    if (WIFEXITED(st))
        snprintf(status, sizeof status, "mpirun exited %d", WEXITSTATUS(st));
    else
        snprintf(status, sizeof status, "mpirun killed by signal %d",
                 WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    for (size_t i = 0; buf && i < len;) {
        char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) : len;
        if (e > i && buf[i] == '{') take_report(buf + i, e - i, c->pool, idx, k, out);
        i = e + 1;
    }
    free(buf);
    for (int j = 0; j < k; j++)
        if (!out[j].reported)
            snprintf(out[j].detail, sizeof out[j].detail, "no report from node %s %s (%s%s%.300s)",
                     c->pool->name[idx[j]],
                     timed_out ? "within the diag timeout" : "(the self-test did not run there)",
                     timed_out ? "killed at the timeout" : status, sl ? "; its stderr ends: " : "",
                     sl > 300 ? said + sl - 300 : said);
    return 0;
}
