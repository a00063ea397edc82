/* test_events.c - the event recorder (base/events.h) and the event log
 * (monitor/evlog.h): spans nest and keep their order under concurrent
 * threads while a consumer drains, a full ring drops and counts, interned
 * names are stable, and the log file has a header and one line per event.
 * Label threads: it also runs under ThreadSanitizer. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/events.h"
#include "base/fileio.h"
#include "check.h"
#include "monitor/evlog.h"
#include "tmpdir.h"

#define THREADS 4
#define SPANS 4000 /* per thread: 2 x SPANS events fit in one ring, so nothing may drop */

typedef struct {
    int id;
    uint16_t outer, inner, lane;
} worker_arg;

/* Each thread records SPANS outer spans, each with an inner span nested in
 * it; mb = the thread's id, chunk = the span's index. */
static void *worker(void *p) {
    worker_arg *a = p;
    ms_ev_thread_init(a->lane);
    for (int i = 0; i < SPANS; i++) {
        int64_t t0 = ms_ev_now();
        int64_t t1 = ms_ev_now();
        int64_t t2 = ms_ev_now();
        ms_ev_args x = {
            .has = MS_EV_MB | MS_EV_CHUNK | MS_EV_STEP, .mb = a->id, .chunk = i, .step = 7};
        ms_ev_span(a->inner, 0, t1, t2, &x);
        ms_ev_span(a->outer, 0, t0, ms_ev_now(), &x);
    }
    return NULL;
}

typedef struct {
    long n[THREADS];
    int next[THREADS];  /* next expected chunk index per thread */
    int phase[THREADS]; /* 0: inner expected, 1: outer expected */
    int64_t inner_t0[THREADS], inner_t1[THREADS];
    int bad_order, bad_nest, bad_args, bad_lane;
    uint16_t outer, inner, lanes[THREADS];
} drain_state;

static void check_event(void *ctx, const ms_event *e) {
    drain_state *d = ctx;
    int t = e->a.mb;
    if (t < 0 || t >= THREADS || !(e->a.has & MS_EV_MB)) {
        d->bad_args++;
        return;
    }
    d->n[t]++;
    if (e->lane != d->lanes[t]) d->bad_lane++;
    if (e->a.step != 7 || !(e->a.has & MS_EV_CHUNK)) d->bad_args++;
    if (e->a.chunk != d->next[t]) d->bad_order++;
    if (d->phase[t] == 0) {
        if (e->name != d->inner) d->bad_order++;
        d->inner_t0[t] = e->t0, d->inner_t1[t] = e->t1;
        d->phase[t] = 1;
    } else {
        if (e->name != d->outer) d->bad_order++;
        if (!(e->t0 <= d->inner_t0[t] && d->inner_t1[t] <= e->t1)) d->bad_nest++;
        d->phase[t] = 0;
        d->next[t]++;
    }
}

typedef struct {
    drain_state *d;
    _Atomic int *stop;
    uint64_t dropped;
} drainer_arg;

static void *drainer(void *p) {
    drainer_arg *a = p;
    while (!atomic_load(a->stop))
        ms_ev_drain(check_event, a->d, &a->dropped);
    ms_ev_drain(check_event, a->d, &a->dropped);
    return NULL;
}

