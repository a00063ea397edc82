/* test_sup_parts.c - the supervisor's parts that need no job: the control
 * message parser (valid lines, each rejection, every truncation, 20000
 * random mutations that never crash it: run under ASan/UBSan by `make
 * asan`), the `--ctl` client reading a big status reply, the loss-spike and straggler detectors,
 * the node pool (one host, a hostfile, bad hostfiles) and the blocklist (kept across a reload,
 * malformed files refused, nothing overwritten); the self-test's comparison of the nodes'
 * speeds; the driver's handling of beats: the ETTR's mean step time whatever order the ranks'
 * beats arrive in, over a restart and a take-over (driver.json), and a communication error on a
 * survivor after a rank is gone booked as that rank's crash. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/node.h"
#include "base/timeutil.h"
#include "check.h"
#include "supervisor/sup_internal.h"

#define TOK "0123456789abcdef0123456789abcdef"
#define EVICT "{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"evict\",\"node\":\"node1\"}"

static int ctl(const char *s) {
    sup_ctl_msg m;
    const char *why = "";
    return sup_ctl_parse(s, strlen(s), TOK, &m, &why);
}

static void test_ctl(void) {
    sup_ctl_msg m;
    const char *why = "";
    T_EQ_INT(sup_ctl_parse(EVICT, strlen(EVICT), TOK, &m, &why), 0);
    T_OK(!strcmp(m.cmd, "evict") && !strcmp(m.node, "node1"));
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"status\"}"), 0);
    T_EQ_INT(sup_ctl_parse("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"dump\"}",
                           strlen("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"dump\"}"), TOK, &m,
                           &why),
             0);
    T_OK(!strcmp(m.cmd, "dump"));
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"dump\",\"node\":\"n\"}"), -1);
    /* each rejection */
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"0123456789abcdef0123456789abcdee\",\"cmd\":\"status\"}"),
             -1);
    T_EQ_INT(ctl("{\"v\":2,\"token\":\"" TOK "\",\"cmd\":\"status\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"reboot\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"evict\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"evict\",\"node\":\"../etc\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"evict\",\"node\":\"a b\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"status\",\"node\":\"n\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"status\",\"x\":1}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"status\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"status\"} x"), -1);
    T_EQ_INT(ctl("[1]"), -1);
    T_EQ_INT(ctl(""), -1);
    char big[SUP_CTL_LINE_MAX + 64];
    memset(big, ' ', sizeof big);
    memcpy(big, EVICT, strlen(EVICT));
    big[sizeof big - 1] = 0;
    T_EQ_INT(ctl(big), -1); /* oversized, even with a valid object first */
    const char nul[] = "{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"status\"}\0";
    T_EQ_INT(sup_ctl_parse(nul, sizeof nul - 1, TOK, &m, &why), -1);
    /* an escaped NUL ends cJSON's string: the token with junk after it was answered, and
     * "stat\u0000us" read as stat */
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\\u0000junk\",\"cmd\":\"status\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"status\\u0000x\"}"), -1);
    T_EQ_INT(ctl("{\"v\":1,\"token\":\"" TOK "\",\"cmd\":\"evict\",\"node\":\"node1\\u0000x\"}"),
             -1);
    /* every truncation */
    for (size_t n = 0; n < strlen(EVICT); n++)
        T_EQ_INT(sup_ctl_parse(EVICT, n, TOK, &m, &why), -1);
    /* random mutations never crash it, and what parses is well-formed */
    char buf[sizeof EVICT];
    int parsed = 0;
    for (uint64_t i = 0; i < 20000; i++) {
        memcpy(buf, EVICT, sizeof EVICT);
        int flips = 1 + (int)(ms_rng_u64(7, i, 0) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = ms_rng_u64(7, i, 1 + 2 * (uint64_t)k) % (sizeof EVICT - 1);
            buf[at] = (char)(ms_rng_u64(7, i, 2 + 2 * (uint64_t)k) & 0xff);
        }
        if (sup_ctl_parse(buf, sizeof EVICT - 1, TOK, &m, &why) == 0) {
            parsed++;
            T_OK(!strcmp(m.cmd, "evict") && ms_node_name_ok(m.node));
        }
    }
    T_OK(parsed < 20000);
}

/* A driver that answers `status` with a reply of big_n bytes (its nodes). */
static int big_lfd;
static size_t big_n;

static void *big_driver(void *arg) {
    (void)arg;
    int fd = -1;
    for (int i = 0; i < 1000 && (fd = accept(big_lfd, NULL, NULL)) < 0; i++)
        usleep(10000); /* the listening socket does not block */
    if (fd < 0) return NULL;
    char line[2048];
    size_t len = 0;
    ssize_t got;
    while (len < sizeof line && !memchr(line, '\n', len) &&
           (got = read(fd, line + len, sizeof line - len)) > 0)
        len += (size_t)got;
    char *r = malloc(big_n + 1);
    size_t n = (size_t)sprintf(r, "{\"nodes\":[");
    for (int i = 0; n + 300 < big_n; i++)
        n += (size_t)sprintf(r + n,
                             "%s{\"node\":\"node%d\",\"state\":\"blocked\",\"reason\":\"%0150d\"}",
                             i ? "," : "", i, 0);
    n += (size_t)sprintf(r + n, "],\"ok\":true,\"msg\":\"status\"}\n");
    for (size_t off = 0; off < n && (got = write(fd, r + off, n - off)) > 0;)
        off += (size_t)got;
    free(r);
    close(fd);
    return NULL;
}

/* `--ctl RUN status` of a pool of many blocklisted nodes (up to 1024, each
 * with its reason): the whole reply is read (it stopped at 64 KiB and said
 * "no reply from the driver"). */
static void test_ctl_client_big(void) {
    char dir[] = "/tmp/ms_sup_ctl_XXXXXX", addr[64], why[256], path[256];
    T_OK(mkdtemp(dir) != NULL);
    T_EQ_INT(sup_listen("127.0.0.1", 0, &big_lfd, addr, sizeof addr, why, sizeof why), 0);
    T_EQ_INT(sup_ctl_write(dir, addr, TOK, why, sizeof why), 0);
    big_n = 250000;
    pthread_t th;
    pthread_create(&th, NULL, big_driver, NULL);
    snprintf(path, sizeof path, "%s/out", dir);
    fflush(stdout);
    int saved = dup(1), out = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out, 1);
    char *argv[] = {"status", NULL};
    int rc = sup_ctl_client(dir, 1, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(out);
    pthread_join(th, NULL);
    close(big_lfd);
    struct stat sb;
    T_EQ_INT(rc, 0);
    T_OK(stat(path, &sb) == 0 && sb.st_size > 200000);
    unlink(path);
    snprintf(path, sizeof path, "%s/control.json", dir);
    unlink(path);
    rmdir(dir);
}

static void test_spike(void) {
    sup_spike s = {0};
    double mean, sd;
    int spikes = 0;
    for (int step = 1; step <= 60; step++) { /* a falling, noisy loss: no spike */
        double loss = 5.0 - 0.02 * step + 0.05 * sin(step * 1.7);
        spikes += sup_spike_feed(&s, step, loss, 6, &mean, &sd) > 0;
    }
    T_EQ_INT(spikes, 0);
    T_OK(sup_spike_feed(&s, 61, 9.0, 6, &mean, &sd) > 6);        /* a jump */
    T_NEAR(mean, 5.0 - 0.02 * 60, 0.1);                          /* from where it jumped */
    T_EQ_INT(sup_spike_feed(&s, 61, 9.0, 6, NULL, NULL) > 0, 0); /* once per step */
    T_EQ_INT(sup_spike_feed(&s, 62, 3.9, 6, NULL, NULL) > 0, 0); /* back to normal */
    T_EQ_INT(sup_spike_feed(&s, 63, NAN, 6, NULL, NULL) > 0, 0);
    sup_spike flat = {0}; /* a flat loss: a tiny wiggle is not a spike */
    for (int step = 1; step <= 40; step++)
        T_EQ_INT(sup_spike_feed(&flat, step, 2.0 + (step % 2) * 1e-7, 6, NULL, NULL) > 0, 0);
}

/* The no-progress limit's base: one late step is forgotten within two
 * windows; a long step that comes back every window is never; a window with
 * no step timed (a take-over after unwatched steps) forgets nothing. */
