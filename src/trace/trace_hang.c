/* trace_hang.c - load a run's hang dumps (hang_rNNNNN.json) and the
 * supervisor's hang_driver.json, and find the suspects: ranks that wrote no
 * dump or that the supervisor saw silent, members of a group that never
 * entered the collective the others wait in, peers that never sent what a
 * rank waits to receive. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/jsonstr.h"
#include "base/fileio.h"
#include "base/hash.h"
#include "base/log.h"
#include "trace/trace_hang_internal.h"

static const char *jstr(const cJSON *o, const char *key, const char *def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : def;
}

static int64_t jint(const cJSON *o, const char *key, int64_t def) {
    int64_t v;
    return trace_json_int(o, key, INT64_MIN / 2, INT64_MAX / 2, &v) ? v : def;
}

static ms_status parse_op(const cJSON *o, hang_op *op, const char *path, const char *group,
                          int world) {
    int64_t seq;
    if (!cJSON_IsObject(o) || !jstr(o, "op", NULL) || !trace_json_int(o, "seq", 0, INT64_MAX, &seq))
        return ms_error(MS_ERR_FORMAT,
                        "%s: group '%s': an op needs a string \"op\" and an "
                        "integer \"seq\"",
                        path, group);
    snprintf(op->op, sizeof op->op, "%s", jstr(o, "op", ""));
    snprintf(op->state, sizeof op->state, "%s", jstr(o, "state", "?"));
    ms_utf8_fix(op->op); /* cut to fit: maybe inside a character */
    ms_utf8_fix(op->state);
    op->seq = seq;
    op->peer = jint(o, "peer", -1);
    /* -1: none (a collective's) */
    if (cJSON_GetObjectItemCaseSensitive(o, "peer") && (op->peer < -1 || op->peer >= world))
        return ms_error(MS_ERR_FORMAT,
                        "%s: group '%s': %s #%lld's \"peer\" is not a rank of world %d (as a "
                        "group's members must be)",
                        path, group, op->op, (long long)seq, world);
    op->tag = jint(o, "tag", -1);
    op->bytes = jint(o, "bytes", 0);
    const cJSON *age = cJSON_GetObjectItemCaseSensitive(o, "age_s");
    op->age_s = cJSON_IsNumber(age) ? age->valuedouble : 0;
    return MS_OK;
}

static ms_status parse_group(const cJSON *o, hang_group *g, int world, const char *path) {
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks");
    const cJSON *fl = cJSON_GetObjectItemCaseSensitive(o, "in_flight");
    const cJSON *last = cJSON_GetObjectItemCaseSensitive(o, "last_completed");
    if (!cJSON_IsObject(o) || !jstr(o, "name", NULL) || !cJSON_IsArray(ranks) ||
        !trace_json_int(o, "issued_seq", INT64_MIN / 2, INT64_MAX / 2, &g->issued))
        return ms_error(MS_ERR_FORMAT, "%s: a group needs \"name\", \"ranks\" and \"issued_seq\"",
                        path);
    snprintf(g->name, sizeof g->name, "%s", jstr(o, "name", ""));
    ms_utf8_fix(g->name); /* cut to fit: maybe inside a character */
    g->completed = jint(o, "completed_seq", -1);
    int n = cJSON_GetArraySize(ranks), nf = cJSON_IsArray(fl) ? cJSON_GetArraySize(fl) : 0;
    g->ranks = malloc(((size_t)n + 1) * sizeof *g->ranks);
    g->in_flight = calloc((size_t)nf + 1, sizeof *g->in_flight);
    if (!g->ranks || !g->in_flight) return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    const cJSON *x;
    cJSON_ArrayForEach(x, ranks) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= world ||
            x->valuedouble != (int)x->valuedouble)
            return ms_error(MS_ERR_FORMAT, "%s: group '%s': member %g is not a rank of world %d",
                            path, g->name, cJSON_IsNumber(x) ? x->valuedouble : -1.0, world);
        g->ranks[g->n_ranks++] = (int)x->valuedouble;
    }
    if (cJSON_IsObject(last)) {
        MS_TRY(parse_op(last, &g->last, path, g->name, world));
        g->has_last = 1;
    }
    cJSON_ArrayForEach(x, fl) {
        MS_TRY(parse_op(x, &g->in_flight[g->n_in_flight], path, g->name, world));
        g->n_in_flight++;
    }
    return MS_OK;
}

/* Append rank `by` to a "1, 2, 3" list. */
static void list_add(char *buf, size_t n, int *count, int by) {
    size_t o = strlen(buf);
    if (o + 16 < n)
        snprintf(buf + o, n - o, "%s%d", *count ? ", " : "", by);
    else if (o + 5 < n && !strstr(buf, "..."))
        snprintf(buf + o, n - o, ", ...");
    (*count)++;
}

/* Whether what rank `by` saw of rank u counts: u wrote no dump, or it
 * was seen before u wrote its own (a late dump of a rank that was stopped
 * sees the others gone: they gave up on it). */