static void test_concurrent(void) {
    drain_state d;
    memset(&d, 0, sizeof d);
    d.outer = ms_ev_intern("outer");
    d.inner = ms_ev_intern("inner");
    T_OK(d.outer && d.inner && d.outer != d.inner);
    T_EQ_INT(ms_ev_intern("outer"), d.outer); /* stable ids */
    T_OK(!strcmp(ms_ev_name(d.inner), "inner"));
    worker_arg wa[THREADS];
    char lane[16];
    for (int i = 0; i < THREADS; i++) {
        snprintf(lane, sizeof lane, "lane%d", i);
        wa[i] = (worker_arg){i, d.outer, d.inner, ms_ev_intern(lane)};
        d.lanes[i] = wa[i].lane;
    }
    ms_ev_reset();
    ms_ev_enable(1);
    _Atomic int stop = 0;
    drainer_arg da = {&d, &stop, 0};
    pthread_t w[THREADS], dr;
    pthread_create(&dr, NULL, drainer, &da);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&w[i], NULL, worker, &wa[i]);
    for (int i = 0; i < THREADS; i++)
        pthread_join(w[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(dr, NULL);
    ms_ev_enable(0);
    long total = 0;
    for (int i = 0; i < THREADS; i++)
        total += d.n[i];
    T_EQ_INT(total, (long)THREADS * SPANS * 2);
    T_EQ_INT(da.dropped, 0);
    T_EQ_INT(d.bad_args, 0);
    T_EQ_INT(d.bad_lane, 0);
    T_EQ_INT(d.bad_order, 0);
    T_EQ_INT(d.bad_nest, 0);
    fprintf(stderr, "concurrent: %ld events drained, %llu dropped\n", total,
            (unsigned long long)da.dropped);
}

static void count_event(void *ctx, const ms_event *e) {
    (*(long *)ctx)++;
    (void)e;
}

static void test_full_ring_drops(void) {
    uint16_t n = ms_ev_intern("x");
    ms_ev_reset();
    ms_ev_enable(1);
    for (int i = 0; i < MS_EV_RING + 100; i++)
        ms_ev_span(n, 0, i, i + 1, NULL);
    ms_ev_enable(0);
    ms_ev_span(n, 0, 0, 1, NULL); /* off: not recorded */
    long got = 0;
    uint64_t dropped = 0;
    ms_ev_drain(count_event, &got, &dropped);
    T_EQ_INT(got, MS_EV_RING);
    T_EQ_INT(dropped, 100);
}

static int count_lines(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    if (f) fclose(f);
    return n;
}

static void test_evlog(void) {
    mon_identity id = {
        .rank = 3, .world = 8, .has_grid = 1, .dp = 1, .pp = 0, .tp = 1, .DP = 2, .PP = 2, .TP = 2};
    mon_evlog *l = NULL;
    T_OK(mon_evlog_open(&l, tpath("trace"), &id, 0.01, 0) == MS_OK);
    T_OK(ms_ev_on());
    uint16_t n = ms_ev_intern("fwd"), lane = ms_ev_intern("compute");
    for (int i = 0; i < 5000; i++) { /* several flushes while recording */
        ms_ev_args a = {.has = MS_EV_STEP | MS_EV_MB, .step = 1 + i / 100, .mb = i % 4};
        ms_ev_span(n, lane, 1000 * i, 1000 * i + 500, &a);
    }
    /* a name that is data (a group's, a kernel shape's) is escaped: the
     * line stays one JSON line the trace tools can read */
    uint16_t odd = ms_ev_intern("g\"1\\x\n"), odd_lane = ms_ev_intern("comm:\"q\"");
    ms_ev_args ga = {.has = MS_EV_GROUP | MS_EV_OP, .group = odd, .op = odd};
    ms_ev_span(odd, odd_lane, 1, 2, &ga);
    ms_ev_clock(42, -7, 3);
    const char *path = mon_evlog_path(l);
    char copy[600];
    snprintf(copy, sizeof copy, "%s", path);
    mon_evlog_close(l);
    T_OK(!ms_ev_on());
    T_EQ_INT(count_lines(copy, "\"type\":\"header\""), 1);
    T_EQ_INT(count_lines(copy, "\"coord\":{\"dp\":1,\"pp\":0,\"tp\":1}"), 1);
    T_EQ_INT(count_lines(copy, "\"name\":\"fwd\",\"lane\":\"compute\""), 5000);
    T_EQ_INT(count_lines(copy, "\"offset_ns\":-7,\"err_ns\":3"), 1);
    T_EQ_INT(count_lines(copy, "{\"type\":\"span\",\"name\":\"g\\\"1\\\\x\\u000a\","
                               "\"lane\":\"comm:\\\"q\\\"\",\"t0\":1,\"t1\":2,"
                               "\"group\":\"g\\\"1\\\\x\\u000a\",\"op\":\"g\\\"1\\\\x\\u000a\"}"),
             1);
    T_EQ_INT(count_lines(copy, "\"step\":50,\"mb\":3"), 25);
    T_OK(strstr(copy, "events_r00003.jsonl") != NULL);
    struct stat sb;
    T_OK(stat(tpath("trace/prev"), &sb) != 0); /* a first run: nothing to keep, no prev/ */
    /* the header is on disk at once, before the first flush (a rank killed
     * early still names itself) */
    T_OK(mon_evlog_open(&l, tpath("trace2"), &id, 30, 0) == MS_OK);
    snprintf(copy, sizeof copy, "%s", mon_evlog_path(l));
    T_EQ_INT(count_lines(copy, "\"type\":\"header\""), 1);
    mon_evlog_close(l);
    /* a directory that cannot be made is an error naming it */
    T_OK(mon_evlog_open(&l, "/proc/no/such/dir", &id, 0, 0) != MS_OK);
    T_STR_CONTAINS(ms_errmsg(), "/proc/no");
    /* a directory name that leaves no room for the log's: refused before
     * anything is made (its name was cut, and another file opened) */
    char *deep = malloc(4200);
    memset(deep, 'd', 4095);
    deep[0] = '/', deep[4095] = 0;
    T_EQ_INT(mon_evlog_open(&l, deep, &id, 0, 0), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "path too long for its event log");
    free(deep);
}

static void put_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    T_OK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* The first line of path, "" if there is none. */
static const char *first_line(const char *path) {
    static char line[512];
    FILE *f = fopen(path, "r");
    line[0] = 0;
    if (f && !fgets(line, sizeof line, f)) line[0] = 0;
    if (f) fclose(f);
    return line;
}

static int exists(const char *path) {
    FILE *f = fopen(path, "r");
    if (f) fclose(f);
    return f != NULL;
}

/* A restart keeps the attempt before in DIR/prev/: each rank moves its own
 * log and hang dump there; rank 0 also those of ranks the new world does
 * not have, and the supervisor's hang_driver.json; files of an older
 * attempt do not stay mixed in. */
static void test_evlog_prev(void) {
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s", tpath("restart"));
    mon_identity id0 = {.rank = 0, .world = 2}, id1 = {.rank = 1, .world = 2};
    mon_evlog *l = NULL;
    /* attempt A: 4 ranks, rank 1 and rank 2 wrote hang dumps */
    T_OK(ms_mkdirs(dir) == MS_OK);
    for (int r = 0; r < 4; r++) {
        char text[32];
        snprintf(p, sizeof p, "%s/events_r%05d.jsonl", dir, r);
        snprintf(text, sizeof text, "A%d\n", r);
        put_file(p, text);
    }
    snprintf(p, sizeof p, "%s/events_r00000.jsonl.1", dir); /* rotated (--trace-max-mb) */
    put_file(p, "A0.1\n");
    snprintf(p, sizeof p, "%s/hang_r00001.json", dir);
    put_file(p, "HA1\n");
    snprintf(p, sizeof p, "%s/hang_r00002.json", dir);
    put_file(p, "HA2\n");
    snprintf(p, sizeof p, "%s/hang_driver.json", dir); /* the supervisor's, with the dumps */
    put_file(p, "DA\n");
    /* attempt B: 2 ranks; A is kept whole in prev/ */
    T_OK(mon_evlog_open(&l, dir, &id1, 30, 0) == MS_OK);
    mon_evlog_close(l);
    T_OK(exists(p)); /* rank 0 moves it, not every rank */
    T_OK(mon_evlog_open(&l, dir, &id0, 30, 0) == MS_OK);
    mon_evlog_close(l);
    T_OK(!exists(p));
    const char *want_a[][2] = {{"events_r00000.jsonl", "A0\n"}, {"events_r00001.jsonl", "A1\n"},
                               {"events_r00002.jsonl", "A2\n"}, {"events_r00003.jsonl", "A3\n"},
                               {"hang_r00001.json", "HA1\n"},   {"events_r00000.jsonl.1", "A0.1\n"},
                               {"hang_r00002.json", "HA2\n"},   {"hang_driver.json", "DA\n"}};
    for (size_t i = 0; i < sizeof want_a / sizeof want_a[0]; i++) {
        snprintf(p, sizeof p, "%s/prev/%s", dir, want_a[i][0]);
        T_STR_CONTAINS(first_line(p), want_a[i][1]);
    }
    for (int r = 0; r < 4; r++) { /* DIR: B's two logs, nothing of A */
        snprintf(p, sizeof p, "%s/events_r%05d.jsonl", dir, r);
        T_EQ_INT(exists(p), r < 2);
        if (r < 2) T_STR_CONTAINS(first_line(p), "\"type\":\"header\"");
    }
    snprintf(p, sizeof p, "%s/hang_r00002.json", dir);
    T_OK(!exists(p));
    snprintf(p, sizeof p, "%s/hang_r00000.json", dir); /* B: rank 0 wrote a dump */
    put_file(p, "HB0\n");
    /* attempt C: prev/ is B alone (A's ranks 2, 3, A's dump of rank 1 and A's
     * hang_driver.json go) */
    T_OK(mon_evlog_open(&l, dir, &id0, 30, 0) == MS_OK);
    mon_evlog_close(l);
    T_OK(mon_evlog_open(&l, dir, &id1, 30, 0) == MS_OK);
    mon_evlog_close(l);
    const char *gone[] = {"events_r00002.jsonl", "events_r00003.jsonl",   "hang_r00001.json",
                          "hang_r00002.json",    "events_r00000.jsonl.1", "hang_driver.json"};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) {
        snprintf(p, sizeof p, "%s/prev/%s", dir, gone[i]);
        T_OK(!exists(p));
    }
    for (int r = 0; r < 2; r++) {
        snprintf(p, sizeof p, "%s/prev/events_r%05d.jsonl", dir, r);
        T_STR_CONTAINS(first_line(p), "\"type\":\"header\"");
    }
    snprintf(p, sizeof p, "%s/prev/hang_r00000.json", dir);
    T_STR_CONTAINS(first_line(p), "HB0");
    snprintf(p, sizeof p, "%s/hang_r00000.json", dir);
    T_OK(!exists(p));
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* --trace-max-mb: past half the bound the log becomes .1 and a new file
 * starts with the header and the latest clock sample; the two stay within
 * the bound (plus a line each). */
static void test_evlog_rotate(void) {
    const long max = 32 * 1024;
    char log[600], older[600];
    mon_identity id = {.rank = 2, .world = 4};
    mon_evlog *l = NULL;
    T_OK(mon_evlog_open(&l, tpath("rotate"), &id, 0.005, max) == MS_OK);
    snprintf(log, sizeof log, "%s", mon_evlog_path(l));
    snprintf(older, sizeof older, "%s.1", log);
    /* every rotated header says when the log was opened: its first header's wall_ns */
    char opened[64] = "";
    const char *w = strstr(first_line(log), "\"wall_ns\":");
    T_OK(w != NULL);
    if (w) snprintf(opened, sizeof opened, "\"opened_wall_ns\":%lld}", atoll(w + 10));
    uint16_t n = ms_ev_intern("fwd"), lane = ms_ev_intern("compute");
    ms_ev_clock(ms_ev_now(), -4242, 17);
    long worst = 0;
    for (int round = 0; round < 40; round++) {
        long before = file_size(log) + file_size(older);
        for (int i = 0; i < 40; i++) { /* about 4 kB a round */
            ms_ev_args a = {.has = MS_EV_STEP | MS_EV_MB, .step = round, .mb = i};
            ms_ev_span(n, lane, 1000 * i, 1000 * i + 500, &a);
        }
        /* one round a flush, or nearly: wait until the flusher wrote it */
        for (int k = 0; k < 400 && file_size(log) + file_size(older) == before; k++)
            usleep(5000);
        long now = file_size(log) + (file_size(older) > 0 ? file_size(older) : 0);
        if (now > worst) worst = now;
    }
    mon_evlog_close(l);
    T_OK(file_size(older) > 0);
    T_OK(worst > max / 2 && worst <= max + 1024); /* the bound, plus a line in each file */
    T_STR_CONTAINS(first_line(log), "\"type\":\"header\",\"version\":1,\"rank\":2");
    T_STR_CONTAINS(first_line(older), "\"type\":\"header\",\"version\":1,\"rank\":2");
    T_STR_CONTAINS(first_line(log), opened); /* rotated more than twice: both files */
    T_STR_CONTAINS(first_line(older), opened);
    T_EQ_INT(count_lines(log, "\"offset_ns\":-4242,\"err_ns\":17"), 1); /* it stands alone */
    T_EQ_INT(count_lines(log, "\"type\":\"header\""), 1);
    /* a rotation's new file left by a rank killed in the middle of it: the
     * next start removes it */
    char fresh[620];
    snprintf(fresh, sizeof fresh, "%s.new", log);
    FILE *f = fopen(fresh, "w");
    T_OK(f != NULL);
    if (f) fclose(f);
    T_OK(mon_evlog_open(&l, tpath("rotate"), &id, 0.005, max) == MS_OK);
    mon_evlog_close(l);
    T_OK(access(fresh, F_OK) != 0);
}

/* A world of 100,000 ranks or more: file names of 6 digits (%05d) are a rank's too; rank 0
 * of a smaller run moves them into prev/ with the rest of that attempt. */
static void test_evlog_prev_wide(void) {
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s", tpath("wide"));
    T_OK(ms_mkdirs(dir) == MS_OK);
    const char *old[] = {"events_r00000.jsonl", "events_r100000.jsonl", "events_r123456.jsonl.1",
                         "hang_r100001.json"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, old[i]);
        put_file(p, "A\n");
    }
    snprintf(p, sizeof p, "%s/events_r1234.jsonl", dir); /* not a rank's (4 digits): stays */
    put_file(p, "X\n");
    mon_identity id0 = {.rank = 0, .world = 2};
    mon_evlog *l = NULL;
    T_OK(mon_evlog_open(&l, dir, &id0, 30, 0) == MS_OK);
    mon_evlog_close(l);
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        snprintf(p, sizeof p, "%s/prev/%s", dir, old[i]);
        T_STR_CONTAINS(first_line(p), "A");
        if (i == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, old[i]);
        T_OK(!exists(p));
    }
    snprintf(p, sizeof p, "%s/events_r1234.jsonl", dir);
    T_OK(exists(p));
}