static void test_interval(void) {
    sup_interval v = {0};
    T_NEAR(sup_interval_max(&v), 0, 0);
    for (int s = 1; s < 500; s++)
        sup_interval_feed(&v, s, 1.0);
    sup_interval_feed(&v, 500, 60.0); /* a storage stall */
    for (int s = 501; s < 2 * SUP_INTERVAL_WINDOW; s++)
        sup_interval_feed(&v, s, 1.0);
    T_NEAR(sup_interval_max(&v), 60.0, 0); /* still within the window */
    sup_interval_feed(&v, 2 * SUP_INTERVAL_WINDOW, 1.5);
    T_NEAR(sup_interval_max(&v), 1.5, 0); /* forgotten */
    sup_interval_feed(&v, 700, 2.0);      /* a step redone after a restart: this bucket's */
    T_NEAR(v.cur, 2.0, 0);
    T_EQ_INT(v.bucket, 2);

    sup_interval w = {0};
    int always = 1;
    for (int s = 1; s < 10 * SUP_INTERVAL_WINDOW; s++) {
        sup_interval_feed(&w, s, s % SUP_INTERVAL_WINDOW == 999 ? 30.0 : 1.0);
        if (s >= 999 && sup_interval_max(&w) != 30.0) always = 0;
    }
    T_OK(always);

    sup_interval x = {0};
    sup_interval_feed(&x, 10, 5.0);
    sup_interval_feed(&x, 3 * SUP_INTERVAL_WINDOW + 500, 1.0); /* buckets 1, 2: no step */
    T_NEAR(sup_interval_max(&x), 5.0, 0);
}

static void test_straggler(void) {
    sup_straggler s;
    T_EQ_INT(sup_straggler_init(&s, 4), 0);
    double score = 0;
    int found = -1;
    for (int step = 1; step <= 6 && found < 0; step++) {
        for (int r = 0; r < 4; r++)
            sup_straggler_feed(&s, r, -1, step, r == 2 ? 300.0 : 100.0 + r);
        found = sup_straggler_check(&s, 0.6, 5, &score);
        if (step < 5) T_EQ_INT(found, -1);
    }
    T_EQ_INT(found, 2);
    T_NEAR(score, 101.0 / 300.0, 0.01);
    /* a round is scored only when every rank has reported past it */
    sup_straggler_reset(&s);
    sup_straggler_feed(&s, 0, -1, 1, 100);
    T_EQ_INT(sup_straggler_check(&s, 0.6, 1, &score), -1);
    /* an even spread, and a rank slow only now and then: none */
    sup_straggler_reset(&s);
    for (int step = 1; step <= 20; step++) {
        for (int r = 0; r < 4; r++)
            sup_straggler_feed(&s, r, -1, step, r == 1 && step % 3 == 0 ? 400.0 : 100.0);
        T_EQ_INT(sup_straggler_check(&s, 0.6, 3, &score), -1);
    }
    sup_straggler_free(&s);
    T_OK(sup_straggler_init(&s, 2) == 0); /* two ranks: each against the other */
    for (int step = 1; step <= 3; step++) {
        sup_straggler_feed(&s, 0, -1, step, 50);
        sup_straggler_feed(&s, 1, -1, step, 400);
        found = sup_straggler_check(&s, 0.6, 3, &score);
    }
    T_EQ_INT(found, 1);
    sup_straggler_free(&s);
    /* pp 2 x dp 2: the last stage also computes the loss, so its ranks are
     * compared with each other only; a healthy layout has no straggler */
    T_OK(sup_straggler_init(&s, 4) == 0);
    for (int step = 1; step <= 12; step++) {
        for (int r = 0; r < 4; r++)
            sup_straggler_feed(&s, r, r / 2, step, r < 2 ? 100.0 : 300.0 + r);
        T_EQ_INT(sup_straggler_check(&s, 0.6, 3, &score), -1);
    }
    /* ... and a slow rank of the last stage is found against its peer */
    found = -1;
    for (int step = 13; step <= 16; step++) {
        for (int r = 0; r < 4; r++)
            sup_straggler_feed(&s, r, r / 2, step, r < 2 ? 100.0 : r == 3 ? 900.0 : 300.0);
        found = sup_straggler_check(&s, 0.6, 3, &score);
    }
    T_EQ_INT(found, 3);
    T_NEAR(score, 300.0 / 900.0, 0.01);
    sup_straggler_free(&s);
    /* pp only: a rank alone in its stage has no peer to be compared with */
    T_OK(sup_straggler_init(&s, 2) == 0);
    for (int step = 1; step <= 8; step++) {
        sup_straggler_feed(&s, 0, 0, step, 50);
        sup_straggler_feed(&s, 1, 1, step, 400);
        T_EQ_INT(sup_straggler_check(&s, 0.6, 3, &score), -1);
    }
    /* ... but one that becomes slower than itself while the other stage
     * does not is found (a node holding a whole stage) */
    found = -1;
    for (int step = 9; step <= 12 && found < 0; step++) {
        sup_straggler_feed(&s, 0, 0, step, 50);
        sup_straggler_feed(&s, 1, 1, step, 1600);
        found = sup_straggler_check(&s, 0.6, 3, &score);
        if (step < 11) T_EQ_INT(found, -1);
    }
    T_EQ_INT(found, 1);
    T_NEAR(score, 0.25, 0.01);
    sup_straggler_free(&s);
    /* pp 2 x dp 2, each stage on its own node: the last stage's node slows
     * down (both its ranks): found against their own speed */
    T_OK(sup_straggler_init(&s, 4) == 0);
    found = -1;
    for (int step = 1; step <= 14 && found < 0; step++) {
        for (int r = 0; r < 4; r++)
            sup_straggler_feed(&s, r, r / 2, step, r < 2 ? 100.0 : (step > 8 ? 3000.0 : 300.0) + r);
        found = sup_straggler_check(&s, 0.6, 3, &score);
        if (step < 11) T_EQ_INT(found, -1);
    }
    T_OK(found == 2 || found == 3);
    sup_straggler_free(&s);
    /* pp 2 x dp 2 on shared cores: rank 2 ran fast while it had a core to
     * itself (20 ms), then as fast as its stage-mate (34 ms, 0.59 x its own
     * start) while rank 3 kept near its start: scheduling, not a slow node
     * (before, one rank's own score alone made it a straggler) */
    T_OK(sup_straggler_init(&s, 4) == 0);
    for (int step = 1; step <= 20; step++) {
        for (int r = 0; r < 4; r++) {
            double ms = r < 2 ? 18.0 : step <= 5 ? (r == 2 ? 20.0 : 30.0) : 34.0;
            sup_straggler_feed(&s, r, r / 2, step, ms);
        }
        T_EQ_INT(sup_straggler_check(&s, 0.6, 3, &score), -1);
    }
    sup_straggler_free(&s);
    /* the whole job slower (every rank 3x): no rank's fault */
    T_OK(sup_straggler_init(&s, 4) == 0);
    for (int step = 1; step <= 20; step++) {
        for (int r = 0; r < 4; r++)
            sup_straggler_feed(&s, r, r / 2, step, (r < 2 ? 100.0 : 300.0) * (step > 8 ? 3 : 1));
        T_EQ_INT(sup_straggler_check(&s, 0.6, 3, &score), -1);
    }
    /* a new attempt learns its speeds again (it may run on other nodes) */
    sup_straggler_reset(&s);
    for (int step = 21; step <= 40; step++) {
        for (int r = 0; r < 4; r++)
            sup_straggler_feed(&s, r, r / 2, step, r < 2 ? 100.0 : 3000.0);
        T_EQ_INT(sup_straggler_check(&s, 0.6, 3, &score), -1);
    }
    sup_straggler_free(&s);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    T_OK(f != NULL);
    if (f) fputs(text, f), fclose(f);
}

