/* trace_load.c - read a run's per-rank event logs (events_rNNNNN.jsonl)
 * line by line into a trace_set, and align their clocks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/jsonstr.h"
#include "base/hash.h"
#include "base/log.h"
#include "trace/trace_internal.h"

/* Why load_log found no header line (its *no_header; 0: it found one). */
enum { TRACE_NO_HEADER = 1, TRACE_NO_HEADER_NUL };

/* The slot of str's hash (the table's address as the seed: a crafted log cannot aim at
 * one table's collisions across runs). */
static size_t str_slot(const trace_set *s, const char *str) {
    return (size_t)ms_fnv1a_str(MS_FNV1A_BASIS ^ (uint64_t)(uintptr_t)s->str_tab, str) &
           (size_t)(s->tab_cap - 1);
}

/* The table at twice the strings or more (rebuilt when it grows); -1 on OOM. */
static int tab_fit(trace_set *s) {
    if (2 * (s->n_strs + 1) <= s->tab_cap) return 0;
    int cap = s->tab_cap ? 2 * s->tab_cap : 64;
    int *t = malloc((size_t)cap * sizeof *t);
    if (!t) return -1;
    free(s->str_tab);
    s->str_tab = t, s->tab_cap = cap;
    for (int i = 0; i < cap; i++)
        t[i] = -1;
    for (int i = 0; i < s->n_strs; i++) {
        size_t k = str_slot(s, s->strs[i]);
        while (t[k] >= 0)
            k = (k + 1) & (size_t)(cap - 1);
        t[k] = i;
    }
    return 0;
}

/* Before, a scan of every string a span: a log of 40,000 distinct span names took 4-10 s
 * to merge, and ten times that would have taken minutes. */
