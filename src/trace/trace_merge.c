/* trace_merge.c - merge per-rank event logs into one Chrome Trace Event
 * Format file: a process per rank, a thread per lane (comm lanes split
 * into sub-threads so that complete events nest), clocks aligned to rank 0,
 * and a flow arrow from every send to its recv. */
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/log.h"
#include "trace/trace_internal.h"

#define TID_COMM0 10 /* comm and other lanes get tids from here on */

typedef struct {
    int tid;
    char name[160];
} merge_thread;

/* The layout of one rank: a thread and a global offset per span. */
typedef struct {
    int *tid;
    int64_t *off;
    merge_thread *threads;
    int n_threads;
} merge_rank;

typedef struct {
    int src, dst, group, tag; /* global ranks */
    int64_t t0;
    int log, span;
} p2p_op;

typedef struct {
    trace_set *set;
    merge_rank *ranks;
    char **quoted; /* every interned string as a JSON literal */
    int64_t t_min;
    trace_merge_stats st;
} merge_ctx;

static int fixed_tid(const char *lane) {
    if (!strcmp(lane, "compute")) return 1;
    if (!strcmp(lane, "data")) return 2;
    if (!strcmp(lane, "ckpt")) return 3;
    return 0;
}

static void add_thread(merge_rank *mr, int tid, const char *name, const char *suffix) {
    merge_thread *t = &mr->threads[mr->n_threads++];
    t->tid = tid;
    snprintf(t->name, sizeof t->name, "%s%s", name, suffix);
}

/* Offsets for spans of a nesting lane: a nested span takes its outermost
 * ancestor's offset, so that a clock line between them cannot break the
 * nesting, and an outermost span starts no earlier than the one before it
 * ends (a clock line between them that moves the offset back would make
 * them overlap).  idx is sorted by start (trace_nest). */
static void nested_offsets(const trace_log *l, const int *idx, int n, int64_t *off, int *stack) {
    int top = 0, any = 0;
    int64_t end = 0; /* global end of the last outermost span */
    for (int i = 0; i < n; i++) {
        const trace_span *s = &l->spans[idx[i]];
        if (s->flags & TRACE_IS_MARK) {
            off[idx[i]] = top ? off[stack[0]] : trace_log_offset(l, s->t0);
            continue;
        }
        while (top && l->spans[stack[top - 1]].t1 <= s->t0)
            top--;
        if (top) {
            off[idx[i]] = off[stack[0]];
        } else {
            int64_t o = trace_log_offset(l, s->t0);
            off[idx[i]] = any && s->t0 + o < end ? end - s->t0 : o;
            end = s->t1 + off[idx[i]];
            any = 1;
        }
        stack[top++] = idx[i];
    }
}

/* Comm lanes: each span's own offset, and sub-threads laid out on the
 * global times (so that two spans on one sub-thread cannot overlap after
 * their offsets differ).  Returns the number of sub-threads; -1: no memory. */
static int comm_layout(const trace_log *l, int *idx, int n, int64_t *off, int *track) {
    trace_span *g = malloc(((size_t)n + 1) * sizeof *g);
    int *gi = malloc(((size_t)n + 1) * sizeof *gi);
    if (!g || !gi) {
        free(g);
        free(gi);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        g[i] = l->spans[idx[i]];
        off[idx[i]] = trace_log_offset(l, g[i].t0);
        g[i].t0 += off[idx[i]];
        g[i].t1 += off[idx[i]];
        gi[i] = i;
    }
    int nt = trace_partition(g, gi, n, track); /* sorts gi: track[k] is for gi[k] */
    int *sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    if (!sorted) {
        free(g);
        free(gi);
        return -1;
    }
    for (int k = 0; k < n; k++)
        sorted[k] = idx[gi[k]];
    memcpy(idx, sorted, (size_t)n * sizeof *idx);
    free(sorted);
    free(g);
    free(gi);
    return nt;
}

/* Lay out one lane of a rank: tids (sub-threads for comm lanes), offsets. */
static ms_status layout_lane(merge_ctx *c, int li, int lane, int *idx, int n, int *work,
                             int *next_tid) {
    trace_log *l = &c->set->logs[li];
    merge_rank *mr = &c->ranks[li];
    const char *name = c->set->strs[lane];
    if (!strncmp(name, "comm:", 5)) {
        int nt = comm_layout(l, idx, n, mr->off, work);
        if (nt < 0) return ms_error(MS_ERR_NOMEM, "%s: out of memory", l->path);
        for (int i = 0; i < n; i++)
            mr->tid[idx[i]] = *next_tid + work[i];
        for (int t = 0; t < nt; t++) {
            char suffix[24];
            snprintf(suffix, sizeof suffix, " #%d", t);
            add_thread(mr, *next_tid + t, name, suffix);
        }
        *next_tid += nt;
        return MS_OK;
    }
    int cut = trace_nest(l->spans, idx, n);
    if (cut)
        ms_warn("%s: %d span(s) on lane '%s' overlap their parent; cut to nest", l->path, cut,
                name);
    c->st.clamped += cut;
    nested_offsets(l, idx, n, mr->off, work);
    int tid = fixed_tid(name) ? fixed_tid(name) : (*next_tid)++;
    for (int i = 0; i < n; i++)
        mr->tid[idx[i]] = tid;
    add_thread(mr, tid, name, "");
    return MS_OK;
}