/* A rotation cut short after its first rename (the log renamed to .1, the
 * new one still .new: a rank killed there, or a rename that failed and left
 * the log going on in .new): the next attempt keeps .new as the log of the
 * attempt before, in prev/ (it was removed). */
static void test_evlog_rotation_left(void) {
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s", tpath("rotleft"));
    T_OK(ms_mkdirs(dir) == MS_OK);
    snprintf(p, sizeof p, "%s/events_r00000.jsonl.1", dir);
    put_file(p, "OLDER\n");
    snprintf(p, sizeof p, "%s/events_r00000.jsonl.new", dir);
    put_file(p, "NEWEST\n");
    mon_identity id = {.rank = 0, .world = 1};
    mon_evlog *l = NULL;
    T_OK(mon_evlog_open(&l, dir, &id, 30, 0) == MS_OK);
    mon_evlog_close(l);
    snprintf(p, sizeof p, "%s/prev/events_r00000.jsonl", dir);
    T_STR_CONTAINS(first_line(p), "NEWEST");
    snprintf(p, sizeof p, "%s/prev/events_r00000.jsonl.1", dir);
    T_STR_CONTAINS(first_line(p), "OLDER");
    snprintf(p, sizeof p, "%s/events_r00000.jsonl.new", dir);
    T_OK(!exists(p));
}