static int intern(trace_set *s, const char *str) {
    int i = trace_str_find(s, str);
    if (i >= 0) return i;
    if (tab_fit(s) != 0) return -1;
    if (s->n_strs == s->cap_strs) {
        int cap = s->cap_strs ? 2 * s->cap_strs : 32;
        char **p = realloc(s->strs, (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->strs = p;
        s->cap_strs = cap;
    }
    if (!(s->strs[s->n_strs] = strdup(str))) return -1;
    size_t k = str_slot(s, str);
    while (s->str_tab[k] >= 0)
        k = (k + 1) & (size_t)(s->tab_cap - 1);
    s->str_tab[k] = s->n_strs;
    return s->n_strs++;
}

int trace_str_find(const trace_set *s, const char *str) {
    if (!s->str_tab) {
        for (int i = 0; i < s->n_strs; i++)
            if (!strcmp(s->strs[i], str)) return i;
        return -1;
    }
    for (size_t k = str_slot(s, str);; k = (k + 1) & (size_t)(s->tab_cap - 1)) {
        int i = s->str_tab[k];
        if (i < 0) return -1;
        if (!strcmp(s->strs[i], str)) return i;
    }
}

int64_t trace_log_offset(const trace_log *l, int64_t t) {
    if (l->n_clocks == 0) return l->base_offset;
    int lo = 0, hi = l->n_clocks - 1; /* the latest clock line with mono <= t */
    if (l->clocks[0].mono > t) return l->clocks[0].offset;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->clocks[mid].mono <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return l->clocks[lo].offset;
}

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* The header line: rank, world, host, grid place, the clock pair. */
static ms_status parse_header(trace_log *l, const cJSON *j, const char *where) {
    int64_t rank, world, v;
    if (!trace_json_int(j, "rank", 0, TRACE_MAX_WORLD, &rank) ||
        !trace_json_int(j, "world", 1, TRACE_MAX_WORLD, &world) || rank >= world)
        return ms_error(MS_ERR_FORMAT, "%s: header needs integer rank < world <= %d", where,
                        TRACE_MAX_WORLD);
    if (trace_json_int(j, "version", INT64_MIN, INT64_MAX, &v) && v != 1)
        return ms_error(MS_ERR_FORMAT, "%s: event log version %lld; this build reads version 1",
                        where, (long long)v);
    l->rank = (int)rank;
    l->world = (int)world;
    const char *host = str_of(j, "host");
    snprintf(l->host, sizeof l->host, "%s", host ? host : "unknown");
    ms_utf8_fix(l->host); /* cut to fit: maybe inside a character */
    l->pid = trace_json_int(j, "pid", 0, INT32_MAX, &v) ? (int)v : 0;
    l->shape = (trace_coord){(int)world, 1, 1};
    if (!trace_coord_parse(cJSON_GetObjectItemCaseSensitive(j, "shape"), &l->shape) ||
        (int64_t)l->shape.dp * l->shape.pp * l->shape.tp != world)
        l->shape = (trace_coord){(int)world, 1, 1};
    if (!trace_coord_parse(cJSON_GetObjectItemCaseSensitive(j, "coord"), &l->coord) ||
        l->coord.dp >= l->shape.dp || l->coord.pp >= l->shape.pp || l->coord.tp >= l->shape.tp)
        l->coord = trace_coord_of(l->rank, l->shape);
    l->mono_ns = trace_json_int(j, "mono_ns", -TRACE_T_MAX, TRACE_T_MAX, &v) ? v : 0;
    l->wall_ns = trace_json_int(j, "wall_ns", -TRACE_T_MAX, TRACE_T_MAX, &v) ? v : 0;
    l->opened_ns =
        trace_json_int(j, "opened_wall_ns", -TRACE_T_MAX, TRACE_T_MAX, &v) ? v : l->wall_ns;
    const char *run = str_of(j, "run"); /* 16 hex digits; anything else: not said */
    char *end = NULL;
    l->run = run && strlen(run) == 16 && strspn(run, "0123456789abcdef") == 16
                 ? strtoull(run, &end, 16)
                 : 0;
    return MS_OK;
}

static ms_status parse_clock(trace_log *l, const cJSON *j, const char *where) {
    trace_clock c;
    if (!trace_json_int(j, "mono_ns", -TRACE_T_MAX, TRACE_T_MAX, &c.mono) ||
        !trace_json_int(j, "offset_ns", -TRACE_T_MAX, TRACE_T_MAX, &c.offset))
        return ms_error(MS_ERR_FORMAT,
                        "%s: clock line needs integer mono_ns and offset_ns (|value| < 2^62)",
                        where);
    if (!trace_json_int(j, "err_ns", 0, INT64_MAX, &c.err)) c.err = 0;
    if (l->n_clocks && c.mono < l->clocks[l->n_clocks - 1].mono)
        return ms_error(MS_ERR_FORMAT, "%s: clock line goes back in time (mono_ns %lld < %lld)",
                        where, (long long)c.mono, (long long)l->clocks[l->n_clocks - 1].mono);
    if (l->n_clocks == l->cap_clocks) {
        int cap = l->cap_clocks ? 2 * l->cap_clocks : 16;
        trace_clock *p = realloc(l->clocks, (size_t)cap * sizeof *p);
        if (!p) return ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
        l->clocks = p;
        l->cap_clocks = cap;
    }
    l->clocks[l->n_clocks++] = c;
    return MS_OK;
}

/* Optional int args copied into the span's fields. */
static void span_ints(trace_span *sp, const cJSON *j) {
    int64_t v;
    if (trace_json_int(j, "step", INT32_MIN, INT32_MAX, &v)) {
        sp->step = (int32_t)v;
        sp->flags |= TRACE_HAS_STEP;
    }
    if (trace_json_int(j, "peer", INT32_MIN, INT32_MAX, &v) && v >= 0) {
        sp->peer = (int32_t)v;
        sp->flags |= TRACE_HAS_PEER;
    }
    if (trace_json_int(j, "tag", INT32_MIN, INT32_MAX, &v)) {
        sp->tag = (int32_t)v;
        sp->flags |= TRACE_HAS_TAG;
    }
}

/* A span or mark line (j is consumed: its known keys are removed so that
 * what is left becomes the args). */
static ms_status parse_span(trace_set *s, trace_log *l, cJSON *j, int mark, unsigned flags,
                            const char *where) {
    const char *name = str_of(j, "name"), *lane = str_of(j, "lane");
    trace_span sp = {.group = -1};
    if (!name || !lane)
        return ms_error(MS_ERR_FORMAT, "%s: %s line needs string \"name\" and \"lane\"", where,
                        mark ? "mark" : "span");
    if (mark ? !trace_json_int(j, "t", -TRACE_T_MAX, TRACE_T_MAX, &sp.t0)
             : !trace_json_int(j, "t0", -TRACE_T_MAX, TRACE_T_MAX, &sp.t0) ||
                   !trace_json_int(j, "t1", -TRACE_T_MAX, TRACE_T_MAX, &sp.t1))
        return ms_error(MS_ERR_FORMAT, "%s: %s '%s' needs integer %s (|t| < 2^62 ns)", where,
                        mark ? "mark" : "span", name, mark ? "t" : "t0 and t1");
    if (mark) {
        sp.t1 = sp.t0;
        sp.flags |= TRACE_IS_MARK;
    }
    if (sp.t1 < sp.t0)
        return ms_error(MS_ERR_FORMAT, "%s: span '%s' ends before it starts (t1 %lld < t0 %lld)",
                        where, name, (long long)sp.t1, (long long)sp.t0);
    if ((flags & TRACE_LOAD_COMPUTE) && strcmp(lane, "compute")) return MS_OK;
    const char *group = str_of(j, "group");
    if (!group && !strncmp(lane, "comm:", 5)) group = lane + 5;
    sp.name = intern(s, name);
    sp.lane = intern(s, lane);
    if (group) sp.group = intern(s, group);
    if (sp.name < 0 || sp.lane < 0 || (group && sp.group < 0))
        return ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
    span_ints(&sp, j);
    if (flags & TRACE_LOAD_ARGS) {
        static const char *known[] = {"type", "name", "lane", "t0", "t1", "t"};
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            cJSON_DeleteItemFromObjectCaseSensitive(j, known[k]);
        if (j->child && !(sp.args = cJSON_PrintUnformatted(j)))
            return ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
    }
    if (l->n_spans == l->cap_spans) {
        int cap = l->cap_spans ? 2 * l->cap_spans : 1024;
        trace_span *p = realloc(l->spans, (size_t)cap * sizeof *p);
        if (!p) {
            free(sp.args);
            return ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
        }
        l->spans = p;
        l->cap_spans = cap;
    }
    l->spans[l->n_spans++] = sp;
    return MS_OK;
}

/* One parsed line; the first (`first`: no line before it but blank ones) must be the header. */
static ms_status parse_line(trace_set *s, trace_log *l, cJSON *j, int first, unsigned flags,
                            const char *where) {
    const char *type = str_of(j, "type");
    if (!cJSON_IsObject(j) || !type)
        return ms_error(MS_ERR_FORMAT, "%s: expected a JSON object with a \"type\"", where);
    if (first || !strcmp(type, "header")) {
        if (strcmp(type, "header") || !first)
            return ms_error(MS_ERR_FORMAT, "%s: the header must be (only) the first line", where);
        return parse_header(l, j, where);
    }
    if (!strcmp(type, "clock")) return parse_clock(l, j, where);
    if (!strcmp(type, "span")) return parse_span(s, l, j, 0, flags, where);
    if (!strcmp(type, "mark")) return parse_span(s, l, j, 1, flags, where);
    if (!strcmp(type, "dropped")) {
        int64_t n;
        if (!trace_json_int(j, "count", 0, INT64_MAX, &n))
            return ms_error(MS_ERR_FORMAT, "%s: dropped line needs a count", where);
        l->dropped += n;
    }
    return MS_OK; /* unknown types: a newer writer */
}

/* Only blanks in line[0..len) (a NUL byte is none: read_line reads it as data). */
static int blank(const char *p, ssize_t len) {
    for (ssize_t i = 0; i < len; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r' && p[i] != '\n') return 0;
    return 1;
}

/* A file read line by line through its own buffer (memchr finds the
 * newlines, as getline does). */
typedef struct {
    FILE *f;
    size_t pos, end;
    char buf[1 << 16];
} line_reader;

/* One line (its '\n' kept, NUL bytes read as data) into *line, growing it
 * as getline does, but never past TRACE_LINE_MAX bytes: the length, -1 at
 * the end of the file, -2 for a longer line (a damaged or foreign file:
 * getline held all of a multi-GB line without a newline in memory), -3
 * out of memory. */
static ssize_t read_line(line_reader *r, char **line, size_t *cap) {
    size_t n = 0;
    for (;;) {
        if (r->pos == r->end) {
            r->pos = 0;
            r->end = fread(r->buf, 1, sizeof r->buf, r->f);
            if (r->end == 0) break;
        }
        const char *p = r->buf + r->pos, *nl = memchr(p, '\n', r->end - r->pos);
        size_t k = nl ? (size_t)(nl - p) + 1 : r->end - r->pos;
        if (n + k + 1 > TRACE_LINE_MAX) return -2;
        if (n + k + 1 > *cap) {
            size_t want = *cap ? *cap : 256;
            while (want < n + k + 1)
                want *= 2;
            if (want > TRACE_LINE_MAX) want = TRACE_LINE_MAX;
            char *q = realloc(*line, want);
            if (!q) return -3;
            *line = q, *cap = want;
        }
        memcpy(*line + n, p, k);
        n += k, r->pos += k;
        if (nl) break;
    }
    if (n == 0) return -1;
    (*line)[n] = 0;
    return (ssize_t)n;
}

/* Read one events file; `header_only` stops after the header.  A file
 * without a complete header line sets *no_header and is no error: empty,
 * blank lines only, or its first line cut (the rank was killed before its
 * first flush): TRACE_NO_HEADER; NUL bytes where the header should be (the
 * blocks a crash or power loss left unwritten read as zeros):
 * TRACE_NO_HEADER_NUL.  NUL bytes in the last line after the header are
 * such a tail, ignored with a warning as a cut line is; NUL bytes in a
 * line that a newline ends, a damaged log (FORMAT). */
static ms_status load_log(trace_set *s, trace_log *l, const char *path, unsigned flags,
                          int header_only, int *no_header) {
    FILE *f;
    MS_TRY(trace_fopen(path, &f));
    char *line = NULL, where[4200];
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, parsed = 0;
    ms_status st = MS_OK;
    *no_header = 0;
    line_reader *rd = malloc(sizeof *rd);
    if (!rd) {
        fclose(f);
        return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    }
    rd->f = f, rd->pos = rd->end = 0;
    while (st == MS_OK && (len = read_line(rd, &line, &cap)) != -1) {
        lineno++;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        if (len == -2) {
            st = ms_error(MS_ERR_FORMAT,
                          "%s: a line longer than %d MiB: not an event log (its lines are "
                          "short)",
                          where, TRACE_LINE_MAX >> 20);
            break;
        }
        if (len < 0) {
            st = ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
            break;
        }
        if (blank(line, len)) continue;
        int last = line[len - 1] != '\n';
        if (memchr(line, '\0', (size_t)len)) {
            if (!last)
                st = ms_error(MS_ERR_FORMAT, "%s: a NUL byte: a damaged event log", where);
            else if (!parsed)
                *no_header = TRACE_NO_HEADER_NUL;
            else if (!(flags & TRACE_LOAD_QUIET))
                ms_warn("%s: last line ignored: NUL bytes (a tail a crash or power loss left "
                        "unwritten)",
                        where);
            break;
        }
        ms_utf8_fix(line); /* names and args go into JSON output as they are */
        cJSON *j = cJSON_Parse(line);
        if (!j && last) { /* a killed writer */
            if (!parsed)
                *no_header = TRACE_NO_HEADER;
            else if (!(flags & TRACE_LOAD_QUIET))
                ms_warn("%s: incomplete last line ignored", where);
            break;
        }
        if (!j)
            st = ms_error(MS_ERR_FORMAT, "%s: malformed JSON line", where);
        else
            st = parse_line(s, l, j, !parsed, flags, where);
        cJSON_Delete(j);
        parsed++;
        if (header_only) break;
    }
    if (st == MS_OK && ferror(f)) st = ms_error(MS_ERR_IO, "%s: read: %s", path, strerror(errno));
    if (st == MS_OK && !parsed && !*no_header) *no_header = TRACE_NO_HEADER;
    free(line);
    free(rd);
    fclose(f);
    return st;
}

/* A rank's whole log: its older half PATH.1 (--trace-max-mb rotated it)
 * first, when the same process wrote it (same pid, host and rank in the
 * headers), then PATH.  A .1 of another process (an earlier run's) is
 * ignored. */
static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

static ms_status load_rank_log(trace_set *s, trace_log *l, const char *path, unsigned flags,
                               int header_only, int *no_header) {
    char older[4200] = "";
    trace_log a, b;
    /* the older half of PATH: PATH.1; of a stand-in NAME.jsonl.new, NAME.jsonl.1; a lone
     * NAME.jsonl.1 has none */
    if (ends_with(path, ".jsonl.new"))
        snprintf(older, sizeof older, "%.*s.1", (int)(strlen(path) - 4), path);
    else if (!ends_with(path, ".jsonl.1"))
        snprintf(older, sizeof older, "%s.1", path);
    if (!header_only && older[0] && access(older, F_OK) == 0 &&
        trace_log_read_header(older, &a) == MS_OK && trace_log_read_header(path, &b) == MS_OK &&
        a.pid > 0 && a.pid == b.pid && a.rank == b.rank && !strcmp(a.host, b.host) &&
        a.wall_ns <= b.wall_ns) {
        MS_TRY(load_log(s, l, older, flags, 0, no_header));
        l->wall0_ns = l->wall_ns;
    }
    return load_log(s, l, path, flags, header_only, no_header);
}

ms_status trace_log_read_header(const char *path, trace_log *l) {
    trace_set s = {0};
    int no_header;
    memset(l, 0, sizeof *l);
    ms_status st = load_log(&s, l, path, 0, 1, &no_header);
    if (st == MS_OK && no_header)
        st = ms_error(MS_ERR_FORMAT, "%s: no header line (%s)", path,
                      no_header == TRACE_NO_HEADER_NUL ? "NUL bytes: a damaged event log"
                                                       : "an empty or cut event log");
    for (int i = 0; i < s.n_strs; i++)
        free(s.strs[i]);
    free(s.strs);
    free(s.str_tab);
    return st;
}

/* Ranks without clock lines: aligned by the wall clocks of their headers
 * (NTP accuracy) to a rank that has clock lines (and so rank 0's clock),
 * else to the lowest rank without any either.  Said once. */
void trace_set_align(trace_set *s) {
    const trace_log *ref = NULL, *first = NULL;
    for (int i = 0; i < s->n_logs && !ref; i++)
        if (s->logs[i].n_clocks && s->logs[i].wall_ns) ref = &s->logs[i];
    for (int i = 0; i < s->n_logs && !ref; i++)
        if (s->logs[i].wall_ns) ref = &s->logs[i];
    if (!ref) return;
    /* rank 0's clock at the instant of ref's header */
    int64_t ref_global = ref->mono_ns + trace_log_offset(ref, ref->mono_ns);
    int n = 0;
    for (int i = 0; i < s->n_logs; i++) {
        trace_log *l = &s->logs[i];
        if (l->n_clocks || !l->wall_ns || l == ref) continue;
        /* each term under 2^62 (the parser's bound), their sum not: checked, and an offset
         * that could take a time past 2^63 is refused (it wrapped: spans 2^63 ns apart came
         * out 1 us apart) */
        int64_t d, off;
        const int64_t lim = (int64_t)1 << 62;
        if (__builtin_sub_overflow(l->wall_ns, ref->wall_ns, &d) ||
            __builtin_add_overflow(ref_global, d, &off) ||
            __builtin_sub_overflow(off, l->mono_ns, &off) || off >= lim || off <= -lim) {
            ms_warn("%s: its header's clocks (mono_ns %lld, wall_ns %lld) are too far from rank "
                    "%d's to align it: its times are left on its own clock",
                    l->path, (long long)l->mono_ns, (long long)l->wall_ns, ref->rank);
            continue;
        }
        l->base_offset = off;
        first = first ? first : l;
        n++;
    }
    if (n)
        ms_warn("%s%s: %d log(s) without clock lines, aligned to rank %d by the wall clock (NTP "
                "accuracy)",
                first->path, n > 1 ? " and others" : "", n, ref->rank);
}

/* The ranks of a run open their logs together, once the rank grid exists:
 * seconds apart, not ten minutes. */
#define TRACE_RUN_SPREAD_NS (600 * 1000000000LL)

/* Keep the logs of the newest run only: DIR may still hold the logs of
 * ranks that an earlier run with a larger world had (a new run replaces
 * only its own ranks' files).  The log opened last (a rotated file's
 * header says when its process opened the log: the ranks of a run rotate
 * at their own times, days apart in a long run) decides the world; the
 * others are dropped with a warning, and one of that world opened much
 * earlier than the newest is warned about.  Then say which ranks of that
 * world have no log. */
static void keep_one_run(trace_set *s) {
    int newest = 0, n = 0;
    for (int i = 1; i < s->n_logs; i++)
        if (s->logs[i].opened_ns > s->logs[newest].opened_ns) newest = i;
    /* the newest log's run: the logs of another run of the same world and grid are skipped
     * (a rank's log left by an earlier start, or one copied in) */
    uint64_t run = s->logs[newest].run;
    /* copied: the loop below moves the logs it keeps */
    int world = s->logs[newest].world;
    trace_coord shape = s->logs[newest].shape;
    int64_t wall = s->logs[newest].opened_ns;
    const char *path = s->logs[newest].path; /* owned by a log that is kept */
    char sh[2][64];
    for (int i = 0; i < s->n_logs; i++) {
        trace_log *l = &s->logs[i];
        /* another grid of the same world is another run too: a log of one was mixed in
         * without a word, its coordinates clashing with the others', and changed the
         * verdict (its rank scored against ranks of other stages) */
        if (l->world == world && trace_coord_cmp(l->shape, shape)) {
            ms_warn("%s: skipped: a log of another run (grid %s; %s, the newest log, says %s)",
                    l->path, trace_coord_str(sh[0], sizeof sh[0], l->shape), path,
                    trace_coord_str(sh[1], sizeof sh[1], shape));
            trace_log_unload(l);
            free(l->path);
            continue;
        }
        /* another start of a job of the same world and grid (its logs say which: their
         * "run"), a log an earlier run left or one copied in: mixed in, it named a healthy
         * job's rank as a straggler, and its arrows ran backwards in time */
        if (l->world == world && run && l->run && l->run != run) {
            ms_warn("%s: skipped: a log of another run (run %016llx; %s, the newest log, is "
                    "of run %016llx)",
                    l->path, (unsigned long long)l->run, path, (unsigned long long)run);
            trace_log_unload(l);
            free(l->path);
            continue;
        }
        if (l->world == world) {
            if (l->opened_ns && wall - l->opened_ns > TRACE_RUN_SPREAD_NS)
                ms_warn("%s: opened %.0f s before %s, the newest log: one an earlier run left "
                        "(its rank did not start this time)?",
                        l->path, (double)(wall - l->opened_ns) / 1e9, path);
            s->logs[n++] = *l;
            continue;
        }
        ms_warn("%s: skipped: a log of another run (world %d; %s, the newest log, says %d)",
                l->path, l->world, path, world);
        trace_log_unload(l);
        free(l->path);
    }
    s->n_logs = n;
    if (n == world) return;
    char list[200] = "";
    size_t o = 0;
    for (int r = 0, i = 0, k = 0; r < world; r++) { /* logs are sorted by rank */
        if (i < n && s->logs[i].rank == r) {
            i++;
            continue;
        }
        if (o + 16 < sizeof list)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%d", k ? ", " : "", r);
        else if (o + 5 < sizeof list && !strstr(list, "..."))
            o += (size_t)snprintf(list + o, sizeof list - o, ", ...");
        k++;
    }
    ms_warn("%s: no event log for %d of the %d ranks: %s", s->dir, world - n, world, list);
}

static int cmp_int_key(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* A rank without its log but with events_rNNNNN.jsonl.new (killed between the two renames
 * of a rotation, or the second failed: the log went on there), else with only its older half
 * events_rNNNNN.jsonl.1: that file stands in, with a warning (before, the rank's events were
 * left out, and the warning said only that it had no log).  ranks/paths (sorted by rank,
 * n of them) grow; 0 or MS_ERR_NOMEM. */
static ms_status add_stand_ins(const char *dir, int warn, int **ranks, char ***paths, int *n) {
    static const char *const tails[2] = {".jsonl.new", ".jsonl.1"};
    for (int t = 0; t < 2; t++) {
        int *rk = NULL, m = 0;
        char **ps = NULL;
        if (trace_rank_files(dir, "events_r", tails[t], &rk, &ps, &m) != MS_OK) continue;
        for (int i = 0; i < m; i++) {
            if (*n && bsearch(&rk[i], *ranks, (size_t)*n, sizeof **ranks, cmp_int_key))
                continue; /* its log is there */
            int *nr = realloc(*ranks, ((size_t)*n + 1) * sizeof *nr);
            if (nr) *ranks = nr;
            char **np = nr ? realloc(*paths, ((size_t)*n + 1) * sizeof *np) : NULL;
            if (!np) {
                trace_rank_files_free(rk, ps, m);
                return ms_error(MS_ERR_NOMEM, "%s: out of memory", dir);
            }
            *paths = np;
            int at = *n;
            while (at > 0 && (*ranks)[at - 1] > rk[i]) { /* sorted by rank */
                (*ranks)[at] = (*ranks)[at - 1], (*paths)[at] = (*paths)[at - 1];
                at--;
            }
            (*ranks)[at] = rk[i], (*paths)[at] = ps[i];
            ps[i] = NULL;
            (*n)++;
            if (warn)
                ms_warn("%s: the rank's log %.*s is missing: read in its place (%s)", (*paths)[at],
                        (int)(strlen((*paths)[at]) - strlen(tails[t]) + 6), (*paths)[at],
                        t == 0 ? "the rank ended while it rotated its log"
                               : "its older half only: the rest is lost");
        }
        trace_rank_files_free(rk, ps, m);
    }
    return MS_OK;
}

ms_status trace_log_files(const char *dir, int warn, int **ranks, char ***paths, int *n) {
    MS_TRY(trace_rank_files(dir, "events_r", ".jsonl", ranks, paths, n));
    ms_status st = add_stand_ins(dir, warn, ranks, paths, n);
    if (st != MS_OK) {
        trace_rank_files_free(*ranks, *paths, *n);
        *ranks = NULL, *paths = NULL, *n = 0;
    }
    return st;
}

int trace_log_path(const char *dir, int rank, char *buf, size_t size) {
    static const char *const tails[3] = {".jsonl", ".jsonl.new", ".jsonl.1"};
    for (int t = 0; t < 3; t++) {
        int w = snprintf(buf, size, "%s/events_r%05d%s", dir, rank, tails[t]);
        if (w > 0 && (size_t)w < size && access(buf, F_OK) == 0) return 1;
    }
    return 0;
}

ms_status trace_set_load(const char *dir, unsigned flags, trace_set **out) {
    *out = NULL;
    int *ranks = NULL, n = 0;
    char **paths = NULL;
    MS_TRY(trace_log_files(dir, 1, &ranks, &paths, &n));
    trace_set *s = calloc(1, sizeof *s);
    ms_status st = s && (s->dir = strdup(dir)) ? MS_OK : ms_error(MS_ERR_NOMEM, "out of memory");
    if (st == MS_OK && n == 0)
        st =
            ms_error(MS_ERR_NOTFOUND, "%s: no event logs (events_r*.jsonl) in this directory", dir);
    if (st == MS_OK && !(s->logs = calloc((size_t)n, sizeof *s->logs)))
        st = ms_error(MS_ERR_NOMEM, "out of memory");
    for (int i = 0; st == MS_OK && i < n; i++) {
        trace_log *l = &s->logs[s->n_logs++];
        int no_header = 0;
        l->path = paths[i];
        paths[i] = NULL;
        st = load_rank_log(s, l, l->path, flags, !!(flags & TRACE_LOAD_HEADERS), &no_header);
        if (st == MS_OK && no_header) {
            ms_warn("%s: skipped: no header line (%s)", l->path,
                    no_header == TRACE_NO_HEADER_NUL
                        ? "NUL bytes: a damaged event log, as a crash or power loss leaves it"
                        : "the rank ended before its log's first write");
            free(l->path);
            memset(l, 0, sizeof *l);
            s->n_logs--;
            continue;
        }
        if (st == MS_OK && l->rank != ranks[i])
            st = ms_error(MS_ERR_FORMAT, "%s: the header says rank %d, the file name rank %d",
                          l->path, l->rank, ranks[i]);
        if (st == MS_OK && l->dropped)
            ms_warn("%s: the rank dropped %lld events (its buffer was full)", l->path,
                    (long long)l->dropped);
    }
    if (st == MS_OK && s->n_logs == 0)
        st = ms_error(MS_ERR_NOTFOUND,
                      "%s: no event log has a header line (all are empty or damaged)", dir);
    if (st == MS_OK) keep_one_run(s);
    if (st == MS_OK && !(flags & TRACE_LOAD_HEADERS)) trace_set_align(s);
    trace_rank_files_free(ranks, paths, n);
    if (st != MS_OK) {
        trace_set_free(s);
        return st;
    }
    *out = s;
    return MS_OK;
}

ms_status trace_log_load(trace_set *s, int li, unsigned flags) {
    trace_log *l = &s->logs[li], t;
    int no_header = 0;
    memset(&t, 0, sizeof t);
    trace_log_unload(l);
    ms_status st = load_rank_log(s, &t, l->path, flags & ~TRACE_LOAD_HEADERS, 0, &no_header);
    /* the log l's header came from may have rotated to .1 since */
    if (st == MS_OK && (no_header || t.rank != l->rank || t.world != l->world ||
                        (t.wall_ns != l->wall_ns && !(t.wall0_ns && t.wall0_ns == l->wall_ns))))
        st =
            ms_error(MS_ERR_FORMAT, "%s: replaced while it was read (a new run started?)", l->path);
    if (st == MS_OK && t.dropped && !(flags & TRACE_LOAD_QUIET))
        ms_warn("%s: the rank dropped %lld events (its buffer was full)", l->path,
                (long long)t.dropped);
    l->spans = t.spans, l->n_spans = t.n_spans, l->cap_spans = t.cap_spans;
    l->clocks = t.clocks, l->n_clocks = t.n_clocks, l->cap_clocks = t.cap_clocks;
    l->dropped = t.dropped;
    if (st != MS_OK) trace_log_unload(l);
    return st;
}

void trace_log_unload_spans(trace_log *l) {
    for (int k = 0; k < l->n_spans; k++)
        free(l->spans[k].args);
    free(l->spans);
    l->spans = NULL, l->n_spans = l->cap_spans = 0;
}

void trace_log_unload(trace_log *l) {
    trace_log_unload_spans(l);
    free(l->clocks);
    l->clocks = NULL, l->n_clocks = l->cap_clocks = 0;
    l->dropped = 0;
}

void trace_set_free(trace_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_logs; i++) {
        trace_log_unload(&s->logs[i]);
        free(s->logs[i].path);
    }
    for (int i = 0; i < s->n_strs; i++)
        free(s->strs[i]);
    free(s->strs);
    free(s->str_tab);
    free(s->logs);
    free(s->dir);
    free(s);
}
