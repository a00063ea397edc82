/* sup_nodes.c - the node pool of a supervised job: the nodes it may run
 * on (the job's and the spares), which ones are on the blocklist, and
 * which ones this attempt uses.
 *
 * On one host (--nodes N --spares K) the nodes are groups of ranks named
 * node0 .. node{N+K-1}; with --hostfile they are the file's hosts.  The
 * blocklist is RUN_DIR/blocklist.json (docs/formats.md, "Blocklist"),
 * rewritten atomically at each eviction, so a restarted driver keeps it;
 * entries naming nodes outside this pool are kept as they are. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/log.h"
#include "base/node.h"
#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

#define SUP_MAX_SLOTS (1 << 20) /* slots of one host: launch's --np range */

#define BLOCKLIST_MAX_BYTES (1 << 20)

static int add_node(sup_nodes *p, const char *name, int slots, char *why, size_t n) {
    if (p->n == SUP_MAX_NODES) return snprintf(why, n, "more than %d nodes", SUP_MAX_NODES), -1;
    if (!ms_node_name_ok(name))
        return snprintf(why, n, "'%s' is not a node name ([A-Za-z0-9._-], 1 to 63 bytes)", name),
               -1;
    if (sup_nodes_find(p, name) >= 0)
        return snprintf(why, n, "node '%s' is listed twice", name), -1;
    snprintf(p->name[p->n], SUP_NODE_NAME, "%s", name);
    p->slots[p->n] = slots;
    p->n++;
    return 0;
}

/* An OpenMPI hostfile: "HOST [slots=N] ..." a line, '#' comments. */
static int read_hostfile(sup_nodes *p, const char *path, char *why, size_t n) {
    char *text = NULL;
    size_t len = 0;
    if (ms_file_read_all(path, &text, &len) != MS_OK)
        return snprintf(why, n, "--hostfile: %s", ms_errmsg()), -1;
    int rc = 0, line = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l && rc == 0;
         l = strtok_r(NULL, "\n", &save)) {
        line++;
        char *hash = strchr(l, '#');
        if (hash) *hash = 0;
        char host[256] = "";
        int slots = 0, k = 0;
        if (sscanf(l, " %255s%n", host, &k) != 1) continue; /* blank */
        for (char *q = l + k; *q;) {
            while (*q == ' ' || *q == '\t' || *q == '\r')
                q++;
            if (!*q) break;
            int m = (int)strcspn(q, " \t\r");
            if (!strncmp(q, "slots=", 6)) { /* digits, in range (%d wrapped 2^32 + 1 to 1) */
                char *end = NULL;
                errno = 0;
                long long v = q[6] >= '0' && q[6] <= '9' ? strtoll(q + 6, &end, 10) : -1;
                if (v < 1 || v > SUP_MAX_SLOTS || errno || end != q + m) {
                    snprintf(why, n, "%s:%d: '%.*s': slots must be a whole number in 1..%d", path,
                             line, m, q, SUP_MAX_SLOTS);
                    rc = -1;
                    break;
                }
                slots = (int)v;
                q += m;
            } else {
                if (strncmp(q, "max_slots=", 10) != 0) { /* mpirun's other keys: ignored */
                    snprintf(why, n, "%s:%d: cannot read '%.*s' (expected HOST [slots=N])", path,
                             line, m, q);
                    rc = -1;
                    break;
                }
                q += m;
            }
        }
        if (rc == 0 && add_node(p, host, slots > 0 ? slots : 1, why, n) != 0) {
            char inner[512];
            snprintf(inner, sizeof inner, "%s", why);
            snprintf(why, n, "%s:%d: %s", path, line, inner);
            rc = -1;
        }
    }
    free(text);
    if (rc == 0 && p->n == 0) snprintf(why, n, "%s: no hosts", path), rc = -1;
    return rc;
}

int sup_nodes_find(const sup_nodes *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->name[i], name)) return i;
    return -1;
}