static int seen_in_time(const trace_hang *h, int by, int u) {
    const hang_rank *r = &h->ranks[u], *b = &h->ranks[by];
    return u != by && (!r->has_dump || !r->wall_s || !b->wall_s || b->wall_s < r->wall_s);
}

/* The dumps' "unresponsive" ([{"rank","heartbeat_age_s"}]) and "exited"
 * ([rank]) lists: what each rank saw of the other ranks of its host. */
static void peer_states(trace_hang *h) {
    for (int by = 0; by < h->world; by++) {
        const cJSON *x;
        cJSON_ArrayForEach(x, h->ranks[by].seen_stale) {
            int64_t u;
            const cJSON *age = cJSON_GetObjectItemCaseSensitive(x, "heartbeat_age_s");
            double a = cJSON_IsNumber(age) ? age->valuedouble : 0;
            if (!trace_json_int(x, "rank", 0, h->world - 1, &u) || !seen_in_time(h, by, (int)u) ||
                a > 1e6) /* not a real age: a slot that never beat */
                continue;
            hang_rank *r = &h->ranks[u];
            r->stale_age = a > r->stale_age ? a : r->stale_age;
            list_add(r->stale_by, sizeof r->stale_by, &r->n_stale_by, by);
        }
        cJSON_ArrayForEach(x, h->ranks[by].seen_exited) {
            int64_t u;
            if (cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < h->world)
                u = (int64_t)x->valuedouble;
            else if (!trace_json_int(x, "rank", 0, h->world - 1, &u))
                continue;
            hang_rank *r = &h->ranks[u];
            if (seen_in_time(h, by, (int)u))
                list_add(r->exited_by, sizeof r->exited_by, &r->n_exited_by, by);
        }
    }
}

/* What a rank's record holds freed, the record as new (no dump). */
static void rank_clear(hang_rank *r) {
    for (int g = 0; g < r->n_groups; g++) {
        free(r->groups[g].ranks);
        free(r->groups[g].in_flight);
    }
    free(r->groups);
    cJSON_Delete(r->seen_stale);
    cJSON_Delete(r->seen_exited);
    for (int i = 0; i < r->n_why; i++)
        free(r->why[i]);
    free(r->why);
    memset(r, 0, sizeof *r);
}

/* One dump into h->ranks[rank]; the first dump fixes world and shape. */
static ms_status load_dump(trace_hang *h, const char *path, int file_rank) {
    char *text = NULL;
    size_t len = 0;
    MS_TRY(trace_read_file(path, &text, &len));
    ms_utf8_fix(text); /* its strings go into the JSON report as they are */
    cJSON *j = cJSON_Parse(text);
    free(text);
    ms_status st = MS_OK;
    int64_t rank, world;
    if (!j || !cJSON_IsObject(j))
        st = ms_error(MS_ERR_FORMAT, "%s: not a JSON object (a truncated dump?)", path);
    else if (strcmp(jstr(j, "type", ""), "hang_dump"))
        st = ms_error(MS_ERR_FORMAT, "%s: \"type\" is not \"hang_dump\"", path);
    else if (jint(j, "version", 1) != 1)
        st = ms_error(MS_ERR_FORMAT, "%s: hang dump version %lld; this build reads version 1", path,
                      (long long)jint(j, "version", 1));
    else if (!trace_json_int(j, "rank", 0, TRACE_MAX_WORLD, &rank) ||
             !trace_json_int(j, "world", 1, TRACE_MAX_WORLD, &world) || rank >= world)
        st = ms_error(MS_ERR_FORMAT, "%s: needs integer \"rank\" < \"world\" <= %d", path,
                      TRACE_MAX_WORLD);
    else if (rank != file_rank)
        st = ms_error(MS_ERR_FORMAT, "%s: says rank %lld, the file name rank %d", path,
                      (long long)rank, file_rank);
    else if (h->world && world != h->world)
        st = ms_error(MS_ERR_FORMAT, "%s: world %lld, but other dumps say %d", path,
                      (long long)world, h->world);
    if (st == MS_OK && !h->world) {
        h->world = (int)world;
        h->shape = (trace_coord){(int)world, 1, 1};
        trace_coord sh;
        if (trace_coord_parse(cJSON_GetObjectItemCaseSensitive(j, "shape"), &sh) &&
            (int64_t)sh.dp * sh.pp * sh.tp == world)
            h->shape = sh;
        h->ranks = calloc((size_t)world, sizeof *h->ranks);
        if (!h->ranks) st = ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    }
    if (st == MS_OK) {
        hang_rank *r = &h->ranks[rank];
        const cJSON *groups = cJSON_GetObjectItemCaseSensitive(j, "groups"), *g;
        r->has_dump = 1;
        snprintf(r->host, sizeof r->host, "%s", jstr(j, "host", "unknown"));
        ms_utf8_fix(r->host);
        snprintf(r->reason, sizeof r->reason, "%s", jstr(j, "reason", "?"));
        ms_utf8_fix(r->reason);
        if (!trace_coord_parse(cJSON_GetObjectItemCaseSensitive(j, "coord"), &r->coord))
            r->coord = trace_coord_of((int)rank, h->shape);
        const cJSON *wall = cJSON_GetObjectItemCaseSensitive(j, "wall_s");
        r->wall_s = cJSON_IsNumber(wall) ? wall->valuedouble : 0;
        r->pid = (int)jint(j, "pid", 0);
        r->seen_stale = cJSON_DetachItemFromObjectCaseSensitive(j, "unresponsive");
        r->seen_exited = cJSON_DetachItemFromObjectCaseSensitive(j, "exited");
        int ng = cJSON_IsArray(groups) ? cJSON_GetArraySize(groups) : 0;
        if (!(r->groups = calloc((size_t)ng + 1, sizeof *r->groups)))
            st = ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
        cJSON_ArrayForEach(g, groups) {
            if (st != MS_OK) break;
            st = parse_group(g, &r->groups[r->n_groups++], h->world, path);
        }
        h->n_dumps++;
    }
    cJSON_Delete(j);
    return st;
}