static void test_nodes(void) {
    char dir[] = "/tmp/ms_sup_nodes_XXXXXX";
    T_OK(mkdtemp(dir) != NULL);
    sup_nodes *p = calloc(1, sizeof *p);
    char why[1024];
    sup_config c = {.np = 4, .nodes = 2, .spares = 1, .run_dir = dir};
    T_EQ_INT(sup_nodes_init(p, &c, why, sizeof why), 0);
    T_EQ_INT(p->n, 3);
    T_EQ_INT(p->needed, 2);
    T_EQ_INT(p->per_node, 2);
    T_EQ_INT(sup_nodes_load_blocklist(p, why, sizeof why), 0); /* none yet */
    T_EQ_INT(sup_nodes_choose(p), 0);
    T_OK(!strcmp(sup_nodes_rank_name(p, 3), "node1"));
    T_EQ_INT(sup_nodes_block(p, 1, "diag failed: gemm", why, sizeof why), 0);
    T_EQ_INT(sup_nodes_choose(p), 0);
    T_OK(!strcmp(sup_nodes_rank_name(p, 3), "node2")); /* the spare took its place */
    char map[256];
    sup_nodes_map(p, p->active, p->needed, map, sizeof map);
    T_OK(!strcmp(map, "node0,node2"));
    sup_nodes_free(p);
    /* a new driver reads the blocklist back */
    T_EQ_INT(sup_nodes_init(p, &c, why, sizeof why), 0);
    T_EQ_INT(sup_nodes_load_blocklist(p, why, sizeof why), 0);
    T_OK(!strcmp(p->blocked[1], "diag failed: gemm"));
    T_EQ_INT(sup_nodes_usable(p), 2);
    T_EQ_INT(sup_nodes_block(p, 0, "manual", why, sizeof why), 0);
    T_EQ_INT(sup_nodes_choose(p), -1); /* one node left for a job of two */
    sup_nodes_free(p);
    /* a malformed blocklist is refused by name and left as it is */
    char path[4200];
    snprintf(path, sizeof path, "%s/blocklist.json", dir);
    write_file(path, "{\"v\":1,\"blocked\":[{\"node\":\"../x\"}]}");
    T_EQ_INT(sup_nodes_init(p, &c, why, sizeof why), 0);
    T_EQ_INT(sup_nodes_load_blocklist(p, why, sizeof why), -1);
    T_OK(strstr(why, "blocklist.json") != NULL);
    write_file(path, "not json");
    T_EQ_INT(sup_nodes_load_blocklist(p, why, sizeof why), -1);
    sup_nodes_free(p);
    unlink(path);
    /* np must split over the nodes */
    c.np = 3;
    T_EQ_INT(sup_nodes_init(p, &c, why, sizeof why), -1);
    T_OK(strstr(why, "--np 3") != NULL);
    /* a hostfile: its hosts are the nodes, the last --spares ones held back */
    snprintf(path, sizeof path, "%s/hosts", dir);
    write_file(path, "# the cluster\nhostA slots=2\nhostB slots=2 max_slots=4\n\nhostC slots=2\n");
    sup_config h = {.np = 4, .spares = 1, .run_dir = dir, .hostfile = path};
    T_EQ_INT(sup_nodes_init(p, &h, why, sizeof why), 0);
    T_EQ_INT(p->n, 3);
    T_EQ_INT(p->needed, 2);
    T_EQ_INT(sup_nodes_choose(p), 0);
    T_OK(!strcmp(sup_nodes_rank_name(p, 2), "hostB"));
    char hf[4300];
    snprintf(hf, sizeof hf, "%s/hostfile.active", dir);
    T_EQ_INT(sup_nodes_write_hostfile(p, p->active, p->needed, 2, hf, why, sizeof why), 0);
    char text[256] = "";
    FILE *f = fopen(hf, "r");
    if (f) text[fread(text, 1, sizeof text - 1, f)] = 0, fclose(f);
    T_OK(!strcmp(text, "hostA slots=2\nhostB slots=2\n"));
    sup_nodes_free(p);
    write_file(path, "hostA slots=1\nhostB slots=1\n"); /* too few slots for 2 ranks a node */
    h.spares = 0;
    T_EQ_INT(sup_nodes_init(p, &h, why, sizeof why), -1);
    write_file(path, "hostA slots=2\nhostA slots=2\n");
    T_EQ_INT(sup_nodes_init(p, &h, why, sizeof why), -1);
    T_OK(strstr(why, "twice") != NULL);
    write_file(path, "hostA bogus=1\n");
    T_EQ_INT(sup_nodes_init(p, &h, why, sizeof why), -1);
    T_OK(strstr(why, ":1:") != NULL);
    /* slots past an int, or not a number: refused (%d wrapped 2^32 + 1 to 1, 2^32 + 2 to 2) */
    static const char *const bad_slots[] = {
        "hostA slots=4294967298\nhostB slots=2\n", "hostA slots=2\nhostB slots=2x\n",
        "hostA slots=0\nhostB slots=2\n", "hostA slots=-2\nhostB slots=2\n"};
    for (int i = 0; i < 4; i++) {
        write_file(path, bad_slots[i]);
        T_EQ_INT(sup_nodes_init(p, &h, why, sizeof why), -1);
        T_OK(strstr(why, "slots must be a whole number in 1..") != NULL);
    }
    unlink(hf);
    unlink(path);
    snprintf(path, sizeof path, "%s/blocklist.json", dir);
    unlink(path);
    rmdir(dir);
    free(p);
}

/* k nodes that reported, passing, with these GEMM and memory speeds. */
static void diag_results(sup_diag_result *res, int k, const double *gemm, const double *mem) {
    memset(res, 0, sizeof *res * (size_t)k);
    for (int j = 0; j < k; j++) {
        res[j].ok = res[j].reported = 1;
        res[j].speed[SUP_DIAG_GEMM] = gemm[j];
        res[j].speed[SUP_DIAG_MEMORY] = mem[j];
    }
}

static void test_diag_peers(void) {
    sup_diag_result res[5];
    /* one slow GEMM among 4: failed, named, with its ratio to the others' median */
    diag_results(res, 4, (double[]){100, 30, 110, 90}, (double[]){20, 20, 21, 19});
    T_EQ_INT(sup_diag_peers(res, 4, 0.5), 1);
    T_OK(res[0].ok && res[2].ok && res[3].ok && !res[1].ok);
    T_OK(!strcmp(res[1].failed, "gemm"));
    T_OK(strstr(res[1].detail, "gemm: 30 GFLOP/s, 0.30 x the median 100 GFLOP/s") != NULL);
    /* a node that already failed a check keeps it, once, and adds the slow one */
    diag_results(res, 3, (double[]){100, 100, 100}, (double[]){20, 5, 20});
    res[1].ok = 0;
    snprintf(res[1].failed, sizeof res[1].failed, "memory, storage");
    snprintf(res[1].detail, sizeof res[1].detail, "memory: a byte differs");
    T_EQ_INT(sup_diag_peers(res, 3, 0.5), 1);
    T_OK(!strcmp(res[1].failed, "memory, storage"));
    T_OK(strstr(res[1].detail, "a byte differs; memory: 5 GB/s, 0.25 x") != NULL);
    /* slow in both: counted once */
    diag_results(res, 3, (double[]){100, 10, 100}, (double[]){20, 2, 20});
    T_EQ_INT(sup_diag_peers(res, 3, 0.5), 1);
    T_OK(!strcmp(res[1].failed, "gemm, memory"));
    /* two nodes: the slower one, not the faster; within the factor: none */
    diag_results(res, 2, (double[]){100, 40}, (double[]){20, 20});
    T_EQ_INT(sup_diag_peers(res, 2, 0.5), 1);
    T_OK(res[0].ok && !res[1].ok);
    diag_results(res, 2, (double[]){100, 60}, (double[]){20, 20});
    T_EQ_INT(sup_diag_peers(res, 2, 0.5), 0);
    /* a node without a report or a speed is neither judged nor counted */
    diag_results(res, 3, (double[]){100, 0, 20}, (double[]){20, 20, 20});
    res[0].reported = 0;
    T_EQ_INT(sup_diag_peers(res, 3, 0.5), 0); /* node 2 has no one to compare with */
    /* alone, or the factor 0: nothing */
    diag_results(res, 1, (double[]){1}, (double[]){1});
    T_EQ_INT(sup_diag_peers(res, 1, 0.5), 0);
    diag_results(res, 5, (double[]){100, 1, 100, 100, 100}, (double[]){20, 20, 20, 20, 20});
    T_EQ_INT(sup_diag_peers(res, 5, 0), 0);
    /* the median of the others: two slow of four fail (each one's others: 100, 100, 20);
     * three of four at one speed are the normal, and the fast one is not slow */
    diag_results(res, 4, (double[]){100, 100, 20, 20}, (double[]){20, 20, 20, 20});
    T_EQ_INT(sup_diag_peers(res, 4, 0.5), 2);
    T_OK(res[0].ok && res[1].ok && !res[2].ok && !res[3].ok);
    diag_results(res, 4, (double[]){100, 20, 20, 20}, (double[]){20, 20, 20, 20});
    T_EQ_INT(sup_diag_peers(res, 4, 0.5), 0);
}

/* The reports of diag on nodes node0..node2 as a fake mpirun prints them:
 * node0 passes, node1's gemm fails on its speed alone ("slow": below its own
 * history), node2's gemm on its results and its speed (no "slow"), and an
 * older diag's report (no "slow" at all) counts as a failure otherwise. */
