/* test_trace.c - the pure parts of src/trace: thread layout (nesting clamp,
 * interval partitioning), clock offsets, grid coordinates, JSON quoting.
 * The commands end to end: tests/trace/test_trace_tools.py. */
#include <stdlib.h>

#include "base/jsonstr.h"
#include "check.h"
#include "trace/trace_internal.h"

static trace_span sp(int64_t t0, int64_t t1) {
    return (trace_span){.t0 = t0, .t1 = t1, .group = -1};
}

/* No two spans on one sub-thread overlap, and the count is the maximum
 * depth of overlap (optimal). */
static void test_partition(void) {
    trace_span s[] = {sp(0, 10), sp(2, 6), sp(4, 12), sp(10, 14), sp(12, 13), sp(20, 21), sp(5, 5)};
    s[6].flags = TRACE_IS_MARK;
    int n = (int)(sizeof s / sizeof s[0]), idx[16], track[16];
    for (int i = 0; i < n; i++)
        idx[i] = i;
    int nt = trace_partition(s, idx, n, track);
    T_EQ_INT(nt, 3); /* 0-10, 2-6 and 4-12 overlap; the instant at 5 needs no thread */
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            const trace_span *x = &s[idx[a]], *y = &s[idx[b]];
            if (a == b || track[a] != track[b] || (x->flags | y->flags) & TRACE_IS_MARK) continue;
            T_OK(x->t1 <= y->t0 || y->t1 <= x->t0);
        }
    for (int i = 1; i < n; i++) /* sorted by start */
        T_OK(s[idx[i - 1]].t0 <= s[idx[i]].t0);
}

/* A partial overlap is cut to end with its parent; proper nesting is kept. */
static void test_nest(void) {
    trace_span s[] = {sp(0, 100), sp(10, 20), sp(15, 18), sp(90, 120), sp(200, 300), sp(200, 250)};
    int n = 6, idx[6];
    for (int i = 0; i < n; i++)
        idx[i] = i;
    T_EQ_INT(trace_nest(s, idx, n), 1);
    T_EQ_INT(s[3].t1, 100);
    T_EQ_INT(s[2].t1, 18);
    T_EQ_INT(idx[0], 0);
    T_EQ_INT(idx[4], 4); /* the longer of two with the same start comes first */
    T_EQ_INT(idx[5], 5);
}

static void test_offsets(void) {
    trace_clock c[] = {{100, 5, 1}, {200, 7, 1}, {300, -3, 2}};
    trace_log l = {.clocks = c, .n_clocks = 3, .base_offset = 99};
    T_EQ_INT(trace_log_offset(&l, 50), 5); /* before the first line: the first */
    T_EQ_INT(trace_log_offset(&l, 100), 5);
    T_EQ_INT(trace_log_offset(&l, 199), 5);
    T_EQ_INT(trace_log_offset(&l, 200), 7);
    T_EQ_INT(trace_log_offset(&l, 1000), -3);
    l.n_clocks = 0;
    T_EQ_INT(trace_log_offset(&l, 1000), 99);
}

static void test_coords(void) {
    trace_coord shape = {2, 2, 2}; /* dp, pp, tp */
    trace_coord c = trace_coord_of(5, shape);
    T_EQ_INT(c.tp, 1);
    T_EQ_INT(c.dp, 0);
    T_EQ_INT(c.pp, 1);
    c = trace_coord_of(6, shape);
    T_EQ_INT(c.tp, 0);
    T_EQ_INT(c.dp, 1);
    T_EQ_INT(c.pp, 1);
    T_OK(trace_coord_cmp((trace_coord){1, 0, 1}, (trace_coord){0, 1, 0}) < 0);
    T_OK(trace_coord_cmp((trace_coord){0, 1, 1}, (trace_coord){1, 1, 0}) < 0);
    char buf[64];
    T_STR_CONTAINS(ms_json_quote(buf, sizeof buf, "a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    /* a NUL in JSON text, raw or escaped; an escaped backslash before u0000 is text */
#define HAS_NUL(s) ms_json_has_nul(s, sizeof(s) - 1)
    T_EQ_INT(HAS_NUL("{\"t\":\"ab\\u0000c\"}"), 1);
    T_EQ_INT(HAS_NUL("{\"t\":\"ab\0c\"}"), 1);
    T_EQ_INT(HAS_NUL("{\"t\":\"ab\\\\u0000c\"}"), 0);
    T_EQ_INT(HAS_NUL("{\"t\":\"ab\\\\\\u0000c\"}"), 1);
    T_EQ_INT(HAS_NUL("{\"t\":\"ab\\u0001\\u000\"}"), 0);
    T_EQ_INT(HAS_NUL("\"\\u000"), 0); /* cut short */
    T_EQ_INT(HAS_NUL("\\u0000"), 1);
#undef HAS_NUL
}

int main(void) {
    test_partition();
    test_nest();
    test_offsets();
    test_coords();
    return ms_test_summary("test_trace");
}