static ms_status add_why(hang_rank *r, int cls, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ms_status add_why(hang_rank *r, int cls, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ms_utf8_fix(buf); /* names in it, the whole cut to fit */
    for (int i = 0; i < r->n_why; i++)
        if (!strcmp(r->why[i], buf)) return MS_OK;
    char **p = realloc(r->why, ((size_t)r->n_why + 1) * sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "out of memory");
    r->why = p;
    if (!(r->why[r->n_why] = strdup(buf))) return ms_error(MS_ERR_NOMEM, "out of memory");
    r->n_why++;
    r->cls = !r->cls || cls < r->cls ? cls : r->cls;
    return MS_OK;
}

/* The group of rank r with g's name and member list, or NULL. */
static const hang_group *same_group(const hang_rank *r, const hang_group *g) {
    for (int i = 0; i < r->n_groups; i++)
        if (r->groups[i].id == g->id) return &r->groups[i];
    return NULL;
}

/* A group's identity: FNV-1a over its name and members (equal groups, equal hashes). */
static uint64_t group_hash(const hang_group *g) {
    uint64_t x = ms_fnv1a_str(MS_FNV1A_BASIS, g->name);
    for (int i = 0; i < g->n_ranks; i++)
        x = ms_fnv1a_word(x, (uint32_t)g->ranks[i]);
    return x;
}

typedef struct {
    uint64_t hash;
    hang_group *g;
} group_ref;

static int group_ref_cmp(const void *a, const void *b) {
    const group_ref *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    const hang_group *p = x->g, *q = y->g;
    int c = strcmp(p->name, q->name);
    if (!c) c = (p->n_ranks > q->n_ranks) - (p->n_ranks < q->n_ranks);
    if (!c) c = memcmp(p->ranks, q->ranks, (size_t)p->n_ranks * sizeof *p->ranks);
    return c;
}

/* Number the groups of all dumps so that the copies of one group (the same name and members)
 * share an id: same_group compares ids, not member lists (comparing lists cost every rank
 * members x members ints: 18 s for 16,384 ranks in a dp group of 1,024). */
static ms_status group_ids(trace_hang *h) {
    size_t n = 0;
    for (int rk = 0; rk < h->world; rk++)
        n += (size_t)h->ranks[rk].n_groups;
    group_ref *refs = malloc((n + 1) * sizeof *refs);
    if (!refs) return ms_error(MS_ERR_NOMEM, "out of memory");
    n = 0;
    for (int rk = 0; rk < h->world; rk++)
        for (int i = 0; i < h->ranks[rk].n_groups; i++) {
            hang_group *g = &h->ranks[rk].groups[i];
            refs[n++] = (group_ref){group_hash(g), g};
        }
    qsort(refs, n, sizeof *refs, group_ref_cmp);
    for (size_t i = 0, id = 0; i < n; i++) {
        if (i && group_ref_cmp(&refs[i - 1], &refs[i])) id++;
        refs[i].g->id = (int)id;
    }
    free(refs);
    return MS_OK;
}

static int is_p2p(const hang_op *op) {
    return !strcmp(op->op, "send") || !strcmp(op->op, "recv");
}

/* The collective of gm's group that fellow members of m wait in with the
 * lowest seq above m's issued_seq (*first, NULL if none), and how many
 * distinct later ones they wait in too. */
static void first_missed(const trace_hang *h, const hang_rank *m, const hang_group *gm,
                         const hang_op **first, int *n_later) {
    *first = NULL;
    *n_later = 0;
    int64_t seen_max = gm->issued; /* later ops counted once each, by seq */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < gm->n_ranks; k++) {
            const hang_rank *w = &h->ranks[gm->ranks[k]];
            const hang_group *gw = w == m || !w->has_dump ? NULL : same_group(w, gm);
            for (int i = 0; gw && i < gw->n_in_flight; i++) {
                const hang_op *op = &gw->in_flight[i];
                if (is_p2p(op) || op->peer >= 0 || op->seq <= gm->issued || op->age_s < h->min_age)
                    continue;
                if (pass == 0 && (!*first || op->seq < (*first)->seq)) *first = op;
                if (pass == 1 && op->seq > (*first)->seq && op->seq > seen_max) {
                    (*n_later)++; /* in-flight lists are in seq order */
                    seen_max = op->seq;
                }
            }
        }
}

