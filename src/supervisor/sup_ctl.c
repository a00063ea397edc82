/* sup_ctl.c - the control socket (docs/formats.md, "Control messages"):
 * `megascale launch --ctl RUN_DIR CMD [ARG]` reads the driver's address
 * and token from RUN_DIR/control.json (mode 0600: only the job's owner
 * can read the token), sends one line {"v": 1, "token": T, "cmd": CMD,
 * "node": NODE} and prints the one-line reply.  The driver parses the line
 * strictly (sup_ctl_parse) and answers {"ok": bool, "msg": TEXT}. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/jsonstr.h"
#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

#define CTL_FILE_MAX 4096
#define CTL_REPLY_MAX (1 << 20) /* a status of 1024 nodes with blocklist reasons: < 300 KiB */
#define CTL_TRIES 5             /* a request the driver dropped unread is sent again (exchange) */

int sup_ctl_write(const char *run_dir, const char *addr, const char *token, char *why, size_t n) {
    char path[4200], text[512];
    snprintf(path, sizeof path, "%s/control.json", run_dir);
    snprintf(text, sizeof text, "{\"v\": 1, \"addr\": \"%s\", \"token\": \"%s\", \"pid\": %d}\n",
             addr, token, (int)getpid());
    return sup_file_private(path, text, why, n);
}

int sup_file_private(const char *path, const char *text, char *why, size_t n) {
    ms_atomic_file af;
    ms_status st = ms_atomic_open(&af, path);
    if (st == MS_OK && fchmod(fileno(af.f), 0600) != 0)
        st = ms_error(MS_ERR_IO, "%s: chmod: %s", path, strerror(errno));
    if (st == MS_OK) st = ms_atomic_write(&af, text, strlen(text));
    if (st == MS_OK) st = ms_atomic_commit(&af);
    if (st != MS_OK) {
        ms_atomic_abort(&af);
        return snprintf(why, n, "%s", ms_errmsg()), -1;
    }
    return 0;
}

int sup_ctl_parse(const char *line, size_t len, const char *token, sup_ctl_msg *out,
                  const char **why) {
    memset(out, 0, sizeof *out);
    if (len == 0 || len > SUP_CTL_LINE_MAX || ms_json_has_nul(line, len))
        return *why = "empty, oversized or a NUL byte (raw or \\u0000)", -1;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    int rc = -1;
    *why = "not a JSON object";
    if (!cJSON_IsObject(o)) goto out;
    while (end && end < line + len && (*end == ' ' || *end == '\r' || *end == '\t'))
        end++;
    if (end != line + len) {
        *why = "text after the object";
        goto out;
    }
    for (const cJSON *it = o->child; it; it = it->next) {
        static const char *const known[] = {"v", "token", "cmd", "node"};
        int k = 0;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            k |= it->string && !strcmp(it->string, known[i]);
        for (const cJSON *j = o->child; k && j != it; j = j->next)
            if (!strcmp(j->string, it->string)) k = 0;
        if (!k) {
            *why = "unknown or duplicate field";
            goto out;
        }
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "v");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(o, "token");
    const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(o, "cmd");
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(o, "node");
    if (!cJSON_IsNumber(v) || v->valuedouble != 1) {
        *why = "not version 1";
        goto out;
    }
    if (!cJSON_IsString(tok) || !sup_token_eq(tok->valuestring, token)) {
        *why = "wrong token";
        goto out;
    }
    if (!cJSON_IsString(cmd) ||
        (strcmp(cmd->valuestring, "evict") && strcmp(cmd->valuestring, "status") &&
         strcmp(cmd->valuestring, "dump"))) {
        *why = "unknown command (evict, status, dump)";
        goto out;
    }
    snprintf(out->cmd, sizeof out->cmd, "%s", cmd->valuestring);
    if (!strcmp(out->cmd, "evict")) {
        if (!cJSON_IsString(node) || !ms_node_name_ok(node->valuestring)) {
            *why = "evict needs a node name";
            goto out;
        }
        snprintf(out->node, sizeof out->node, "%s", node->valuestring);
    } else if (node) {
        *why = "status and dump take no node";
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

/* RUN_DIR/control.json: the address and the token. */
static int read_control(const char *run_dir, char *addr, size_t an, char *token, size_t tn) {
    char path[4200];
    snprintf(path, sizeof path, "%s/control.json", run_dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr,
                "megascale launch --ctl: error: %s: %s (is a driver running with --run-dir "
                "%s?)\n",
                path, strerror(errno), run_dir);
        return -1;
    }
    char *text = NULL;
    size_t len = 0;
    if (ms_file_read_max(path, CTL_FILE_MAX, &text, &len) != MS_OK) {
        fprintf(stderr, "megascale launch --ctl: error: %s\n", ms_errmsg());
        return -1;
    }
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "addr");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "token");
    int ok = cJSON_IsString(a) && cJSON_IsString(t) && strlen(a->valuestring) < an &&
             strlen(t->valuestring) < tn;
    if (ok) {
        snprintf(addr, an, "%s", a->valuestring);
        snprintf(token, tn, "%s", t->valuestring);
    } else {
        fprintf(stderr, "megascale launch --ctl: error: %s: not a control file (addr, token)\n",
                path);
    }
    cJSON_Delete(o);
    return ok ? 0 : -1;
}

/* One request: connect to sa, send line (len bytes, its newline included), print the reply.
 * *again: the driver closed the connection before a reply (or the send failed), so it did not
 * act on the request. */