/* Every lane of rank li: comm lanes (by name) first, then the others. */
static ms_status layout_rank(merge_ctx *c, int li) {
    trace_log *l = &c->set->logs[li];
    merge_rank *mr = &c->ranks[li];
    int n = l->n_spans, n_strs = c->set->n_strs, next_tid = TID_COMM0;
    int *count = calloc((size_t)n_strs + 1, sizeof *count);
    int *idx = malloc(((size_t)n + 1) * sizeof *idx),
        *work = malloc(((size_t)n + 1) * sizeof *work);
    mr->tid = malloc(((size_t)n + 1) * sizeof *mr->tid);
    mr->off = malloc(((size_t)n + 1) * sizeof *mr->off);
    mr->threads = malloc(((size_t)n + (size_t)n_strs + 1) * sizeof *mr->threads);
    ms_status st = MS_OK;
    if (!count || !idx || !work || !mr->tid || !mr->off || !mr->threads) {
        st = ms_error(MS_ERR_NOMEM, "%s: out of memory", l->path);
        goto out;
    }
    for (int i = 0; i < n; i++)
        count[l->spans[i].lane]++;
    for (int pass = 0; pass < 2; pass++) {
        /* lanes in name order: strs are interned in order of appearance */
        int *done = calloc((size_t)n_strs + 1, sizeof *done);
        if (!done) {
            st = ms_error(MS_ERR_NOMEM, "%s: out of memory", l->path);
            goto out;
        }
        for (;;) {
            int best = -1;
            for (int s = 0; s < n_strs; s++)
                if (count[s] && !done[s] && !strncmp(c->set->strs[s], "comm:", 5) == !pass &&
                    (best < 0 || strcmp(c->set->strs[s], c->set->strs[best]) < 0))
                    best = s;
            if (best < 0) break;
            done[best] = 1;
            int k = 0;
            for (int i = 0; i < n; i++)
                if (l->spans[i].lane == best) idx[k++] = i;
            st = layout_lane(c, li, best, idx, k, work, &next_tid);
            if (st != MS_OK) break;
        }
        free(done);
        if (st != MS_OK) goto out;
    }
out:
    free(count);
    free(idx);
    free(work);
    return st;
}

static int cmp_p2p(const void *a, const void *b) {
    const p2p_op *x = a, *y = b;
    if (x->src != y->src) return x->src < y->src ? -1 : 1;
    if (x->dst != y->dst) return x->dst < y->dst ? -1 : 1;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    return (x->span > y->span) - (x->span < y->span);
}

static int same_key(const p2p_op *x, const p2p_op *y) {
    return x->src == y->src && x->dst == y->dst && x->group == y->group && x->tag == y->tag;
}

/* All sends (want_send) or recvs on comm lanes, sorted by match key. */
static p2p_op *collect_p2p(const trace_set *s, int want_send, int *n_out) {
    int name = trace_str_find(s, want_send ? "send" : "recv"), n = 0, cap = 0;
    p2p_op *ops = NULL;
    *n_out = 0;
    for (int li = 0; name >= 0 && li < s->n_logs; li++) {
        const trace_log *l = &s->logs[li];
        for (int i = 0; i < l->n_spans; i++) {
            const trace_span *sp = &l->spans[i];
            if (sp->name != name || !(sp->flags & TRACE_HAS_PEER) || (sp->flags & TRACE_IS_MARK) ||
                strncmp(s->strs[sp->lane], "comm:", 5))
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                p2p_op *p = realloc(ops, (size_t)cap * sizeof *p);
                MS_CHECK(p);
                ops = p;
            }
            ops[n++] = (p2p_op){want_send ? l->rank : sp->peer,
                                want_send ? sp->peer : l->rank,
                                sp->group,
                                sp->flags & TRACE_HAS_TAG ? sp->tag : -1,
                                sp->t0,
                                li,
                                i};
        }
    }
    if (n) qsort(ops, (size_t)n, sizeof *ops, cmp_p2p);
    *n_out = n;
    return ops;
}

/* Where an arrow leaves a send (its start: the data cannot arrive before
 * it) or reaches a recv (its end, 1 ns inside so that it binds to this
 * span and not to one starting right then), in us from the origin. */
