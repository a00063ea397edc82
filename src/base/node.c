/* node.c - node names and node maps (see node.h). */
#include "base/node.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int name_char(int c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

/* 1 if the n bytes at s are a node name. */
static int name_ok_n(const char *s, size_t n) {
    if (n < 1 || n >= MS_NODE_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!name_char((unsigned char)s[i])) return 0;
    return 1;
}

int ms_node_name_ok(const char *name) {
    return name && name_ok_n(name, strlen(name));
}

/* This host's name as a node name. */
static void host_node(char out[MS_NODE_NAME_MAX]) {
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) != 0 || !host[0])
        snprintf(host, sizeof host, "localhost");
    size_t n = strlen(host);
    if (n >= MS_NODE_NAME_MAX) n = MS_NODE_NAME_MAX - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = name_char((unsigned char)host[i]) ? host[i] : '_';
    out[n] = 0;
}

ms_status ms_node_of(const char *map, int rank, int world, char out[MS_NODE_NAME_MAX],
                     const char *what) {
    out[0] = 0;
    if (!map || !*map) {
        host_node(out);
        return MS_OK;
    }
    int n = 0; /* check every entry first: a bad one fails on every rank */
    for (const char *e = map;; e++) {
        size_t len = strcspn(e, ",");
        if (++n > MS_NODE_MAP_MAX)
            return ms_error(MS_ERR_ARG, "%s: more than %d node names", what, MS_NODE_MAP_MAX);
        if (!len)
            return ms_error(MS_ERR_ARG, "%s: node name %d is empty (expected NAME,NAME,...)", what,
                            n);
        if (!name_ok_n(e, len))
            return ms_error(MS_ERR_ARG,
                            "%s: node name %d '%.*s': expected 1 to %d characters of "
                            "[A-Za-z0-9._-]",
                            what, n, len > 80 ? 80 : (int)len, e, MS_NODE_NAME_MAX - 1);
        e += len;
        if (!*e) break;
    }
    if (world < 1 || rank < 0 || rank >= world)
        return ms_error(MS_ERR_ARG, "%s: rank %d is not in a world of %d", what, rank, world);
    int want = (int)((long long)rank * n / world);
    const char *e = map;
    for (int i = 0; i < want; i++)
        e = strchr(e, ',') + 1;
    size_t len = strcspn(e, ",");
    memcpy(out, e, len);
    out[len] = 0;
    return MS_OK;
}