static void test_diag_reports(void) {
    char dir[] = "/tmp/ms_sup_diag_XXXXXX", why[1024], fake[64], path[96];
    T_OK(mkdtemp(dir) != NULL);
    sup_nodes *p = calloc(1, sizeof *p);
    sup_config c = {.np = 3, .nodes = 3, .run_dir = dir};
    T_EQ_INT(sup_nodes_init(p, &c, why, sizeof why), 0);
    snprintf(fake, sizeof fake, "%s/mpirun", dir);
    snprintf(path, sizeof path, "%s/reports", dir);
    write_file(path,
               "{\"node\":\"node0\",\"ok\":true,\"checks\":[{\"name\":\"gemm\",\"ok\":true,"
               "\"slow\":false,\"value\":100},{\"name\":\"memory\",\"ok\":true,\"value\":20}]}\n"
               "{\"node\":\"node1\",\"ok\":false,\"checks\":[{\"name\":\"gemm\",\"ok\":false,"
               "\"slow\":true,\"value\":10,\"detail\":\"SLOW: 10 < 0.50 x median 100\"},"
               "{\"name\":\"memory\",\"ok\":true,\"slow\":false,\"value\":20}]}\n"
               "{\"node\":\"node2\",\"ok\":false,\"checks\":[{\"name\":\"gemm\",\"ok\":false,"
               "\"slow\":false,\"value\":10,\"detail\":\"WRONG RESULTS\"},"
               "{\"name\":\"storage\",\"ok\":true,\"slow\":false}]}\n");
    char script[256];
    snprintf(script, sizeof script, "#!/bin/sh\ncat %s\n", path);
    write_file(fake, script);
    chmod(fake, 0755);
    sup_diag_config dc = {.mpirun = fake, .bin = "megascale", .timeout = 30, .pool = p};
    int idx[3] = {0, 1, 2};
    sup_diag_result res[3];
    T_EQ_INT(sup_diag_run(&dc, idx, 3, res, why, sizeof why), 0);
    T_OK(res[0].ok && !sup_diag_slow_only(&res[0]));
    T_OK(!res[1].ok && !res[1].hard && res[1].slow[SUP_DIAG_GEMM] == 1);
    T_OK(sup_diag_slow_only(&res[1]) && !strcmp(res[1].failed, "gemm"));
    T_OK(!res[2].ok && res[2].hard && res[2].slow[SUP_DIAG_GEMM] == 2);
    T_OK(!sup_diag_slow_only(&res[2]));
    T_NEAR(res[1].speed[SUP_DIAG_GEMM], 10, 0);
    /* an older diag's report: a failed check without "slow" is no speed alone */
    write_file(path, "{\"node\":\"node1\",\"ok\":false,\"checks\":[{\"name\":\"gemm\","
                     "\"ok\":false,\"value\":10}]}\n");
    T_EQ_INT(sup_diag_run(&dc, idx, 3, res, why, sizeof why), 0);
    T_OK(res[1].reported && res[1].hard && !sup_diag_slow_only(&res[1]));
    T_OK(!res[0].reported && !sup_diag_slow_only(&res[0])); /* no report: no second chance */
    unlink(fake), unlink(path), rmdir(dir);
    sup_nodes_free(p);
    free(p);
}

/* A node that failed only as slow, measured a second time: best of two. */
static void test_diag_best_of_two(void) {
    sup_diag_result r, again;
    /* slow against its own history the first time only (a busy moment): passes */
    diag_results(&r, 1, (double[]){10}, (double[]){20});
    r.ok = 0, r.slow[SUP_DIAG_GEMM] = 1;
    snprintf(r.failed, sizeof r.failed, "gemm");
    snprintf(r.detail, sizeof r.detail, "gemm: SLOW: 10 GFLOP/s < 0.50 x median 100");
    T_OK(sup_diag_slow_only(&r));
    diag_results(&again, 1, (double[]){95}, (double[]){18});
    sup_diag_best_of_two(&r, &again);
    T_OK(r.ok && !r.failed[0] && !r.slow[SUP_DIAG_GEMM]);
    T_NEAR(r.speed[SUP_DIAG_GEMM], 95, 0);
    T_NEAR(r.speed[SUP_DIAG_MEMORY], 20, 0); /* the better of the two */
    T_STR_CONTAINS(r.detail, "passed when measured once more (the first time: gemm: SLOW");
    /* slow in both: still failed, and says so */
    diag_results(&r, 1, (double[]){10}, (double[]){2});
    r.ok = 0, r.slow[SUP_DIAG_GEMM] = r.slow[SUP_DIAG_MEMORY] = 1;
    snprintf(r.failed, sizeof r.failed, "gemm, memory");
    snprintf(r.detail, sizeof r.detail, "gemm: SLOW; memory: SLOW");
    diag_results(&again, 1, (double[]){12}, (double[]){20});
    again.ok = 0, again.slow[SUP_DIAG_GEMM] = 1;
    sup_diag_best_of_two(&r, &again);
    T_OK(!r.ok && r.slow[SUP_DIAG_GEMM] == 1 && !r.slow[SUP_DIAG_MEMORY]);
    T_OK(!strcmp(r.failed, "gemm"));
    T_STR_CONTAINS(r.detail, "slow again when measured once more (memory passed then)");
    T_NEAR(r.speed[SUP_DIAG_GEMM], 12, 0);
    /* wrong results the second time: the first failure stands */
    diag_results(&r, 1, (double[]){10}, (double[]){20});
    r.ok = 0, r.slow[SUP_DIAG_GEMM] = 1;
    diag_results(&again, 1, (double[]){100}, (double[]){20});
    again.ok = 0, again.hard = 1, again.slow[SUP_DIAG_GEMM] = 2;
    sup_diag_best_of_two(&r, &again);
    T_OK(!r.ok);
    /* no report the second time: nothing changes */
    diag_results(&r, 1, (double[]){10}, (double[]){20});
    r.ok = 0, r.slow[SUP_DIAG_GEMM] = 1;
    memset(&again, 0, sizeof again);
    sup_diag_best_of_two(&r, &again);
    T_OK(!r.ok && r.slow[SUP_DIAG_GEMM] == 1);
    /* a failure otherwise is never undone: wrong results, however fast */
    diag_results(&r, 1, (double[]){10}, (double[]){20});
    r.ok = 0, r.hard = 1, r.slow[SUP_DIAG_GEMM] = 2;
    T_OK(!sup_diag_slow_only(&r));
    diag_results(&again, 1, (double[]){100}, (double[]){20});
    sup_diag_best_of_two(&r, &again);
    T_OK(!r.ok);
    /* passing the first time, slow against the peers: only the speeds are taken */
    diag_results(&r, 1, (double[]){10}, (double[]){20});
    diag_results(&again, 1, (double[]){100}, (double[]){25});
    sup_diag_best_of_two(&r, &again);
    T_OK(r.ok);
    T_NEAR(r.speed[SUP_DIAG_GEMM], 100, 0);
    T_NEAR(r.speed[SUP_DIAG_MEMORY], 25, 0);
}

/* ---- the driver's handling of beats (sup_on_beat) ------------------------- */

/* A driver of np ranks with no job, sockets, files or nodes: what beats need. */
static sup_driver *beat_driver(sup_config *c, int np) {
    *c = (sup_config){.np = np, .steps = 100, .hb_timeout = 30, .ckpt_fail_limit = 3};
    sup_driver *d = calloc(1, sizeof *d);
    T_OK(d != NULL);
    d->c = c;
    d->pool = calloc(1, sizeof *d->pool);
    d->r = calloc((size_t)np, sizeof *d->r);
    d->conns = calloc((size_t)np, sizeof *d->conns);
    T_OK(d->pool && d->r && d->conns);
    T_EQ_INT(sup_straggler_init(&d->strag, np), 0);
    d->lfd = d->ctl_fd = d->lock_fd = -1;
    sup_reset_ranks(d);
    d->ev.t0 = ms_wall_now();
    return d;
}

static void beat_driver_free(sup_driver *d) {
    sup_straggler_free(&d->strag);
    free(d->adopt_pids), free(d->adopt_starts), free(d->adopt_hosts);
    free(d->conns), free(d->r), free(d->pool), free(d);
}

/* d's state written to DIR/driver.json (d->state_path), through its writer thread. */
static void save_state(sup_driver *d, const char *dir) {
    char why[512];
    d->writer = sup_writer_start(why, sizeof why);
    T_OK(d->writer != NULL);
    snprintf(d->state_path, sizeof d->state_path, "%s/driver.json", dir);
    snprintf(d->token, sizeof d->token, "%s", TOK);
    sup_state_save(d, 0, 1);
    T_EQ_INT(sup_writer_stop(d->writer, 10), 0);
    d->writer = NULL;
}

/* The state at path as JSON (an older state is made by deleting keys from it). */
static cJSON *read_state(const char *path) {
    FILE *f = fopen(path, "r");
    T_OK(f != NULL);
    char buf[8192] = "";
    size_t got = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[got] = 0;
    cJSON *o = cJSON_Parse(buf);
    T_OK(cJSON_IsObject(o));
    return o;
}