static int exchange(const struct sockaddr_in *sa, const char *addr, const char *run_dir,
                    const char *line, size_t len, char *reply, const char *cmd, int *again) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {.tv_sec = 10};
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (fd < 0 || connect(fd, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        int e = errno;
        fprintf(stderr, "megascale launch --ctl: error: cannot reach the driver at %s: %s%s%s%s\n",
                addr, strerror(e), e == ECONNREFUSED ? " (is a driver running with --run-dir " : "",
                e == ECONNREFUSED ? run_dir : "",
                e == ECONNREFUSED ? "? Its control.json is one a driver that ended left)" : "");
        if (fd >= 0) close(fd);
        return SUP_EXIT_ERROR;
    }
    int rc = SUP_EXIT_ERROR;
    size_t got_len = 0;
    if (send(fd, line, len, MSG_NOSIGNAL) != (ssize_t)len) {
        *again = errno == EPIPE || errno == ECONNRESET;
        if (!*again)
            fprintf(stderr, "megascale launch --ctl: error: cannot send to the driver at %s: %s\n",
                    addr, strerror(errno));
        close(fd);
        return rc;
    }
    ssize_t got = 0;
    while (got_len < CTL_REPLY_MAX &&
           (got = recv(fd, reply + got_len, CTL_REPLY_MAX - got_len, 0)) > 0)
        got_len += (size_t)got;
    int reset = got_len == 0 && (got == 0 || errno == ECONNRESET);
    reply[got_len] = 0;
    close(fd);
    if (reset) {
        *again = 1;
        return rc;
    }
    cJSON *r = cJSON_Parse(reply);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(r, "ok");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(r, "msg");
    if (cJSON_IsBool(ok)) {
        if (cJSON_IsTrue(ok) && !strcmp(cmd, "status"))
            printf("%s", reply); /* the state, as JSON */
        else
            fprintf(
                cJSON_IsTrue(ok) ? stdout : stderr, "megascale launch --ctl: %s%s\n",
                cJSON_IsTrue(ok) ? "" : "refused: ", cJSON_IsString(msg) ? msg->valuestring : "");
        rc = cJSON_IsTrue(ok) ? 0 : SUP_EXIT_ERROR;
    } else {
        fprintf(stderr, "megascale launch --ctl: error: no reply from the driver at %s\n", addr);
    }
    cJSON_Delete(r);
    return rc;
}

int sup_ctl_client(const char *run_dir, int argc, char **argv) {
    int bare = argc >= 1 && (!strcmp(argv[0], "status") || !strcmp(argv[0], "dump"));
    if (argc < 1 || (strcmp(argv[0], "evict") && !bare) ||
        (!strcmp(argv[0], "evict") && argc != 2) || (bare && argc != 1)) {
        fprintf(stderr, "usage: megascale launch --ctl RUN_DIR evict NODE | status | dump\n");
        return SUP_EXIT_USAGE;
    }
    if (argc == 2 && !ms_node_name_ok(argv[1])) {
        fprintf(stderr, "megascale launch --ctl: error: '%s' is not a node name\n", argv[1]);
        return SUP_EXIT_USAGE;
    }
    /* no such directory is a usage error; a run directory whose driver is
     * gone (no control.json, or nobody at its address) is the driver's */
    if (ms_path_check_dir("--ctl", run_dir, "the driver's --run-dir") != MS_OK) {
        fprintf(stderr, "megascale launch --ctl: error: %s\n", ms_errmsg());
        return SUP_EXIT_USAGE;
    }
    char addr[128], token[128];
    if (read_control(run_dir, addr, sizeof addr, token, sizeof token) != 0) return SUP_EXIT_ERROR;
    char *colon = strrchr(addr, ':');
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (colon) *colon = 0;
    if (!colon || inet_pton(AF_INET, addr, &sa.sin_addr) != 1 || atoi(colon + 1) <= 0 ||
        atoi(colon + 1) > 65535) {
        fprintf(stderr, "megascale launch --ctl: error: %s/control.json: bad address\n", run_dir);
        return SUP_EXIT_ERROR;
    }
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    *colon = ':';
    cJSON *m = cJSON_CreateObject();
    cJSON_AddNumberToObject(m, "v", 1);
    cJSON_AddStringToObject(m, "token", token);
    cJSON_AddStringToObject(m, "cmd", argv[0]);
    if (argc == 2) cJSON_AddStringToObject(m, "node", argv[1]);
    char *obj = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    size_t n = obj ? strlen(obj) : 0;
    char *line = obj ? malloc(n + 2) : NULL, *reply = malloc(CTL_REPLY_MAX + 1);
    if (line) memcpy(line, obj, n), memcpy(line + n, "\n", 2);
    cJSON_free(obj);
    if (!line || !reply) {
        fprintf(stderr, "megascale launch --ctl: error: out of memory\n");
        free(line);
        free(reply);
        return SUP_EXIT_ERROR;
    }
    /* A connection the driver closed without a word (it sends one on everything it read) was
     * dropped unread: every slot taken by other clients (a flood of connections that never
     * send makes the oldest silent one room).  Nothing was done, so it is tried again. */
    int rc = SUP_EXIT_ERROR, again = 1;
    for (int attempt = 0; again && attempt < CTL_TRIES; attempt++) {
        if (attempt) usleep(100000u << (attempt - 1)); /* 0.1, 0.2, 0.4, 0.8 s */
        again = 0;
        rc = exchange(&sa, addr, run_dir, line, n + 1, reply, argv[0], &again);
    }
    if (again)
        fprintf(stderr,
                "megascale launch --ctl: error: the driver at %s closed the connection unread %d "
                "times (every control slot taken: other connections flood its port?)\n",
                addr, CTL_TRIES);
    free(line);
    free(reply);
    return rc;
}