/* m's oldest in-flight op as "recv from rank 2 on 'pp'" into buf, or "". */
static void waits_in(const hang_rank *m, char *buf, size_t n) {
    buf[0] = '\0';
    if (m->oldest_g < 0) return;
    const hang_group *g = &m->groups[m->oldest_g];
    const hang_op *op = &g->in_flight[m->oldest_i];
    if (hang_is_wait_for(op))
        snprintf(buf, n, "a wait for rank %lld in '%s'", (long long)op->peer, g->name);
    else if (op->peer >= 0)
        snprintf(buf, n, "%s %s rank %lld on '%s'", op->op, strcmp(op->op, "send") ? "from" : "to",
                 (long long)op->peer, g->name);
    else
        snprintf(buf, n, "%s #%lld on '%s'", op->op, (long long)op->seq, g->name);
}

/* (b) for group gm of rank m: the first collective its fellow members wait
 * in that m never issued (one reason per group).  A rank that waits in an
 * op itself is most often held up by another rank: weaker evidence. */
static ms_status never_entered(trace_hang *h, hang_rank *m, const hang_group *gm) {
    const hang_op *op;
    int n_later, n = 0;
    first_missed(h, m, gm, &op, &n_later);
    if (!op) return MS_OK;
    char blocked[200];
    waits_in(m, blocked, sizeof blocked);
    char who[256] = "", later[64] = "";
    size_t o = 0;
    for (int q = 0; q < gm->n_ranks; q++) { /* every waiter of that op */
        const hang_rank *x = &h->ranks[gm->ranks[q]];
        const hang_group *gx = x == m || !x->has_dump ? NULL : same_group(x, gm);
        int waits = 0;
        for (int z = 0; gx && z < gx->n_in_flight; z++)
            waits |= gx->in_flight[z].seq == op->seq && !strcmp(gx->in_flight[z].op, op->op);
        if (waits && o + 16 < sizeof who)
            o += (size_t)snprintf(who + o, sizeof who - o, "%s%d", n ? ", " : "", x->rank);
        n += waits;
    }
    if (n_later) snprintf(later, sizeof later, "; %d later op(s) waited in too", n_later);
    return add_why(m, blocked[0] ? HANG_BLOCKED : HANG_BEHIND,
                   "never entered %s #%lld on group '%s' that rank%s %s wait%s in (issued only "
                   "up to #%lld%s)%s%s",
                   op->op, (long long)op->seq, gm->name, n > 1 ? "s" : "", who, n > 1 ? "" : "s",
                   (long long)gm->issued, later, blocked[0] ? "; it waits itself, in " : "",
                   blocked);
}

/* (c) rank r waits in a recv from p, or for p outside the communicator
 * (wait_for): p is suspect if it has no send to r in flight and waits in
 * nothing itself. */
static ms_status never_sent(trace_hang *h, const hang_rank *r, const hang_group *g,
                            const hang_op *op) {
    if ((strcmp(op->op, "recv") && !hang_is_wait_for(op)) || op->peer < 0 || op->peer >= h->world ||
        op->age_s < h->min_age)
        return MS_OK;
    hang_rank *p = &h->ranks[op->peer];
    if (!p->has_dump) return MS_OK; /* already a suspect: no dump */
    int waiting = 0;
    for (int i = 0; i < p->n_groups; i++)
        waiting += p->groups[i].n_in_flight;
    if (waiting) return MS_OK;
    if (hang_is_wait_for(op))
        return add_why(p, HANG_NO_SEND,
                       "rank %d waits for it in '%s' (%.1f s: the tensor-parallel group's "
                       "batch ring) and it waits in nothing (lower confidence)",
                       r->rank, g->name, op->age_s);
    return add_why(p, HANG_NO_SEND,
                   "rank %d waits to receive from it (tag %lld, group '%s', %.1f s) but it has "
                   "no send to rank %d in flight and waits in nothing (lower confidence)",
                   r->rank, (long long)op->tag, g->name, op->age_s, r->rank);
}

/* The in-flight op of rank x's copy of group g that is `op` (the same collective and seq), or,
 * for a transfer, its other end (a send to `to` for a recv, a recv from `to` for a send, the
 * same tag when both have one), old enough to count; NULL if none. */
static const hang_op *in_op(const trace_hang *h, const hang_rank *x, const hang_group *g,
                            const hang_op *op, int to) {
    const hang_group *gx = x->has_dump ? same_group(x, g) : NULL;
    for (int i = 0; gx && i < gx->n_in_flight; i++) {
        const hang_op *y = &gx->in_flight[i];
        if (y->age_s < h->min_age || !strcmp(y->state, "queued")) continue; /* not started */
        if (!is_p2p(op) && y->seq == op->seq && !strcmp(y->op, op->op)) return y;
        if (is_p2p(op) && is_p2p(y) && strcmp(y->op, op->op) && y->peer == to &&
            (y->tag < 0 || op->tag < 0 || y->tag == op->tag))
            return y;
    }
    return NULL;
}