/* A driver that takes over from the state at path (driver.json). */
static sup_driver *beat_resumed(sup_config *c, int np, const char *path) {
    sup_driver *d = beat_driver(c, np);
    d->adopt_pids = calloc((size_t)np, sizeof *d->adopt_pids);
    d->adopt_starts = calloc((size_t)np, sizeof *d->adopt_starts);
    d->adopt_hosts = calloc((size_t)np, sizeof *d->adopt_hosts);
    T_OK(d->adopt_pids && d->adopt_starts && d->adopt_hosts);
    snprintf(d->state_path, sizeof d->state_path, "%s", path);
    char why[512] = "";
    T_EQ_INT(sup_state_resume(d, why, sizeof why), 0);
    return d;
}

/* A new attempt: its ranks connect afresh (sup_reset_ranks closed none here). */
static void beat_attempt(sup_driver *d, sup_conn *k) {
    sup_reset_ranks(d);
    d->attempt_no++;
    for (int i = 0; i < d->c->np; i++)
        k[i] = (sup_conn){.fd = -1, .rank = -1};
}

/* Rank's beat on its connection k[rank]: `step` steps done, in `phase`,
 * waiting in communication for comm_wait_s (NAN: not said). */
static void beat_send_wait(sup_driver *d, sup_conn *k, int rank, int step, double step_ms,
                           const char *phase, const char *error, double comm_wait_s) {
    sup_beat b = {.rank = rank,
                  .world = d->c->np,
                  .pid = 1000 + rank,
                  .stage = -1,
                  .seq = ++k[rank].seq,
                  .step = step,
                  .step_ms = step_ms,
                  .loss = NAN,
                  .grad_norm = NAN,
                  .comm_bytes = NAN,
                  .compute_ms = step_ms,
                  .comm_wait_s = comm_wait_s,
                  .ckpt_commit = -1};
    snprintf(b.host, sizeof b.host, "elsewhere"); /* not this host: no pid is looked at */
    snprintf(b.phase, sizeof b.phase, "%s", phase);
    snprintf(b.error, sizeof b.error, "%s", error);
    sup_on_beat(d, &k[rank], &b);
}

static void beat_send(sup_driver *d, sup_conn *k, int rank, int step, double step_ms,
                      const char *phase, const char *error) {
    beat_send_wait(d, k, rank, step, step_ms, phase, error, NAN);
}

/* Steps from..to of every rank at step_ms each, rank 0's beat of each step
 * read last (the others' first: best_step is there before rank 0 is). */
static void beat_steps(sup_driver *d, sup_conn *k, int from, int to, double step_ms) {
    for (int step = from; step <= to; step++)
        for (int r = d->c->np - 1; r >= 0; r--)
            beat_send(d, k, r, step, step_ms, "train", "");
}

static void test_step_time(void) {
    char dir[] = "/tmp/ms_sup_beats_XXXXXX";
    T_OK(mkdtemp(dir) != NULL);
    sup_config c;
    sup_driver *d = beat_driver(&c, 2);
    sup_conn k[2];
    beat_attempt(d, k);
    beat_steps(d, k, 0, 0, NAN); /* in the loop */
    beat_steps(d, k, 1, 10, 100);
    T_EQ_INT(d->best_step, 10);
    T_EQ_INT((int)d->step_ms_n, 10); /* every step of rank 0's, though rank 1's came first */
    T_NEAR(d->step_ms_sum, 1000, 1e-9);
    T_EQ_INT(d->timed_step, 10);
    d->ev.t0 = ms_wall_now() - 1.0; /* 10 steps of 0.1 s in 1 s: all of it trained */
    T_NEAR(sup_ettr(d), 1.0, 0.05);
    /* a fault: the step the stopping job finishes waited for it (not timed) */
    sup_set_fault(d, "crash", 1, 0, "rank 1 is gone (a test)");
    beat_send(d, k, 0, 11, 5000, "train", "");
    T_EQ_INT((int)d->step_ms_n, 10);
    /* the restart rolls back to step 8: steps 9 to 11 redone, 9 and 10 not
     * timed again, 11 (not timed before) is, then 12 */
    beat_attempt(d, k);
    beat_steps(d, k, 8, 8, NAN);
    beat_steps(d, k, 9, 10, 900);
    T_EQ_INT((int)d->step_ms_n, 10);
    beat_steps(d, k, 11, 12, 100);
    T_EQ_INT((int)d->step_ms_n, 12);
    T_NEAR(d->step_ms_sum, 1200, 1e-9);
    T_EQ_INT(d->timed_step, 12);
    /* a driver that takes over (driver.json) times the steps after them only */
    save_state(d, dir);
    sup_config c2;
    sup_driver *e = beat_resumed(&c2, 2, d->state_path);
    T_EQ_INT(e->timed_step, 12);
    /* the limit's window goes on in the new driver */
    T_OK(d->interval.cur > 0);
    T_NEAR(e->interval.cur, d->interval.cur, 1e-6);
    T_NEAR(e->interval.prev, d->interval.prev, 1e-6);
    T_EQ_INT(e->interval.bucket, d->interval.bucket);
    T_EQ_INT((int)e->step_ms_n, 12);
    beat_attempt(e, k);
    beat_steps(e, k, 10, 10, NAN);
    beat_steps(e, k, 11, 13, 100);
    T_EQ_INT((int)e->step_ms_n, 13);
    T_NEAR(e->step_ms_sum / (double)e->step_ms_n, 100, 1e-9);
    beat_driver_free(e);
    /* an older state, without timed_step: its steps up to best_step were timed */
    char *text = NULL;
    cJSON *o = read_state(d->state_path);
    cJSON_DeleteItemFromObjectCaseSensitive(o, "timed_step");
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "best_step"), 11);
    text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    write_file(d->state_path, text ? text : "");
    cJSON_free(text);
    e = beat_resumed(&c2, 2, d->state_path);
    T_EQ_INT(e->timed_step, 11);
    beat_driver_free(e);
    unlink(d->state_path);
    rmdir(dir);
    beat_driver_free(d);
}

/* The steps redone and skipped that the ranks' beats said in this attempt, the steps of the
 * last redo and skip events, whether its straggler anomaly was said, and the loss-spike
 * detector's history go into driver.json and back: a driver that takes the job over starts
 * there, says none again and misses no spike (an older state: none, as before). */