int sup_nodes_init(sup_nodes *p, const sup_config *c, char *why, size_t n) {
    memset(p, 0, sizeof *p);
    snprintf(p->blocklist_path, sizeof p->blocklist_path, "%s/blocklist.json", c->run_dir);
    if (c->spares < 0) return snprintf(why, n, "--spares must be >= 0"), -1;
    if (c->hostfile) {
        if (read_hostfile(p, c->hostfile, why, n) != 0) return -1;
        p->needed = c->nodes > 0 ? c->nodes : p->n - c->spares; /* 0: not given */
        if (c->nodes <= 0 && p->needed < 1)                     /* every host a spare */
            return snprintf(why, n, "%s lists %d host(s): --spares %d leaves none for the job",
                            c->hostfile, p->n, c->spares),
                   -1;
        if (p->needed < 1 || p->needed + c->spares > p->n)
            return snprintf(why, n,
                            "%s lists %d host(s): not enough for %d node(s) and --spares %d",
                            c->hostfile, p->n, p->needed > 0 ? p->needed : c->nodes, c->spares),
                   -1;
    } else {
        p->needed = c->nodes > 1 ? c->nodes : 1;
        if (p->needed + c->spares > SUP_MAX_NODES)
            return snprintf(why, n, "more than %d nodes", SUP_MAX_NODES), -1;
        for (int i = 0; i < p->needed + c->spares; i++) {
            char name[32];
            snprintf(name, sizeof name, "node%d", i);
            if (add_node(p, name, 0, why, n) != 0) return -1;
        }
    }
    if (c->np % p->needed != 0)
        return snprintf(why, n, "--np %d does not split into %d node(s) of equal size", c->np,
                        p->needed),
               -1;
    p->per_node = c->np / p->needed;
    for (int i = 0; c->hostfile && i < p->n; i++)
        if (p->slots[i] < p->per_node)
            return snprintf(why, n, "%s: host %s has %d slot(s), a node needs %d", c->hostfile,
                            p->name[i], p->slots[i], p->per_node),
                   -1;
    return 0;
}

int sup_nodes_load_blocklist(sup_nodes *p, char *why, size_t n) {
    char *text = NULL;
    size_t len = 0;
    struct stat sb;
    if (stat(p->blocklist_path, &sb) != 0) {
        if (errno == ENOENT) return 0; /* none yet */
        return snprintf(why, n, "%s: %s", p->blocklist_path, strerror(errno)), -1;
    }
    if (ms_file_read_max(p->blocklist_path, BLOCKLIST_MAX_BYTES, &text, &len) != MS_OK)
        return snprintf(why, n, "%s", ms_errmsg()), -1;
    cJSON *doc = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, "v");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(doc, "blocked");
    if (!cJSON_IsObject(doc) || !cJSON_IsNumber(v) || v->valuedouble != 1 || !cJSON_IsArray(list)) {
        cJSON_Delete(doc);
        return snprintf(why, n,
                        "%s: not a blocklist (expected {\"v\": 1, \"blocked\": [...]}); fix or "
                        "remove it",
                        p->blocklist_path),
               -1;
    }
    int k = 0;
    for (const cJSON *e = list->child; e; e = e->next, k++) {
        const cJSON *node = cJSON_GetObjectItemCaseSensitive(e, "node");
        const cJSON *reason = cJSON_GetObjectItemCaseSensitive(e, "reason");
        if (!cJSON_IsString(node) || !ms_node_name_ok(node->valuestring) ||
            (reason && !cJSON_IsString(reason))) {
            cJSON_Delete(doc);
            return snprintf(why, n, "%s: entry %d: expected {\"node\": NAME, \"reason\": TEXT}",
                            p->blocklist_path, k),
                   -1;
        }
        int i = sup_nodes_find(p, node->valuestring);
        if (i >= 0 && !p->blocked[i][0])
            snprintf(p->blocked[i], sizeof p->blocked[i], "%s",
                     reason && *reason->valuestring ? reason->valuestring : "blocklisted");
    }
    p->doc = doc;
    return 0;
}

int sup_nodes_block(sup_nodes *p, int i, const char *reason, char *why, size_t n) {
    if (i < 0 || i >= p->n) return snprintf(why, n, "no such node"), -1;
    snprintf(p->blocked[i], sizeof p->blocked[i], "%s", reason);
    if (!p->doc) {
        p->doc = cJSON_CreateObject();
        cJSON_AddNumberToObject(p->doc, "v", 1);
        cJSON_AddArrayToObject(p->doc, "blocked");
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "node", p->name[i]);
    cJSON_AddStringToObject(e, "reason", reason);
    cJSON_AddNumberToObject(e, "time", (double)(long long)ms_wall_now());
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(p->doc, "blocked"), e);
    char *text = cJSON_Print(p->doc);
    if (!text) return snprintf(why, n, "out of memory"), -1;
    ms_atomic_file af;
    ms_status st = ms_atomic_open(&af, p->blocklist_path);
    if (st == MS_OK) st = ms_atomic_printf(&af, "%s\n", text);
    if (st == MS_OK) st = ms_atomic_commit(&af);
    if (st != MS_OK) ms_atomic_abort(&af);
    cJSON_free(text);
    if (st != MS_OK) return snprintf(why, n, "%s", ms_errmsg()), -1;
    return 0;
}