/* Whether rank x is known to be stopped or gone: from the other ranks' dumps
 * (unresponsive, exited) or from the driver (silent). */
static int gone(const hang_rank *x) {
    return x->n_stale_by || x->n_exited_by || x->drv_silent;
}

/* (b') rank r's oldest old op of group g that every rank it involves has entered (all members
 * for a collective; the peer's matching end for a transfer), yet it never completed: nobody
 * holds it up from outside, so the group itself is stuck (a broken link or NIC, a member
 * stuck inside the op).  Stronger than waiting for some other rank.  An op still queued
 * behind others on a rank's communication thread (state "queued") is not in it yet. */
static ms_status stuck_op(trace_hang *h, hang_rank *r, const hang_group *g) {
    /* a member that is gone or stopped explains the op by itself (its late dump shows it
     * in the op, yet it was not running) */
    for (int k = 0; k < g->n_ranks; k++) {
        const hang_rank *x = &h->ranks[g->ranks[k]];
        if (!x->has_dump || gone(x)) return MS_OK;
    }
    for (int i = 0; i < g->n_in_flight; i++) {
        const hang_op *op = &g->in_flight[i];
        if (op->age_s < h->min_age || !strcmp(op->state, "queued")) continue;
        if (is_p2p(op)) {
            const hang_rank *p = op->peer >= 0 && op->peer < h->world ? &h->ranks[op->peer] : NULL;
            if (!p || p == r || gone(p) || !in_op(h, p, g, op, r->rank)) continue;
            return add_why(r, HANG_STUCK,
                           "its %s %s rank %lld on '%s' (%.1f s) and rank %lld's matching %s "
                           "are both in flight, yet the transfer never completed: the link "
                           "between them, or one of them stuck inside the op",
                           op->op, strcmp(op->op, "send") ? "from" : "to", (long long)op->peer,
                           g->name, op->age_s, (long long)op->peer,
                           strcmp(op->op, "send") ? "send" : "recv");
        }
        if (op->peer >= 0 || g->n_ranks < 2) continue;
        int all = 1;
        for (int k = 0; all && k < g->n_ranks; k++)
            all = g->ranks[k] == r->rank || in_op(h, &h->ranks[g->ranks[k]], g, op, -1);
        if (!all) continue;
        char who[160] = "";
        int n = 0;
        for (int k = 0; k < g->n_ranks; k++)
            list_add(who, sizeof who, &n, g->ranks[k]);
        return add_why(r, HANG_STUCK,
                       "all %d members of group '%s' (ranks %s) are in %s #%lld (%.1f s here), "
                       "yet it never completed: the link between them, or a member stuck "
                       "inside the op",
                       g->n_ranks, g->name, who, op->op, (long long)op->seq, op->age_s);
    }
    return MS_OK;
}

/* An op that the other ranks entered only just before the dumps is where
 * ranks got to while the job was already stuck: no evidence of who stopped
 * it.  The ops that count have waited at least half as long as the oldest
 * (which is about --comm-timeout old), and at least HANG_MIN_AGE_S: the
 * dumps of a job that runs (`launch --ctl dump`, a SIGUSR2) hold ops a few
 * milliseconds old, the ranks' normal waits for each other.  (Before, such
 * a wait of 0.0 s named a suspect in a healthy job.) */
static void set_min_age(trace_hang *h) {
    double oldest = 0;
    for (int rk = 0; rk < h->world; rk++)
        for (int g = 0; g < h->ranks[rk].n_groups; g++)
            for (int i = 0; i < h->ranks[rk].groups[g].n_in_flight; i++) {
                double a = h->ranks[rk].groups[g].in_flight[i].age_s;
                oldest = a > oldest ? a : oldest;
            }
    h->oldest = oldest;
    h->min_age = oldest / 2 > HANG_MIN_AGE_S ? oldest / 2 : HANG_MIN_AGE_S;
}