static void test_state_redo_counts(void) {
    char dir[] = "/tmp/ms_sup_redo_XXXXXX";
    T_OK(mkdtemp(dir) != NULL);
    sup_config c, c2;
    sup_driver *d = beat_driver(&c, 3);
    sup_conn k[3];
    beat_attempt(d, k);
    beat_steps(d, k, 0, 6, 100);
    d->r[0].redone = 2, d->r[1].redone = 3, d->r[2].redone = 1; /* rank 1's beat came last */
    d->r[1].skipped = 1;
    d->nan_step = 5, d->skip_step = 6;
    d->straggler_warned = 1;
    for (int step = 1; step <= 40; step++) /* the spike detector's ring wrapped */
        sup_spike_feed(&d->spike, step, 5.0 - 0.01 * step + 0.001 * (step % 3), 6, NULL, NULL);
    T_EQ_INT(d->spike.n, SUP_SPIKE_WINDOW);
    save_state(d, dir);
    sup_driver *e = beat_resumed(&c2, 3, d->state_path);
    T_EQ_INT(e->redone_adopt, 3);
    T_EQ_INT(e->skipped_adopt, 1);
    T_EQ_INT(e->nan_step_adopt, 5);
    T_EQ_INT(e->skip_step_adopt, 6);
    T_EQ_INT(e->straggler_warned_adopt, 1);
    /* cJSON writes a double with 15 digits where that reads back within its epsilon */
    T_OK(e->spike.n == d->spike.n && e->spike.next == d->spike.next && e->spike.last_step == 40 &&
         e->spike.have_prev);
    T_NEAR(e->spike.prev, d->spike.prev, 1e-12);
    for (int i = 0; i < SUP_SPIKE_WINDOW; i++)
        T_NEAR(e->spike.v[i], d->spike.v[i], 1e-12);
    beat_driver_free(e);
    /* an older state, without them */
    cJSON *o = read_state(d->state_path);
    const char *keys[] = {"ranks_redone", "ranks_skipped",    "nan_step",
                          "skip_step",    "straggler_warned", "spike"};
    for (int i = 0; i < 6; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(o, keys[i]);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    write_file(d->state_path, text ? text : "");
    cJSON_free(text);
    e = beat_resumed(&c2, 3, d->state_path);
    T_OK(e->redone_adopt == 0 && e->skipped_adopt == 0 && e->nan_step_adopt == 0 &&
         e->skip_step_adopt == 0 && e->straggler_warned_adopt == 0 && e->spike.n == 0 &&
         !e->spike.have_prev);
    beat_driver_free(e);
    unlink(d->state_path);
    rmdir(dir);
    beat_driver_free(d);
}

/* A driver of np ranks at step 3; the reporter's pid unknown (the beats say pid 1000 + rank:
 * no process of this host's to look at). */
static sup_driver *at_step3(sup_config *c, int np, sup_conn *k) {
    sup_driver *d = beat_driver(c, np);
    beat_attempt(d, k);
    beat_steps(d, k, 0, 3, 100);
    d->r[0].pid_start = 0;
    return d;
}

/* A communication error on a surviving rank after another rank's process is
 * gone (its close not read yet) is that rank's crash, from when its
 * connection was lost; with no rank gone it is the reporter's comm fault,
 * and another error stays the reporter's own. */
static void test_comm_after_gone(void) {
    pid_t child = fork();
    if (child == 0) {
        for (;;)
            pause();
    }
    T_OK(child > 0);
    unsigned long long child_start = sup_pid_start(child);
    T_OK(child_start > 0);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0); /* gone: its pid with that start time is no process */
    static const struct {
        int gone;
        const char *error, *kind;
        int rank;
    } cases[] = {
        {1, "all-reduce timed out after 30 s (world broken)", "crash", 1},
        {0, "all-reduce timed out after 30 s (world broken)", "comm", 0},
        {1, "CUDA error: an illegal memory access", "device", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sup_config c;
        sup_conn k[2];
        sup_driver *d = at_step3(&c, 2, k); /* rank 1: this process or the dead child */
        d->r[1].pid = cases[i].gone ? child : getpid();
        d->r[1].pid_start = cases[i].gone ? child_start : sup_pid_start(getpid());
        d->r[1].t_lost = cases[i].gone ? ms_now() - 2.0 : 0; /* its connection broke 2 s ago */
        beat_send(d, k, 0, 3, NAN, "error", cases[i].error);
        T_EQ_INT(d->fault, 1);
        T_OK(!strcmp(d->kind, cases[i].kind));
        T_EQ_INT(d->fault_rank, cases[i].rank);
        if (!strcmp(cases[i].kind, "crash")) {
            T_STR_CONTAINS(d->detail, "rank 1 (pid");
            T_NEAR(d->t_detect - d->t_stall, 2.0, 0.5); /* detected from the loss */
        }
        beat_driver_free(d);
    }
    /* a rank that reported an error of its own has exited: mpirun ends the others, and a
     * rank gone then is no crash (an abort's cascade); the beats name the peer lost: rank 2,
     * silent 2 s.  Before, rank 2 was booked as a crash (and under load, a survivor whose
     * error was still unread, rank 1 here) */
    sup_config c;
    sup_conn k[3];
    sup_driver *d = at_step3(&c, 3, k);
    for (int r = 1; r < 3; r++)
        d->r[r].pid = child, d->r[r].pid_start = child_start;
    d->r[1].failed = 1; /* its error read, no fault taken on it yet */
    d->r[2].last_beat -= 2.0, d->r[2].last_progress -= 20;
    beat_send(d, k, 0, 3, NAN, "error", "all-reduce timed out after 30 s (world broken)");
    T_EQ_INT(d->fault, 1);
    T_OK(!strcmp(d->kind, "comm"));
    T_EQ_INT(d->fault_rank, 2);
    T_STR_CONTAINS(d->detail, "rank 2 (on elsewhere) went silent 2.0 s before rank 0 reported");
    beat_driver_free(d);
    /* a crash all the same: the reporter itself exited (its own exit is no cascade's
     * cause), and rank 2 exited after its error but rank 0's error says rank 1's process
     * had exited before (the arrival board saw it), in a collective's report or in the
     * form of a point-to-point op's and the batch ring's */
    static const char *const said[] = {
        "all-reduce timed out after 30 s (world broken)",
        "comm: all_reduce #9 cannot complete, a peer process exited (after 0.2 s, timeout 30.0 "
        "s): not arrived: rank 1 (global 1, process 4242 exited, at #8 of this group); arrived: "
        "ranks 0,2",
        "/megascale-batches-h-1-0: timed out after 30 s waiting for the leader (rank 1) to "
        "publish batch 3; peer rank 0 (global 1): process 4242 exited"};
    for (int say = 0; say < 3; say++) {
        d = at_step3(&c, 3, k);
        d->r[0].pid = child, d->r[0].pid_start = child_start; /* the reporter, gone */
        d->r[1].pid = child, d->r[1].pid_start = child_start;
        if (say) d->r[2].pid = child, d->r[2].pid_start = child_start, d->r[2].failed = 1;
        beat_send(d, k, 0, 3, NAN, "error", said[say]);
        T_EQ_INT(d->fault, 1);
        T_OK(!strcmp(d->kind, "crash"));
        T_EQ_INT(d->fault_rank, 1);
        beat_driver_free(d);
    }
    /* rank 1 gone, its last beat still unread on its connection: read first.  Its own
     * error (a device's) is the cause, rank 0's comm error its consequence; its comm error,
     * a survivor's like rank 0's: no crash, the beats decide (rank 2 silent); nothing unread:
     * rank 1's crash, as before */
    static const struct {
        const char *unread, *kind, *text;
        int rank;
    } ahead[] = {
        {"CUDA error: an illegal memory access", "device", "CUDA error", 1},
        {"comm: all_reduce #9 timed out after 30 s", "comm", "rank 2 (on elsewhere) went silent",
         2},
        {NULL, "crash", "rank 1 (pid", 1},
    };
    for (size_t i = 0; i < sizeof ahead / sizeof *ahead; i++) {
        d = at_step3(&c, 3, k);
        snprintf(d->token, sizeof d->token, "%s", TOK);
        d->r[1].pid = child, d->r[1].pid_start = child_start;
        d->r[2].last_beat -= 2.0, d->r[2].last_progress -= 20;
        int sp[2];
        T_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
        d->conns[0] = k[1], d->conns[0].fd = sp[0], d->n_conns = 1;
        if (ahead[i].unread) {
            char line[1024];
            int n = snprintf(line, sizeof line,
                             "{\"v\":1,\"token\":\"%s\",\"rank\":1,\"world\":3,\"pid\":%d,"
                             "\"host\":\"elsewhere\",\"seq\":%llu,\"step\":3,\"phase\":"
                             "\"error\",\"step_ms\":null,\"loss\":null,\"grad_norm\":null,"
                             "\"comm_bytes\":0,\"error\":\"%s\"}\n",
                             TOK, (int)child, k[1].seq + 1, ahead[i].unread);
            T_EQ_INT((int)write(sp[1], line, (size_t)n), n);
        }
        beat_send(d, k, 0, 3, NAN, "error", "all-reduce timed out after 30 s (world broken)");
        T_EQ_INT(d->fault, 1);
        T_OK(!strcmp(d->kind, ahead[i].kind));
        T_EQ_INT(d->fault_rank, ahead[i].rank);
        T_STR_CONTAINS(d->detail, ahead[i].text);
        close(sp[0]), close(sp[1]);
        d->n_conns = 0;
        beat_driver_free(d);
    }
    /* a line read ahead that is rejected (a wrong token) is rejected once: the next pass drops
     * its connection without reading the line again (before, the next pass read it again,
     * and its beat_rejected event came twice) */
    d = at_step3(&c, 3, k);
    snprintf(d->token, sizeof d->token, "%s", TOK);
    int sp[2];
    T_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    d->conns[0] = k[1], d->conns[0].fd = sp[0], d->n_conns = 1;
    static const char bad[] = "{\"v\":1,\"token\":\"wrong\",\"rank\":1}\n";
    T_EQ_INT((int)write(sp[1], bad, sizeof bad - 1), (int)sizeof bad - 1);
    beat_send(d, k, 0, 3, NAN, "error", "all-reduce timed out after 30 s (world broken)");
    T_EQ_INT(d->rej_n, 1);
    d->rej_t0 = ms_now() + 3600;             /* the rate's window open: rej_n counts both passes */
    T_EQ_INT(d->n_conns, 1);                 /* left for the next pass */
    T_EQ_INT((int)write(sp[1], "\n", 1), 1); /* more from it (the next pass polls it) */
    sup_serve_for(d, 10);
    T_EQ_INT(d->rej_n, 1);
    T_EQ_INT(d->n_conns, 0); /* dropped (sp[0] closed with it) */
    close(sp[1]);
    beat_driver_free(d);
}

/* A driver of np ranks at step 3 whose ranks all made their last step
 * `stall` s ago (past the 5 s limit) and beat just now, none waiting in
 * communication (their beats from before a wait began). */
static sup_driver *stalled_driver(sup_config *c, int np, sup_conn *k, double stall) {
    sup_driver *d = beat_driver(c, np);
    c->hb_timeout = 5, c->progress_factor = 1; /* silent after 3 s */
    beat_attempt(d, k);
    beat_steps(d, k, 0, 3, 100);
    for (int r = 0; r < np; r++) {
        beat_send_wait(d, k, r, 3, NAN, "train", "", 0);
        d->r[r].last_progress -= stall;
    }
    return d;
}

/* The driver's view of its ranks, s seconds on with nothing heard. */
static void age(sup_driver *d, double s) {
    d->t_unclear -= s;
    for (int r = 0; r < d->c->np; r++)
        d->r[r].last_beat -= s, d->r[r].last_progress -= s;
}

/* A hang the beats pin on no rank (none silent, none blocked) waits for a
 * beat from each rank before it names one: the fresher beats name the rank
 * the others wait for; with no fresher beat, the first rank is named after
 * SUP_UNCLEAR_WAIT_S; a job of one rank has no peer to wait for.  Before,
 * the first rank was named at once (a CI run named the rank that waited for
 * the hung one, its newest beat from before its wait began). */
/* One pass of the detectors: no fault yet (rank < 0), or a hang on `rank`
 * whose detail says `text`. */
static void watch_expect(sup_driver *d, int rank, const char *text) {
    sup_watch(d);
    T_EQ_INT(d->fault, rank >= 0);
    if (rank < 0) return;
    T_EQ_INT(d->fault_rank, rank);
    T_STR_CONTAINS(d->detail, text);
}

static void test_unclear_hang(void) {
    sup_config c;
    sup_conn k[3];
    /* rank 0's next beat says it waits (from 2 s into the 6 s stall): rank 1 */
    sup_driver *d = stalled_driver(&c, 2, k, 6.0);
    watch_expect(d, -1, NULL);
    T_OK(d->t_unclear > 0);
    beat_send_wait(d, k, 0, 3, NAN, "train", "", 4.0);
    watch_expect(d, 1, "waits in no communication");
    beat_driver_free(d);
    /* every rank beat again and none waits: the first rank, without waiting longer */
    d = stalled_driver(&c, 3, k, 6.0);
    watch_expect(d, -1, NULL);
    for (int r = 0; r < 2; r++)
        beat_send_wait(d, k, r, 3, NAN, "train", "", 0);
    watch_expect(d, -1, NULL); /* rank 2 has not beaten since */
    beat_send_wait(d, k, 2, 3, NAN, "train", "", 0);
    watch_expect(d, 0, "beats but made no step");
    beat_driver_free(d);
    /* no fresher beat: named after the wait */
    d = stalled_driver(&c, 2, k, 6.0);
    watch_expect(d, -1, NULL);
    age(d, SUP_UNCLEAR_WAIT_S - 0.5);
    watch_expect(d, -1, NULL);
    age(d, 0.6);
    watch_expect(d, 0, "beats but made no step");
    beat_driver_free(d);
    /* the stall ended (a step made) before the verdict: the wait starts afresh */
    d = stalled_driver(&c, 2, k, 6.0);
    sup_watch(d);
    T_OK(d->t_unclear > 0);
    beat_steps(d, k, 4, 4, 100);
    watch_expect(d, -1, NULL);
    T_OK(d->t_unclear == 0);
    beat_driver_free(d);
    /* one rank: nothing to compare, named at once */
    d = stalled_driver(&c, 1, k, 6.0);
    watch_expect(d, 0, "beats but made no step");
    beat_driver_free(d);
    /* under the limit: no verdict, no wait */
    d = stalled_driver(&c, 2, k, 4.0);
    watch_expect(d, -1, NULL);
    T_OK(d->t_unclear == 0);
    beat_driver_free(d);
}

/* A survivor's comm error while every other rank beats: the peer it waited for, stuck in its
 * own work (beats, no step, blocked in no communication during the wait), is the fault's rank
 * and the survivor is reported_by.  Before, the fault was the survivor's whenever
 * --comm-timeout ended before the hang detector's limit (a hang of rank 2 of tp2 x dp2 was
 * booked on rank 1, with a diagnosis of its node). */
#define STUCK_ERR(g)                                                                               \
    "comm: reduce_scatter #40 (64 x f32) on group 'dp' (2 ranks) timed out after 2.0 s "           \
    "(limit 2.0 s): not arrived: rank 1 (global " #g ", pid 7 alive, heartbeat 0.2 s ago, at "     \
    "#39 of this group); arrived: ranks 0"

/* np ranks at step 3 stalled for 2.5 s, each beating now, rank r blocked in communication
 * from 1.5 s into the stall (and still) where blocked[r], else not. */
static sup_driver *comm_stall(sup_config *c, int np, sup_conn *k, const int *blocked) {
    sup_driver *d = beat_driver(c, np);
    beat_attempt(d, k);
    beat_steps(d, k, 0, 3, 100);
    for (int r = 0; r < np; r++) {
        d->r[r].last_progress -= 2.5;
        beat_send_wait(d, k, r, 3, NAN, "train", "", blocked[r] ? 1.0 : 0);
    }
    return d;
}

static void expect_comm_fault(sup_driver *d, int rank, int reporter, const char *text) {
    T_EQ_INT(d->fault, 1);
    T_OK(!strcmp(d->kind, "comm"));
    T_EQ_INT(d->fault_rank, rank);
    T_EQ_INT(d->fault_reporter, reporter);
    T_STR_CONTAINS(d->detail, text);
}

/* Commits that failed because a writer was slower than --comm-timeout (the persist's
 * collective waited for it and timed out; the next commits were refused in the broken world):
 * the fault is the writer's, the rank the error says did not arrive.  Before, the rank whose
 * beat said it first (rank 2 here, or rank 3 for the limit's fault). */
static void test_ckpt_slow_writer(void) {
    sup_config c;
    sup_conn k[4];
    sup_driver *d = beat_driver(&c, 4);
    beat_attempt(d, k);
    beat_steps(d, k, 0, 5, 100);
    sup_beat b = {.rank = 2,
                  .world = 4,
                  .pid = 1002,
                  .stage = -1,
                  .seq = ++k[2].seq,
                  .step = 5,
                  .step_ms = 100,
                  .loss = NAN,
                  .grad_norm = NAN,
                  .comm_bytes = NAN,
                  .compute_ms = 100,
                  .comm_wait_s = 0,
                  .ckpt_commit = 2,
                  .ckpt_failed = 3};
    snprintf(b.host, sizeof b.host, "elsewhere");
    snprintf(b.phase, sizeof b.phase, "train");
    snprintf(b.ckpt_error, sizeof b.ckpt_error,
             "comm: all_reduce #0 (1 x i32) on group 'ckpt' (4 ranks) refused: world broken by "
             "an earlier failure: comm: all_reduce #13 (1 x i64) on group 'ckpt' (4 ranks) timed "
             "out after 2.0 s (limit 2.0 s): not arrived: rank 1 (global 1, pid 7 alive, "
             "heartbeat 0.2 s ago, at #12 of this group); arrived: ranks 0,2,3");
    sup_on_beat(d, &k[2], &b);
    T_EQ_INT(d->fault, 1);
    T_OK(!strcmp(d->kind, "ckpt_commit"));
    T_EQ_INT(d->fault_rank, 1);
    T_STR_CONTAINS(d->detail, "3 checkpoint(s) in a row failed to commit");
    beat_driver_free(d);
}

static void test_comm_stuck_peer(void) {
    sup_config c;
    sup_conn k[4];
    /* dp2: rank 1 stuck before its reduce-scatter, rank 0's times out */
    sup_driver *d = comm_stall(&c, 2, k, (int[]){1, 0});
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 1, 0, "rank 1 (on elsewhere) beats but made no step for 2.5 s");
    T_STR_CONTAINS(d->detail, "while rank 0 waited for it: comm: reduce_scatter");
    beat_driver_free(d);
    /* both wait (a message lost): no rank to blame but the reporter */
    d = comm_stall(&c, 2, k, (int[]){1, 1});
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 0, -1, "comm: reduce_scatter");
    beat_driver_free(d);
    /* tp2 x dp2, rank 2 stuck: its tp peer 3 waited for it and timed out itself a moment ago
     * (its newest beat says 0, its error on the way) while rank 1's dp op names rank 3 */
    d = comm_stall(&c, 4, k, (int[]){1, 1, 0, 1});
    beat_send_wait(d, k, 3, 3, NAN, "train", "", 0);
    beat_send_wait(d, k, 1, 3, NAN, "error", STUCK_ERR(3), 0);
    expect_comm_fault(d, 2, 1, "rank 2 (on elsewhere) beats but made no step");
    beat_driver_free(d);
    /* a rank that made a step during the wait is not the one waited for */
    d = comm_stall(&c, 2, k, (int[]){1, 0});
    d->r[1].last_progress = ms_now() - 0.2;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 0, -1, "comm: reduce_scatter");
    beat_driver_free(d);
    /* its newest beat 1.3 s ago (the next one overdue, not a beat missed yet): its state in
     * the wait is unknown */
    d = comm_stall(&c, 2, k, (int[]){1, 0});
    d->r[1].last_beat -= 1.3;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 0, -1, "comm: reduce_scatter");
    beat_driver_free(d);
    /* its newest beat 1.1 s ago, before the wait began (1 s ago: its last step's), waiting in
     * nothing and no wait said since (a rank says one within 0.25 s): the stuck one; before,
     * not judged, and the reporter booked */
    d = comm_stall(&c, 2, k, (int[]){1, 0});
    d->r[1].last_beat -= 1.1;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 1, 0, "rank 1 (on elsewhere) beats but made no step for 2.5 s");
    beat_driver_free(d);
    /* ... but not when that beat said it waits (a wait begun before the reporter's) */
    d = comm_stall(&c, 2, k, (int[]){1, 1});
    d->r[1].last_beat -= 1.1, d->r[1].t_blocked -= 1.1, d->r[1].t_wait_from -= 1.1;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 0, -1, "comm: reduce_scatter");
    beat_driver_free(d);
    /* a wait of 1.9 s, the stuck rank's newest beat 1.0 s ago: in the wait, though before its
     * second half (a rank beats once a second); before, not judged, and the reporter booked */
    d = comm_stall(&c, 2, k, (int[]){1, 0});
    d->r[0].t_wait_from -= 0.9;
    d->r[1].last_beat -= 1.0;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 1, 0, "rank 1 (on elsewhere) beats but made no step for 2.5 s");
    beat_driver_free(d);
    /* ... but not one blocked at that beat (it waits too) */
    d = comm_stall(&c, 2, k, (int[]){1, 1});
    d->r[0].t_wait_from -= 0.9;
    d->r[1].last_beat -= 1.0, d->r[1].t_blocked -= 1.0;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 0, -1, "comm: reduce_scatter");
    beat_driver_free(d);
    /* none for 2 s (a beat missed, not yet lost_peer's silence of about two): gone quiet
     * in the wait, SIGSTOPped or cut off; before, a --comm-timeout of 2 s booked the
     * survivor.  Named before a rank stuck in its work, though its last step is newer */
    d = comm_stall(&c, 3, k, (int[]){1, 0, 0});
    d->r[1].last_beat -= 2.0;
    d->r[2].last_progress -= 1;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(7), 0);
    expect_comm_fault(d, 1, 0, "rank 1 (on elsewhere) went silent 2.0 s before rank 0 reported");
    beat_driver_free(d);
    /* quiet before named: rank 1 silent 2 s (stopped), rank 2 named by the error, beating
     * and not blocked at its beat (the tp follower waiting for rank 1 in the batch ring, no
     * beat since it began to wait); before, the named one was booked */
    d = comm_stall(&c, 3, k, (int[]){1, 0, 0});
    d->r[1].last_beat -= 2.0;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(2), 0);
    expect_comm_fault(d, 1, 0, "rank 1 (on elsewhere) went silent 2.0 s before rank 0 reported");
    beat_driver_free(d);
    /* beats without wait times (an older trainer): not judged */
    d = comm_stall(&c, 2, k, (int[]){1, 0});
    d->r[1].comm_wait_s = NAN;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 0, -1, "comm: reduce_scatter");
    beat_driver_free(d);
    /* two ranks fit: the one the error names as not arrived, though the other's step is
     * older; then, named neither, the one without a step the longest */
    d = comm_stall(&c, 3, k, (int[]){1, 0, 0});
    d->r[1].last_progress -= 1;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(2), 0);
    expect_comm_fault(d, 2, 0, "rank 2 (on elsewhere)");
    beat_driver_free(d);
    d = comm_stall(&c, 3, k, (int[]){1, 0, 0});
    d->r[1].last_progress -= 1;
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(12), 0);
    expect_comm_fault(d, 1, 0, "rank 1 (on elsewhere) beats but made no step for 3.5 s");
    beat_driver_free(d);
    /* the error 2.5 s after the reporter's last beat in its wait (it tore down first: a
     * persist in flight, the dumps' grace): the wait is the one its beats said, so the tp
     * peer blocked then (its newest beat 0: timed out itself) is still not the one; before,
     * the wait was the error's 2 s up to its arrival, and rank 3 was named */
    d = comm_stall(&c, 4, k, (int[]){1, 1, 0, 1});
    for (int r = 0; r < 4; r++) {
        sup_rank *s = &d->r[r];
        s->last_beat -= 2.5, s->last_progress -= 2.5;
        if (s->t_blocked > 0) s->t_blocked -= 2.5, s->t_wait_from -= 2.5;
    }
    for (int r = 0; r < 4; r++)
        if (r != 1) beat_send_wait(d, k, r, 3, NAN, "train", "", r == 0 ? 3.5 : 0);
    beat_send_wait(d, k, 1, 3, NAN, "error", STUCK_ERR(3), 0);
    expect_comm_fault(d, 2, 1, "rank 2 (on elsewhere) beats but made no step for 5.0 s");
    beat_driver_free(d);
    /* a reporter whose beats never said it waited: the error's 2 s, up to now */
    d = comm_stall(&c, 2, k, (int[]){0, 0});
    beat_send_wait(d, k, 0, 3, NAN, "error", STUCK_ERR(1), 0);
    expect_comm_fault(d, 1, 0, "rank 1 (on elsewhere) beats but made no step for 2.5 s");
    beat_driver_free(d);
    d = comm_stall(&c, 2, k, (int[]){0, 0});
    beat_send_wait(d, k, 0, 3, NAN, "error", "comm: recv timed out (no time said)", 0);
    expect_comm_fault(d, 0, -1, "no time said");
    beat_driver_free(d);
}