/* A full disk under the log (RLIMIT_FSIZE: writes past a size fail, the
 * first in the middle of a line), then space again: every line of the log
 * is whole JSON, and the events lost are counted in "dropped" lines, so
 * that the spans written and the counts add up to the spans recorded.
 * Before, the part of a line the disk took stayed, and the next line was
 * glued to it: `trace merge` refused the log. */
static void test_evlog_disk_full(void) {
    mon_identity id = {.rank = 0, .world = 1};
    mon_evlog *l = NULL;
    T_OK(mon_evlog_open(&l, tpath("full"), &id, 0.005, 0) == MS_OK);
    char path[600];
    snprintf(path, sizeof path, "%s", mon_evlog_path(l));
    struct stat sb;
    T_OK(stat(path, &sb) == 0);
    struct rlimit old, lim;
    T_OK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = (rlim_t)sb.st_size + 3001; /* a line is ~80 bytes: one is cut */
    T_OK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    uint16_t n = ms_ev_intern("full"), lane = ms_ev_intern("compute");
    enum { FULL = 2000, AFTER = 100 };
    for (int i = 0; i < FULL; i++) {
        ms_ev_span(n, lane, 1000 * i, 1000 * i + 500, NULL);
        if (i % 100 == 99) usleep(20000); /* flushes meanwhile, some failing */
    }
    usleep(50000);
    T_OK(setrlimit(RLIMIT_FSIZE, &old) == 0); /* space again */
    for (int i = 0; i < AFTER; i++)
        ms_ev_span(n, lane, 1000 * (FULL + i), 1000 * (FULL + i) + 500, NULL);
    mon_evlog_close(l);
    signal(SIGXFSZ, was);
    FILE *f = fopen(path, "r");
    T_OK(f != NULL);
    char line[4096];
    int bad = 0, spans = 0, headers = 0;
    long long dropped = 0;
    while (f && fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *type = cJSON_GetObjectItem(o, "type"), *cnt = cJSON_GetObjectItem(o, "count");
        if (!cJSON_IsString(type)) {
            if (bad++ < 3) fprintf(stderr, "not a JSON line: %s", line);
        } else if (!strcmp(type->valuestring, "span")) {
            spans++;
        } else if (!strcmp(type->valuestring, "header")) {
            headers++;
        } else if (!strcmp(type->valuestring, "dropped") && cJSON_IsNumber(cnt)) {
            dropped += (long long)cnt->valuedouble;
        }
        cJSON_Delete(o);
    }
    if (f) fclose(f);
    T_EQ_INT(bad, 0);
    T_EQ_INT(headers, 1);
    T_OK(dropped > 0);
    T_EQ_INT(spans + dropped, FULL + AFTER);
}

int main(void) {
    if (!ms_tmpdir_make("events")) return 1;
    test_concurrent();
    test_full_ring_drops();
    test_evlog();
    test_evlog_prev();
    test_evlog_rotate();
    test_evlog_prev_wide();
    test_evlog_rotation_left();
    test_evlog_disk_full();
    ms_tmpdir_remove();
    return ms_test_summary("test_events");
}