int sup_nodes_usable(const sup_nodes *p) {
    int k = 0;
    for (int i = 0; i < p->n; i++)
        k += !p->blocked[i][0];
    return k;
}

int sup_nodes_choose(sup_nodes *p) {
    int k = 0;
    for (int i = 0; i < p->n && k < p->needed; i++)
        if (!p->blocked[i][0]) p->active[k++] = i;
    return k == p->needed ? 0 : -1;
}

int sup_nodes_is_active(const sup_nodes *p, int i) {
    for (int k = 0; k < p->needed; k++)
        if (p->active[k] == i) return 1;
    return 0;
}

int sup_nodes_of_rank(const sup_nodes *p, int rank) {
    return rank >= 0 && p->per_node > 0 ? p->active[rank / p->per_node] : -1;
}

const char *sup_nodes_rank_name(const sup_nodes *p, int rank) {
    int i = sup_nodes_of_rank(p, rank);
    return i >= 0 ? p->name[i] : "";
}

void sup_nodes_map(const sup_nodes *p, const int *idx, int k, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int j = 0; j < k && len < n; j++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", j ? "," : "", p->name[idx[j]]);
}

void sup_nodes_pool(const sup_nodes *p, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < p->n && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? "," : "", p->name[i]);
}

int sup_nodes_write_hostfile(const sup_nodes *p, const int *idx, int k, int slots, const char *path,
                             char *why, size_t n) {
    ms_atomic_file af;
    ms_status st = ms_atomic_open(&af, path);
    for (int j = 0; j < k && st == MS_OK; j++)
        st = ms_atomic_printf(&af, "%s slots=%d\n", p->name[idx[j]], slots);
    if (st == MS_OK) st = ms_atomic_commit(&af);
    if (st != MS_OK) {
        ms_atomic_abort(&af);
        return snprintf(why, n, "%s", ms_errmsg()), -1;
    }
    return 0;
}

void sup_nodes_free(sup_nodes *p) {
    cJSON_Delete(p->doc);
    p->doc = NULL;
}

/* 1 if host names this machine: localhost, its host name (or the short
 * form), or an address that is loopback or one of its own (bindable). */
static int host_is_local(const char *host) {
    char me[256] = "";
    gethostname(me, sizeof me - 1);
    size_t hl = strcspn(host, "."), ml = strcspn(me, ".");
    if (!strcmp(host, "localhost") || !strcmp(host, me) || (hl == ml && !strncmp(host, me, hl)))
        return 1;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return 0;
    int local = 0;
    for (const struct addrinfo *a = res; a && !local; a = a->ai_next) {
        struct sockaddr_in sa = *(const struct sockaddr_in *)a->ai_addr;
        if ((ntohl(sa.sin_addr.s_addr) >> 24) == 127) {
            local = 1;
            break;
        }
        sa.sin_port = 0;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        local = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (fd >= 0) close(fd);
    }
    freeaddrinfo(res);
    return local;
}

int sup_nodes_reachable(const sup_nodes *p, const sup_config *c, const char *bind_addr, char *why,
                        size_t n) {
    struct in_addr a;
    if (!c->hostfile || inet_pton(AF_INET, bind_addr, &a) != 1) return 0;
    uint32_t ip = ntohl(a.s_addr);
    if ((ip >> 24) != 127 && ip != 0) return 0; /* an address of this host's network */
    for (int i = 0; i < p->n; i++)
        if (!host_is_local(p->name[i]))
            return snprintf(why, n,
                            "--hostfile %s lists %s, another host, but the ranks would be told "
                            "to send their heartbeats to %s (--bind): give --bind an address of "
                            "this host that every host reaches",
                            c->hostfile, p->name[i], bind_addr),
                   -1;
    return 0;
}