/* `--ctl evict` of an active node while no job runs (the pre-flight check, between
 * attempts, the end) is refused: the eviction rides on the running attempt's fault, which
 * the next attempt's sup_reset_ranks cleared.  Before, the reply said "evicting; the job
 * restarts on a spare" and the job then started on that node. */
static void test_ctl_evict_no_job(void) {
    char dir[] = "/tmp/ms_sup_ctl_XXXXXX";
    T_OK(mkdtemp(dir) != NULL);
    sup_config c;
    sup_driver *d = beat_driver(&c, 2);
    c.nodes = 2, c.spares = 1, c.run_dir = dir;
    char why[1024];
    T_EQ_INT(sup_nodes_init(d->pool, &c, why, sizeof why), 0);
    T_EQ_INT(sup_nodes_load_blocklist(d->pool, why, sizeof why), 0);
    T_EQ_INT(sup_nodes_choose(d->pool), 0);
    snprintf(d->ctl_token, sizeof d->ctl_token, "%s", TOK);
    int sv[2];
    T_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    d->ctl[0] = (sup_ctl_conn){.fd = sv[0], .t_open = ms_now()};
    d->n_ctl = 1;
    T_EQ_INT((int)write(sv[1], EVICT "\n", strlen(EVICT) + 1), (int)strlen(EVICT) + 1);
    sup_serve_for(d, 1000);
    char reply[1024] = "";
    ssize_t got = read(sv[1], reply, sizeof reply - 1);
    T_OK(got > 0);
    reply[got > 0 ? got : 0] = 0;
    T_STR_CONTAINS(reply, "no job is running");
    T_STR_CONTAINS(reply, "\"ok\":false");
    T_EQ_INT(d->fault, 0);
    T_EQ_INT(d->evict_node, -1);
    T_EQ_INT(d->n_ctl, 0); /* answered and closed */
    close(sv[1]);
    sup_nodes_free(d->pool);
    beat_driver_free(d);
    char path[256];
    snprintf(path, sizeof path, "%s/blocklist.json", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    test_ctl();
    test_ctl_client_big();
    test_spike();
    test_interval();
    test_straggler();
    test_nodes();
    test_diag_peers();
    test_diag_reports();
    test_diag_best_of_two();
    test_step_time();
    test_comm_after_gone();
    test_unclear_hang();
    test_comm_stuck_peer();
    test_ckpt_slow_writer();
    test_state_redo_counts();
    test_ctl_evict_no_job();
    return ms_test_summary("test_sup_parts");
}