static ms_status find_suspects(trace_hang *h) {
    MS_TRY(group_ids(h));
    set_min_age(h);
    for (int rk = 0; rk < h->world; rk++) {
        hang_rank *r = &h->ranks[rk];
        r->oldest_g = r->oldest_i = -1;
        /* a damaged dump (cut short by a full disk, killed while writing) was written: no
         * evidence that the rank stopped, and none of what it waited in (before, it read as
         * "wrote no dump", the strongest class, above the culprit the others showed) */
        if (!r->has_dump && !r->damaged)
            MS_TRY(add_why(r, HANG_DEAD, "wrote no dump: stopped, hung in compute, or dead"));
        if (r->damaged)
            MS_TRY(add_why(r, HANG_UNREAD,
                           "its dump is damaged and was skipped: nothing is known of what it "
                           "waited in"));
        /* what the driver and the other ranks' dumps saw of it: for a rank without a dump,
         * which of those */
        if (r->drv_silent)
            MS_TRY(add_why(r, HANG_DEAD,
                           "no heartbeat to the driver for %.1f s when the dumps were asked for "
                           "(stopped or stuck; a late dump of its own proves nothing)",
                           r->drv_age));
        if (r->n_stale_by)
            MS_TRY(add_why(r, HANG_DEAD,
                           "unresponsive: its heartbeat was %.1f s old in the dump%s of rank%s %s "
                           "(stopped or stuck; a late dump of its own proves nothing)",
                           r->stale_age, r->n_stale_by > 1 ? "s" : "", r->n_stale_by > 1 ? "s" : "",
                           r->stale_by));
        if (r->n_exited_by)
            MS_TRY(add_why(r, HANG_DEAD, "exited: its process was gone in the dump%s of rank%s %s",
                           r->n_exited_by > 1 ? "s" : "", r->n_exited_by > 1 ? "s" : "",
                           r->exited_by));
        if (!r->has_dump) continue;
        for (int g = 0; g < r->n_groups; g++)
            for (int i = 0; i < r->groups[g].n_in_flight; i++) {
                const hang_op *op = &r->groups[g].in_flight[i];
                if (r->oldest_g < 0 ||
                    op->age_s > r->groups[r->oldest_g].in_flight[r->oldest_i].age_s) {
                    r->oldest_g = g;
                    r->oldest_i = i;
                }
            }
        for (int g = 0; g < r->n_groups; g++) {
            MS_TRY(never_entered(h, r, &r->groups[g]));
            MS_TRY(stuck_op(h, r, &r->groups[g]));
        }
    }
    /* then the lower-confidence reasons, so that they come last */
    for (int rk = 0; rk < h->world; rk++) {
        const hang_rank *r = &h->ranks[rk];
        for (int g = 0; g < r->n_groups; g++)
            for (int i = 0; i < r->groups[g].n_in_flight; i++)
                MS_TRY(never_sent(h, r, &r->groups[g], &r->groups[g].in_flight[i]));
    }
    for (int rk = 0; rk < h->world; rk++) {
        int c = h->ranks[rk].cls;
        h->top_cls = c && (!h->top_cls || c < h->top_cls) ? c : h->top_cls;
    }
    return MS_OK;
}

/* Hosts and coordinates of ranks without a dump, from the events headers
 * (a header's coordinates are the rank's own: a grid placed host by host,
 * over ranks that mpirun dealt out round-robin, does not follow the
 * position formula). */
static void fill_missing(trace_hang *h) {
    int *ranks = NULL, n = 0;
    char **paths = NULL;
    for (int rk = 0; rk < h->world; rk++)
        if (!h->ranks[rk].has_dump) {
            h->ranks[rk].rank = rk;
            h->ranks[rk].coord = trace_coord_of(rk, h->shape);
            snprintf(h->ranks[rk].host, sizeof h->ranks[rk].host, "unknown");
        }
    if (trace_log_files(h->dir, 0, &ranks, &paths, &n) != MS_OK) return;
    for (int i = 0; i < n; i++) {
        if (ranks[i] >= h->world || h->ranks[ranks[i]].has_dump) continue;
        trace_log l;
        if (trace_log_read_header(paths[i], &l) == MS_OK) {
            snprintf(h->ranks[ranks[i]].host, sizeof h->ranks[ranks[i]].host, "%s", l.host);
            if (!trace_coord_cmp(l.shape, h->shape)) h->ranks[ranks[i]].coord = l.coord;
        } else
            ms_warn("%s", ms_errmsg());
    }
    trace_rank_files_free(ranks, paths, n);
}

/* What decides whether a dump belongs to the hang being analysed. */
typedef struct {
    int cur;          /* 1: written by the process of the rank's event log; 0: by another;
                         -1: unknown (no log, no pid, unreadable) */
    int pid, log_pid; /* 0: unknown */
    int world;        /* 0: unknown */
    double wall_s;    /* 0: unknown */
} dump_meta;

static void dump_meta_read(const char *dir, const char *path, int rank, dump_meta *m) {
    char ev[4200], *text = NULL;
    size_t len = 0;
    trace_log l;
    int64_t v;
    *m = (dump_meta){.cur = -1};
    if (trace_read_file(path, &text, &len) != MS_OK) return; /* load_dump says why */
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return;
    m->pid = trace_json_int(j, "pid", 1, INT32_MAX, &v) ? (int)v : 0;
    m->world = trace_json_int(j, "world", 1, TRACE_MAX_WORLD, &v) ? (int)v : 0;
    const cJSON *wall = cJSON_GetObjectItemCaseSensitive(j, "wall_s");
    m->wall_s = cJSON_IsNumber(wall) ? wall->valuedouble : 0;
    if (m->pid && trace_log_path(dir, rank, ev, sizeof ev) &&
        trace_log_read_header(ev, &l) == MS_OK && l.pid > 0) {
        m->log_pid = l.pid;
        m->cur = m->pid == l.pid && !strcmp(jstr(j, "host", l.host), l.host);
    }
    cJSON_Delete(j);
}