static double flow_us(const merge_ctx *c, int li, int si, int at_end) {
    const trace_span *sp = &c->set->logs[li].spans[si];
    int64_t t = at_end ? sp->t1 - (sp->t1 - sp->t0 >= 2) : sp->t0;
    return (double)(t + c->ranks[li].off[si] - c->t_min) / 1e3;
}

/* The k-th send S->P (group, tag) pairs with the k-th recv on P from S:
 * an arrow from the send's start to the recv's end (mid to mid went
 * backwards in time for a recv posted long before its send). */
static ms_status write_flows(merge_ctx *c, ms_atomic_file *af, int *first) {
    int ns = 0, nr = 0, i = 0, j = 0;
    p2p_op *snd = collect_p2p(c->set, 1, &ns), *rcv = collect_p2p(c->set, 0, &nr);
    ms_status st = MS_OK;
    while (st == MS_OK && (i < ns || j < nr)) {
        int cmp = i >= ns                      ? 1
                  : j >= nr                    ? -1
                  : same_key(&snd[i], &rcv[j]) ? 0
                                               : cmp_p2p(&snd[i], &rcv[j]);
        if (cmp < 0) {
            c->st.unmatched_sends++, i++;
            continue;
        }
        if (cmp > 0) {
            c->st.unmatched_recvs++, j++;
            continue;
        }
        const p2p_op *a = &snd[i++], *b = &rcv[j++];
        int id = ++c->st.flows;
        st = ms_atomic_printf(af,
                              "%s\n{\"ph\":\"s\",\"id\":%d,\"cat\":\"p2p\",\"name\":\"send\","
                              "\"pid\":%d,\"tid\":%d,\"ts\":%.3f},\n"
                              "{\"ph\":\"f\",\"bp\":\"e\",\"id\":%d,\"cat\":\"p2p\",\"name\":"
                              "\"send\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
                              *first ? "" : ",", id, a->src, c->ranks[a->log].tid[a->span],
                              flow_us(c, a->log, a->span, 0), id, b->dst,
                              c->ranks[b->log].tid[b->span], flow_us(c, b->log, b->span, 1));
        *first = 0;
    }
    free(snd);
    free(rcv);
    return st;
}

/* process_name / process_sort_index and thread_name / thread_sort_index. */
static ms_status write_metadata(merge_ctx *c, ms_atomic_file *af, int li, int sort_index,
                                int *first) {
    const trace_log *l = &c->set->logs[li];
    const merge_rank *mr = &c->ranks[li];
    char name[512], q[1100];
    snprintf(name, sizeof name, "rank %d (dp %d, pp %d, tp %d) %s", l->rank, l->coord.dp,
             l->coord.pp, l->coord.tp, l->host);
    MS_TRY(ms_atomic_printf(af,
                            "%s\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
                            "\"args\":{\"name\":%s}},\n"
                            "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
                            "\"args\":{\"sort_index\":%d}}",
                            *first ? "" : ",", l->rank, trace_json_quote(q, sizeof q, name),
                            l->rank, sort_index));
    *first = 0;
    for (int t = 0; t < mr->n_threads; t++)
        MS_TRY(ms_atomic_printf(af,
                                ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,"
                                "\"args\":{\"name\":%s}},\n"
                                "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,"
                                "\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                                l->rank, mr->threads[t].tid,
                                trace_json_quote(q, sizeof q, mr->threads[t].name), l->rank,
                                mr->threads[t].tid, mr->threads[t].tid));
    return MS_OK;
}

/* Complete events (spans) and instants (marks) of one rank. */
static ms_status write_events(merge_ctx *c, ms_atomic_file *af, int li) {
    const trace_log *l = &c->set->logs[li];
    const merge_rank *mr = &c->ranks[li];
    for (int i = 0; i < l->n_spans; i++) {
        const trace_span *sp = &l->spans[i];
        double ts = (double)(sp->t0 + mr->off[i] - c->t_min) / 1e3;
        const char *lane = c->quoted[sp->lane], *name = c->quoted[sp->name];
        if (sp->flags & TRACE_IS_MARK)
            MS_TRY(
                ms_atomic_printf(af,
                                 ",\n{\"ph\":\"i\",\"s\":\"t\",\"name\":%s,\"cat\":%s,\"pid\":%d,"
                                 "\"tid\":%d,\"ts\":%.3f%s%s}",
                                 name, lane, l->rank, mr->tid[i], ts, sp->args ? ",\"args\":" : "",
                                 sp->args ? sp->args : ""));
        else
            MS_TRY(ms_atomic_printf(af,
                                    ",\n{\"ph\":\"X\",\"name\":%s,\"cat\":%s,\"pid\":%d,\"tid\":%d,"
                                    "\"ts\":%.3f,\"dur\":%.3f%s%s}",
                                    name, lane, l->rank, mr->tid[i], ts,
                                    (double)(sp->t1 - sp->t0) / 1e3, sp->args ? ",\"args\":" : "",
                                    sp->args ? sp->args : ""));
        c->st.events++;
    }
    return MS_OK;
}

