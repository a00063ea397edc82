/* trace_merge.c - merge per-rank event logs into one Chrome Trace Event
 * Format file: a process per rank, a thread per lane (comm lanes split
 * into sub-threads so that complete events nest), clocks aligned to rank 0,
 * and a flow arrow from every send to its recv. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/jsonstr.h"
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

/* A send or recv as its flow arrow needs it (no padding: the spill file gets no unset
 * bytes). */
typedef struct {
    int32_t src, dst, group, tag; /* global ranks; the key that pairs a send with a recv */
    int32_t tid;                  /* the thread of its span */
    int32_t step;                 /* its span's step (0: none): pairs only within one */
    int64_t g; /* global ns where its arrow leaves (a send) or arrives (a recv) */
} p2p_op;

/* A rank's sends and recvs in the spill file (in ops): sends at [send, send + n_send), its
 * recvs right after them. */
typedef struct {
    int64_t send, n_send, n_recv;
} p2p_seg;

#define P2P_BUF 32 /* ops a reader holds */

/* A reader of one segment of the spill file. */
typedef struct {
    int64_t at, end; /* the next op to read into buf, the segment's end */
    int n, k;        /* ops in buf, the current one */
    p2p_op buf[P2P_BUF];
} p2p_reader;

typedef struct {
    trace_set *set;
    merge_rank *ranks;
    char **quoted; /* every interned string as a JSON literal */
    int n_quoted;
    int64_t t_min;
    int quiet; /* the second read of a log: its warnings were said on the first */
    /* Every rank's sends and recvs, written to an unlinked file next to the output as each
     * log is written, each rank's sorted (by key, then start): memory holds one rank's, and
     * the flows pair them reading a few ops of each rank at a time. */
    int spill;
    int64_t n_spilled;
    p2p_seg *segs; /* [n_logs] */
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
        /* the spans ended by now leave the stack first, also before a mark
         * (which took an ended span's offset: its own clock's, if it moved
         * between them, was lost) */
        while (top && l->spans[stack[top - 1]].t1 <= s->t0)
            top--;
        if (s->flags & TRACE_IS_MARK) {
            off[idx[i]] = top ? off[stack[0]] : trace_log_offset(l, s->t0);
            continue;
        }
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
    if (cut && !c->quiet)
        ms_warn("%s: %d span(s) on lane '%s' overlap their parent; cut to nest", l->path, cut,
                name);
    c->st.clamped += c->quiet ? 0 : cut;
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
    free(mr->tid), free(mr->off), free(mr->threads); /* a log's second read: laid out again */
    mr->n_threads = 0;
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
    { /* room was made for a thread per span; the threads are kept for every rank */
        merge_thread *t = realloc(mr->threads, ((size_t)mr->n_threads + 1) * sizeof *t);
        if (t) mr->threads = t;
    }
out:
    free(count);
    free(idx);
    free(work);
    return st;
}

/* A rank's op before it is spilled: sorted by key, step, then start (then span: stable). */
typedef struct {
    p2p_op op;
    int64_t t0;
    int span;
} p2p_entry;

static int cmp_key(const p2p_op *x, const p2p_op *y) {
    if (x->src != y->src) return x->src < y->src ? -1 : 1;
    if (x->dst != y->dst) return x->dst < y->dst ? -1 : 1;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    return (x->tag > y->tag) - (x->tag < y->tag);
}

/* By key, then step: the order of a rank's segment, and what pairs a send with a recv. */
static int cmp_key_step(const p2p_op *x, const p2p_op *y) {
    int c = cmp_key(x, y);
    return c ? c : (x->step > y->step) - (x->step < y->step);
}

static int cmp_entry(const void *a, const void *b) {
    const p2p_entry *x = a, *y = b;
    int c = cmp_key_step(&x->op, &y->op);
    if (c) return c;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    return (x->span > y->span) - (x->span < y->span);
}

/* Where an arrow leaves a send (its start: the data cannot arrive before
 * it) or reaches a recv (its end, 1 ns inside so that it binds to this
 * span and not to one starting right then), global ns. */
static int64_t flow_at(const trace_span *sp, int64_t off, int at_end) {
    return (at_end ? sp->t1 - (sp->t1 - sp->t0 >= 2) : sp->t0) + off;
}

static ms_status spill_write(merge_ctx *c, const p2p_entry *e, int n, const char *path) {
    p2p_op buf[256];
    for (int i = 0; i < n;) {
        int k = 0;
        for (; k < 256 && i < n; k++, i++)
            buf[k] = e[i].op;
        for (size_t done = 0, len = (size_t)k * sizeof *buf; done < len;) {
            ssize_t w = write(c->spill, (const char *)buf + done, len - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0)
                return ms_error(MS_ERR_IO, "%s: writing its sends and recvs aside: %s", path,
                                w < 0 ? strerror(errno) : "no space");
            done += (size_t)w;
        }
    }
    c->n_spilled += n;
    return MS_OK;
}