/* The dumps of one hang are written within seconds of each other (a rank that timed out
 * waits 3 s for its host's; other hosts' ranks time out on their own, within a
 * --comm-timeout): ten minutes apart, two hangs. */
#define HANG_SPREAD_S 600.0

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The world of the newest hang: the one most of the dumps written within HANG_SPREAD_S of
 * the newest agree on (one damaged dump's world, 1048575, outvoted by the others), the
 * newest dump's on a tie.  -1: no dump says its world. */
static int newest_world(const dump_meta *m, const int *keep, int n, int newest) {
    int *w = malloc(((size_t)n + 1) * sizeof *w), k = 0;
    if (!w) return newest >= 0 ? m[newest].world : -1;
    for (int i = 0; newest >= 0 && i < n; i++)
        if (keep[i] && m[i].world &&
            (!m[i].wall_s || !m[newest].wall_s || m[newest].wall_s - m[i].wall_s < HANG_SPREAD_S))
            w[k++] = m[i].world;
    qsort(w, (size_t)k, sizeof *w, cmp_int);
    int best = newest >= 0 ? m[newest].world : -1, best_n = 0;
    for (int i = 0; i < k; i++) {
        if (i && w[i] == w[i - 1]) continue;
        int j = i;
        while (j < k && w[j] == w[i])
            j++;
        if (j - i > best_n || (j - i == best_n && w[i] == m[newest].world))
            best = w[i], best_n = j - i;
    }
    free(w);
    return best;
}

/* A job restarted in the same directory leaves the dumps of its earlier
 * hang.  When some dumps come from the processes of the event logs, the
 * others are older and would mix two hangs (a rank that wrote no dump this
 * time would look alive): skip them.  Skip too the dumps of a world other
 * than the newest hang's (a restart with fewer ranks, or a damaged dump).
 * keep[i]: 1 or 0. */
static void pick_dumps(const char *dir, char **paths, const int *ranks, int n, int *keep) {
    dump_meta *m = calloc((size_t)n + 1, sizeof *m);
    int any_current = 0, newest = -1;
    for (int i = 0; i < n; i++)
        keep[i] = 1;
    if (!m) return; /* keep them all: the loader reports what it cannot read */
    for (int i = 0; i < n; i++) {
        dump_meta_read(dir, paths[i], ranks[i], &m[i]);
        any_current |= m[i].cur == 1;
    }
    for (int i = 0; i < n; i++) {
        if (m[i].world && ranks[i] >= m[i].world) { /* no vote: its world is damaged */
            keep[i] = 0;
            ms_warn("%s: skipped: the dump of rank %d says a world of %d (damaged)", paths[i],
                    ranks[i], m[i].world);
        } else if (any_current && m[i].cur == 0) {
            keep[i] = 0;
            ms_warn("%s: skipped: another run's dump (pid %d; rank %d's event log here is from "
                    "pid %d, which wrote no dump)",
                    paths[i], m[i].pid, ranks[i], m[i].log_pid);
        } else if (m[i].world && (newest < 0 || m[i].wall_s > m[newest].wall_s)) {
            newest = i;
        }
    }
    int world = newest_world(m, keep, n, newest), n_skip = 0;
    for (int i = 0; newest >= 0 && i < n; i++)
        if (keep[i] && m[i].world && m[i].world != world) {
            keep[i] = 0;
            if (n_skip++ < 20) /* a long list says nothing more */
                ms_warn("%s: skipped: a dump of another run (world %d; most of the newest "
                        "hang's dumps say %d), or a damaged one",
                        paths[i], m[i].world, world);
        }
    if (n_skip > 20) ms_warn("%s: %d more dump(s) of another world skipped", dir, n_skip - 20);
    free(m);
}

/* The name `megascale launch` writes it under, beside the dumps (sup_driver.c). */
#define HANG_DRIVER_FILE "hang_driver.json"

/* DIR/hang_driver.json, when there (`megascale launch` asked for the dumps: the ranks that
 * had sent it no heartbeat for a while then): those ranks were stopped or stuck, whatever
 * their dumps show (a rank stopped on a host without another rank to see it writes its dump
 * only once it runs again, looking like the ranks that waited for it).  Without it (a run
 * before the file, a dump of a timeout or by hand) only the dumps speak.  A file that does
 * not belong to these dumps (another world, written more than HANG_SPREAD_S from the newest
 * dump) or is damaged is skipped with a warning, and so is an entry of a rank whose dump
 * another process wrote. */
static void load_driver(trace_hang *h) {
    char path[4200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/" HANG_DRIVER_FILE, h->dir);
    if (access(path, F_OK) != 0) return;
    if (trace_read_file(path, &text, &len) != MS_OK) {
        ms_warn("%s (its silent ranks are not used)", ms_errmsg());
        return;
    }
    ms_utf8_fix(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *silent = cJSON_GetObjectItemCaseSensitive(j, "silent");
    const cJSON *wall = cJSON_GetObjectItemCaseSensitive(j, "wall_s"), *x;
    double newest = 0;
    int64_t world;
    for (int rk = 0; rk < h->world; rk++)
        newest = h->ranks[rk].wall_s > newest ? h->ranks[rk].wall_s : newest;
    int ok = 0;
    if (!cJSON_IsObject(j) || strcmp(jstr(j, "type", ""), "hang_driver") ||
        jint(j, "version", 1) != 1 || !trace_json_int(j, "world", 1, TRACE_MAX_WORLD, &world) ||
        !cJSON_IsNumber(wall) || !cJSON_IsArray(silent))
        ms_warn("%s: skipped: not a version 1 \"hang_driver\" object with \"world\", "
                "\"wall_s\" and \"silent\" (damaged?)",
                path);
    else if (world != h->world)
        ms_warn("%s: skipped: of another run (world %lld; the dumps say %d)", path,
                (long long)world, h->world);
    else if (newest > 0 && fabs(wall->valuedouble - newest) > HANG_SPREAD_S)
        ms_warn("%s: skipped: of another hang (written %.0f s from the newest dump)", path,
                fabs(wall->valuedouble - newest));
    else
        ok = 1;
    const cJSON *list = ok ? silent : NULL; /* (the macro does not parenthesize its argument) */
    cJSON_ArrayForEach(x, list) {
        int64_t rk, pid;
        const cJSON *age = cJSON_GetObjectItemCaseSensitive(x, "beat_age_s");
        if (!trace_json_int(x, "rank", 0, h->world - 1, &rk)) continue;
        hang_rank *r = &h->ranks[rk];
        if (trace_json_int(x, "pid", 1, INT32_MAX, &pid) && r->has_dump && r->pid > 0 &&
            pid != r->pid) {
            ms_warn("%s: rank %lld skipped: pid %lld, but its dump's is %d (another process)", path,
                    (long long)rk, (long long)pid, r->pid);
            continue;
        }
        r->drv_silent = 1;
        if (cJSON_IsNumber(age) && age->valuedouble > r->drv_age) r->drv_age = age->valuedouble;
    }
    cJSON_Delete(j);
}

ms_status trace_hang_load(const char *dir, trace_hang **out) {
    *out = NULL;
    int *ranks = NULL, n = 0;
    char **paths = NULL;
    MS_TRY(trace_rank_files(dir, "hang_r", ".json", &ranks, &paths, &n));
    trace_hang *h = calloc(1, sizeof *h);
    int *keep = calloc((size_t)n + 1, sizeof *keep);
    ms_status st =
        h && keep && (h->dir = strdup(dir)) ? MS_OK : ms_error(MS_ERR_NOMEM, "out of memory");
    if (st == MS_OK && n == 0)
        st = ms_error(MS_ERR_NOTFOUND, "%s: no hang dumps (hang_r*.json) in this directory", dir);
    if (st == MS_OK) pick_dumps(dir, paths, ranks, n, keep);
    /* a damaged dump (empty, cut short, of another format) is skipped with a warning and
     * its rank counts as one without a dump: the others still say where the job hung
     * (before, one such file stopped the analysis) */
    int n_bad = 0;
    for (int i = 0; st == MS_OK && i < n; i++) {
        if (!keep[i]) continue;
        ms_status one = h->world && ranks[i] >= h->world
                            ? ms_error(MS_ERR_FORMAT, "%s: rank %d is outside world %d", paths[i],
                                       ranks[i], h->world)
                            : load_dump(h, paths[i], ranks[i]);
        if (one == MS_ERR_NOMEM) {
            st = one;
        } else if (one != MS_OK) {
            ms_warn("%s (skipped: rank %d counts as a rank without a dump)", ms_errmsg(), ranks[i]);
            if (h->ranks && ranks[i] < h->world) {
                h->n_dumps -= h->ranks[ranks[i]].has_dump;
                rank_clear(&h->ranks[ranks[i]]);
                h->ranks[ranks[i]].damaged = 1;
            }
            n_bad++;
        } else {
            h->ranks[ranks[i]].rank = ranks[i];
        }
    }
    if (st == MS_OK && !h->n_dumps)
        st = ms_error(MS_ERR_FORMAT, "%s: no readable hang dump (%d damaged: see the warnings)",
                      dir, n_bad);
    trace_rank_files_free(ranks, paths, n);
    free(keep);
    if (st == MS_OK) peer_states(h);
    if (st == MS_OK) load_driver(h);
    if (st == MS_OK) fill_missing(h);
    if (st == MS_OK) st = find_suspects(h);
    if (st != MS_OK) {
        trace_hang_free(h);
        return st;
    }
    *out = h;
    return MS_OK;
}

void trace_hang_free(trace_hang *h) {
    if (!h) return;
    for (int rk = 0; h->ranks && rk < h->world; rk++)
        rank_clear(&h->ranks[rk]);
    free(h->ranks);
    free(h->dir);
    free(h);
}

int trace_hang_n_suspects(const trace_hang *h) {
    int n = 0;
    for (int rk = 0; rk < h->world; rk++)
        n += hang_is_suspect(h, &h->ranks[rk]);
    return n;
}