static int *sort_order(const trace_set *s) {
    int *ord = malloc(((size_t)s->n_logs + 1) * sizeof *ord);
    MS_CHECK(ord);
    for (int i = 0; i < s->n_logs; i++) { /* insertion sort by (pp, dp, tp, rank) */
        int j = i;
        while (j > 0 && trace_coord_cmp(s->logs[ord[j - 1]].coord, s->logs[i].coord) > 0) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
    return ord;
}

static ms_status write_trace(merge_ctx *c, const char *out_path) {
    ms_atomic_file af;
    int first = 1, *ord = sort_order(c->set);
    char src[4200];
    ms_status st = ms_atomic_open(&af, out_path);
    if (st == MS_OK) st = ms_atomic_printf(&af, "{\"traceEvents\":[");
    for (int k = 0; st == MS_OK && k < c->set->n_logs; k++)
        st = write_metadata(c, &af, ord[k], k, &first);
    for (int li = 0; st == MS_OK && li < c->set->n_logs; li++)
        st = write_events(c, &af, li);
    if (st == MS_OK) st = write_flows(c, &af, &first);
    if (st == MS_OK)
        st = ms_atomic_printf(&af,
                              "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"ranks\":%d,"
                              "\"clock_skew_us\":%.3f,\"dropped_events\":%lld,\"flows\":%d,"
                              "\"unmatched_sends\":%d,\"unmatched_recvs\":%d,\"source\":%s}}\n",
                              c->st.ranks, c->st.skew_us, (long long)c->st.dropped, c->st.flows,
                              c->st.unmatched_sends, c->st.unmatched_recvs,
                              trace_json_quote(src, sizeof src, c->set->dir));
    if (st == MS_OK) st = ms_atomic_commit(&af);
    ms_atomic_abort(&af);
    free(ord);
    return st;
}

/* Lay out every rank, find the time origin, the skew and the drops. */
static ms_status prepare(merge_ctx *c) {
    trace_set *s = c->set;
    c->st.ranks = s->n_logs;
    c->ranks = calloc((size_t)s->n_logs + 1, sizeof *c->ranks);
    c->quoted = calloc((size_t)s->n_strs + 1, sizeof *c->quoted);
    if (!c->ranks || !c->quoted) return ms_error(MS_ERR_NOMEM, "%s: out of memory", s->dir);
    for (int i = 0; i < s->n_strs; i++) {
        size_t n = 6 * strlen(s->strs[i]) + 10; /* trace_json_quote keeps 8 spare */
        if (!(c->quoted[i] = malloc(n))) return ms_error(MS_ERR_NOMEM, "out of memory");
        trace_json_quote(c->quoted[i], n, s->strs[i]);
    }
    int64_t err = 0;
    int any = 0;
    for (int li = 0; li < s->n_logs; li++) {
        const trace_log *l = &s->logs[li];
        MS_TRY(layout_rank(c, li));
        for (int i = 0; i < l->n_spans; i++) {
            int64_t g = l->spans[i].t0 + c->ranks[li].off[i];
            if (!any || g < c->t_min) c->t_min = g;
            any = 1;
        }
        for (int k = 0; k < l->n_clocks; k++)
            err = l->clocks[k].err > err ? l->clocks[k].err : err;
        c->st.dropped += l->dropped;
    }
    c->st.skew_us = (double)err / 1e3;
    return MS_OK;
}

ms_status trace_merge(const char *dir, const char *out_path, trace_merge_stats *stats) {
    merge_ctx c = {0};
    ms_status st = trace_set_load(dir, TRACE_LOAD_ARGS, &c.set);
    if (st == MS_OK) st = prepare(&c);
    if (st == MS_OK) st = write_trace(&c, out_path);
    if (st == MS_OK && (c.st.unmatched_sends || c.st.unmatched_recvs))
        ms_warn("%s: %d send(s) and %d recv(s) without their partner (a log cut short?)", dir,
                c.st.unmatched_sends, c.st.unmatched_recvs);
    if (stats) *stats = c.st;
    for (int li = 0; c.set && c.ranks && li < c.set->n_logs; li++) {
        free(c.ranks[li].tid);
        free(c.ranks[li].off);
        free(c.ranks[li].threads);
    }
    for (int i = 0; c.set && c.quoted && i < c.set->n_strs; i++)
        free(c.quoted[i]);
    free(c.quoted);
    free(c.ranks);
    trace_set_free(c.set);
    return st;
}