/* Log li's sends and recvs on comm lanes (laid out: thread, offset), each sorted, to the
 * spill file: its segment. */
static ms_status spill_p2p(merge_ctx *c, int li) {
    const trace_set *s = c->set;
    const trace_log *l = &s->logs[li];
    const merge_rank *mr = &c->ranks[li];
    int send = trace_str_find(s, "send"), recv = trace_str_find(s, "recv"), n[2] = {0, 0};
    p2p_entry *e = malloc(((size_t)l->n_spans + 1) * sizeof *e);
    if (!e) return ms_error(MS_ERR_NOMEM, "%s: out of memory", l->path);
    ms_status st = MS_OK;
    for (int pass = 0; pass < 2 && st == MS_OK; pass++) { /* the sends, then the recvs */
        int k = 0;
        for (int i = 0; i < l->n_spans; i++) {
            const trace_span *sp = &l->spans[i];
            int is_send = sp->name == send;
            if ((!is_send && sp->name != recv) || sp->name < 0 || is_send != !pass ||
                !(sp->flags & TRACE_HAS_PEER) || (sp->flags & TRACE_IS_MARK) ||
                strncmp(s->strs[sp->lane], "comm:", 5))
                continue;
            e[k++] = (p2p_entry){{is_send ? l->rank : sp->peer, is_send ? sp->peer : l->rank,
                                  sp->group, sp->flags & TRACE_HAS_TAG ? sp->tag : -1, mr->tid[i],
                                  sp->flags & TRACE_HAS_STEP ? sp->step : 0,
                                  flow_at(sp, mr->off[i], !is_send)},
                                 sp->t0,
                                 i};
        }
        if (k) qsort(e, (size_t)k, sizeof *e, cmp_entry);
        n[pass] = k;
        st = spill_write(c, e, k, l->path);
    }
    c->segs[li] = (p2p_seg){c->n_spilled - n[0] - n[1], n[0], n[1]};
    free(e);
    return st;
}

/* The reader's current op, NULL at its segment's end. */
static const p2p_op *reader_peek(merge_ctx *c, p2p_reader *r, ms_status *st) {
    if (r->k < r->n) return &r->buf[r->k];
    if (r->at >= r->end || *st != MS_OK) return NULL;
    int64_t want = r->end - r->at < P2P_BUF ? r->end - r->at : P2P_BUF;
    size_t len = (size_t)want * sizeof *r->buf, got = 0;
    while (got < len) {
        ssize_t k = pread(c->spill, (char *)r->buf + got, len - got,
                          (off_t)(r->at * (int64_t)sizeof *r->buf) + (off_t)got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            *st = ms_error(MS_ERR_IO, "%s: reading the sends and recvs set aside: %s", c->set->dir,
                           k < 0 ? strerror(errno) : "file cut short");
            return NULL;
        }
        got += (size_t)k;
    }
    r->at += want;
    r->n = (int)want, r->k = 0;
    return &r->buf[0];
}

static int log_of_rank(const trace_set *s, int rank) { /* logs are sorted by rank */
    int lo = 0, hi = s->n_logs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (s->logs[mid].rank == rank) return mid;
        if (s->logs[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static ms_status write_flow(merge_ctx *c, ms_atomic_file *af, int *first, const p2p_op *a,
                            const p2p_op *b) {
    long long id = ++c->st.flows; /* a week-long pipeline's transfers pass 2^31 */
    MS_TRY(ms_atomic_printf(af,
                            "%s\n{\"ph\":\"s\",\"id\":%lld,\"cat\":\"p2p\",\"name\":\"send\","
                            "\"pid\":%d,\"tid\":%d,\"ts\":%.3f},\n"
                            "{\"ph\":\"f\",\"bp\":\"e\",\"id\":%lld,\"cat\":\"p2p\",\"name\":"
                            "\"send\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
                            *first ? "" : ",", id, a->src, a->tid, (double)(a->g - c->t_min) / 1e3,
                            id, b->dst, b->tid, (double)(b->g - c->t_min) / 1e3));
    *first = 0;
    return MS_OK;
}

/* The k-th send S->P (group, tag) of a step pairs with the k-th recv on P from S of that
 * step (MPI keeps their order): an arrow from the send's start to the recv's end (mid to mid
 * went backwards in time for a recv posted long before its send).  Pairing within a step, not
 * over the whole log, keeps the pairs right when one end's oldest ops are gone (each rank's
 * log rotates at its own time) or lost (dropped events): those ops are left unmatched
 * instead of shifting every later pair.  The sends are read in (key, step) order (rank by
 * rank, each rank's sorted); the recvs of a key are in P's segment, whose reader only moves
 * forward as (key, step) grows: the recvs it passes over had no send. */
static ms_status write_flows(merge_ctx *c, ms_atomic_file *af, int *first) {
    const trace_set *s = c->set;
    p2p_reader *rd = calloc((size_t)s->n_logs + 1, sizeof *rd), snd;
    if (!rd) return ms_error(MS_ERR_NOMEM, "%s: out of memory", s->dir);
    for (int li = 0; li < s->n_logs; li++) {
        rd[li].at = c->segs[li].send + c->segs[li].n_send;
        rd[li].end = rd[li].at + c->segs[li].n_recv;
    }
    ms_status st = MS_OK;
    for (int li = 0; st == MS_OK && li < s->n_logs; li++) {
        snd = (p2p_reader){.at = c->segs[li].send, .end = c->segs[li].send + c->segs[li].n_send};
        const p2p_op *a;
        while ((a = reader_peek(c, &snd, &st))) {
            int pl = log_of_rank(s, a->dst);
            const p2p_op *b = NULL;
            while (pl >= 0 && (b = reader_peek(c, &rd[pl], &st)) && cmp_key_step(b, a) < 0) {
                c->st.unmatched_recvs++; /* a recv whose send is not in the logs */
                rd[pl].k++;
            }
            if (b && !cmp_key_step(b, a)) {
                p2p_op x = *a, y = *b;
                snd.k++, rd[pl].k++;
                st = write_flow(c, af, first, &x, &y);
            } else {
                c->st.unmatched_sends++;
                snd.k++;
            }
        }
    }
    for (int li = 0; st == MS_OK && li < s->n_logs; li++)
        for (; reader_peek(c, &rd[li], &st); rd[li].k++)
            c->st.unmatched_recvs++;
    free(rd);
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
                            *first ? "" : ",", l->rank, ms_json_quote(q, sizeof q, name), l->rank,
                            sort_index));
    *first = 0;
    for (int t = 0; t < mr->n_threads; t++)
        MS_TRY(ms_atomic_printf(af,
                                ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,"
                                "\"args\":{\"name\":%s}},\n"
                                "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,"
                                "\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                                l->rank, mr->threads[t].tid,
                                ms_json_quote(q, sizeof q, mr->threads[t].name), l->rank,
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

/* Quote the strings interned since the last call (a log read again may add some). */
static ms_status quote_new(merge_ctx *c) {
    trace_set *s = c->set;
    if (s->n_strs <= c->n_quoted) return MS_OK;
    char **q = realloc(c->quoted, ((size_t)s->n_strs + 1) * sizeof *q);
    if (!q) return ms_error(MS_ERR_NOMEM, "%s: out of memory", s->dir);
    c->quoted = q;
    for (; c->n_quoted < s->n_strs; c->n_quoted++) {
        size_t n = 6 * strlen(s->strs[c->n_quoted]) + 10; /* ms_json_quote keeps 8 spare */
        if (!(q[c->n_quoted] = malloc(n))) return ms_error(MS_ERR_NOMEM, "out of memory");
        ms_json_quote(q[c->n_quoted], n, s->strs[c->n_quoted]);
    }
    return MS_OK;
}

/* Pass 2, one log at a time: read it again with its args, lay it out as pass 1 did (the
 * clock alignment now known), write its events, set its sends and recvs aside, free it. */
static ms_status write_rank(merge_ctx *c, ms_atomic_file *af, int li) {
    MS_TRY(trace_log_load(c->set, li, TRACE_LOAD_ARGS | TRACE_LOAD_QUIET));
    c->quiet = 1;
    ms_status st = layout_rank(c, li);
    if (st == MS_OK) st = quote_new(c);
    if (st == MS_OK) st = write_events(c, af, li);
    if (st == MS_OK) st = spill_p2p(c, li);
    trace_log_unload_spans(&c->set->logs[li]);
    free(c->ranks[li].tid), free(c->ranks[li].off);
    c->ranks[li].tid = NULL, c->ranks[li].off = NULL;
    return st;
}

/* The file the sends and recvs are set aside in: next to the output (it needs the room
 * anyway), unlinked at once, so that nothing is left behind whatever happens. */
static ms_status open_spill(merge_ctx *c, const char *out_path) {
    char tmpl[4200];
    if (snprintf(tmpl, sizeof tmpl, "%s.p2p.XXXXXX", out_path) >= (int)sizeof tmpl)
        return ms_error(MS_ERR_ARG, "%s: path too long", out_path);
    if (!(c->segs = calloc((size_t)c->set->n_logs + 1, sizeof *c->segs)))
        return ms_error(MS_ERR_NOMEM, "out of memory");
    if ((c->spill = mkstemp(tmpl)) < 0)
        return ms_error(MS_ERR_IO, "%s: create: %s", tmpl, strerror(errno));
    unlink(tmpl);
    return MS_OK;
}

static ms_status write_trace(merge_ctx *c, const char *out_path) {
    ms_atomic_file af;
    int first = 1, *ord = sort_order(c->set);
    char src[4200];
    ms_status st = ms_atomic_open(&af, out_path);
    if (st == MS_OK) st = open_spill(c, out_path);
    if (st == MS_OK) st = ms_atomic_printf(&af, "{\"traceEvents\":[");
    for (int k = 0; st == MS_OK && k < c->set->n_logs; k++)
        st = write_metadata(c, &af, ord[k], k, &first);
    for (int li = 0; st == MS_OK && li < c->set->n_logs; li++)
        st = write_rank(c, &af, li);
    if (st == MS_OK) st = write_flows(c, &af, &first);
    if (st == MS_OK)
        st = ms_atomic_printf(&af,
                              "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"ranks\":%d,"
                              "\"clock_skew_us\":%.3f,\"dropped_events\":%lld,\"flows\":%lld,"
                              "\"unmatched_sends\":%lld,\"unmatched_recvs\":%lld,\"source\":%s}}\n",
                              c->st.ranks, c->st.skew_us, (long long)c->st.dropped, c->st.flows,
                              c->st.unmatched_sends, c->st.unmatched_recvs,
                              ms_json_quote(src, sizeof src, c->set->dir));
    if (st == MS_OK) st = ms_atomic_commit(&af);
    ms_atomic_abort(&af);
    free(ord);
    return st;
}

/* Pass 1, one log at a time (without args): its threads, the earliest global time, skew
 * and drops; only the threads and the clocks are kept.
 * A log without clock lines is laid out at offset 0 and moved once all clocks are read
 * (its offset is one constant, so the layout does not change). */
static ms_status prepare(merge_ctx *c) {
    trace_set *s = c->set;
    c->st.ranks = s->n_logs;
    c->ranks = calloc((size_t)s->n_logs + 1, sizeof *c->ranks);
    int64_t *first = calloc((size_t)s->n_logs + 1, sizeof *first);
    char *any = calloc((size_t)s->n_logs + 1, 1);
    if (!c->ranks || !first || !any) {
        free(first), free(any);
        return ms_error(MS_ERR_NOMEM, "%s: out of memory", s->dir);
    }
    int64_t err = 0;
    ms_status st = MS_OK;
    for (int li = 0; st == MS_OK && li < s->n_logs; li++) {
        trace_log *l = &s->logs[li];
        st = trace_log_load(s, li, 0);
        if (st == MS_OK) st = layout_rank(c, li);
        for (int i = 0; st == MS_OK && i < l->n_spans; i++) {
            int64_t g = l->spans[i].t0 + c->ranks[li].off[i];
            if (!any[li] || g < first[li]) first[li] = g;
            any[li] = 1;
        }
        for (int k = 0; k < l->n_clocks; k++)
            err = l->clocks[k].err > err ? l->clocks[k].err : err;
        c->st.dropped += l->dropped;
        trace_log_unload_spans(l);
        free(c->ranks[li].tid), free(c->ranks[li].off);
        c->ranks[li].tid = NULL, c->ranks[li].off = NULL;
    }
    if (st == MS_OK) {
        trace_set_align(s);
        int have = 0;
        for (int li = 0; li < s->n_logs; li++) {
            int64_t b = s->logs[li].n_clocks ? 0 : s->logs[li].base_offset;
            if (any[li] && (!have || first[li] + b < c->t_min)) c->t_min = first[li] + b;
            have |= any[li];
        }
        c->st.skew_us = (double)err / 1e3;
        st = quote_new(c);
    }
    free(first);
    free(any);
    return st;
}

ms_status trace_merge(const char *dir, const char *out_path, trace_merge_stats *stats) {
    merge_ctx c = {.spill = -1};
    ms_status st = trace_set_load(dir, TRACE_LOAD_HEADERS, &c.set);
    if (st == MS_OK) st = prepare(&c);
    if (st == MS_OK) st = write_trace(&c, out_path);
    if (st == MS_OK && (c.st.unmatched_sends || c.st.unmatched_recvs))
        ms_warn("%s: %lld send(s) and %lld recv(s) without their partner (the other end's log "
                "rotated past it or cut short, or its events dropped)",
                dir, c.st.unmatched_sends, c.st.unmatched_recvs);
    if (stats) *stats = c.st;
    for (int li = 0; c.set && c.ranks && li < c.set->n_logs; li++) {
        free(c.ranks[li].tid);
        free(c.ranks[li].off);
        free(c.ranks[li].threads);
    }
    for (int i = 0; c.quoted && i < c.n_quoted; i++)
        free(c.quoted[i]);
    free(c.quoted);
    free(c.ranks);
    free(c.segs);
    if (c.spill >= 0) close(c.spill);
    trace_set_free(c.set);
    return st;
}
