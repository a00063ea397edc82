/* test_sup_beat.c - the supervisor's heartbeat parser (sup_beat_parse):
 * a valid beat parses to its values; a wrong token, version, type, range,
 * an unknown or duplicate field, a NUL byte, text after the object, and
 * every truncation of a valid line are rejected; 20000 random mutations of a
 * valid line never crash it (run under ASan/UBSan by `make asan`); a
 * parsed beat is taken on a connection only in sequence, for the rank the
 * connection first spoke for, and not on a second connection of a rank; the
 * heartbeat client's beats parse and carry the step record (label threads:
 * also under TSan). */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/timeutil.h"
#include "check.h"
#include "monitor/heartbeat.h"
#include "supervisor/sup.h"

#define TOK "0123456789abcdef0123456789abcdef"
#define GOOD                                                                                       \
    "{\"v\":1,\"token\":\"" TOK "\",\"rank\":3,\"world\":8,\"pid\":4242,\"host\":\"node7\","       \
    "\"seq\":12,\"step\":57,\"phase\":\"train\",\"step_ms\":512.5,\"loss\":2.5,\"grad_norm\":"     \
    "null,"                                                                                        \
    "\"comm_bytes\":1048576}"

static int parse(const char *s) {
    sup_beat b;
    const char *why = "";
    return sup_beat_parse(s, strlen(s), TOK, 8, &b, &why);
}

/* GOOD with `from` replaced by `to` (first occurrence). */
static int parse_edit(const char *from, const char *to) {
    char buf[2048];
    const char *p = strstr(GOOD, from);
    if (!p) return 99;
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(p - GOOD), GOOD, to, p + strlen(from));
    return parse(buf);
}

static void test_valid(void) {
    sup_beat b;
    const char *why = "";
    T_EQ_INT(sup_beat_parse(GOOD, strlen(GOOD), TOK, 8, &b, &why), 0);
    T_EQ_INT(b.rank, 3);
    T_EQ_INT(b.pid, 4242);
    T_EQ_INT(b.step, 57);
    T_EQ_INT((long long)b.seq, 12);
    T_OK(!strcmp(b.host, "node7") && !strcmp(b.phase, "train"));
    T_NEAR(b.step_ms, 512.5, 0);
    T_OK(isnan(b.grad_norm)); /* null */
    T_EQ_INT(b.stage, -1);    /* not sent */
    T_OK(isnan(b.comm_wait_s));
    T_EQ_INT(b.dumps, -1); /* not sent */
    char staged[sizeof GOOD + 16];
    snprintf(staged, sizeof staged, "%.*s,\"stage\":7}", (int)strlen(GOOD) - 1, GOOD);
    T_EQ_INT(sup_beat_parse(staged, strlen(staged), TOK, 8, &b, &why), 0);
    T_EQ_INT(b.stage, 7);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"stage\":8"), -1); /* not < world */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"stage\":-1"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"stage\":null"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"comm_wait_s\":4.5"), 0);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"comm_wait_s\":-0.1"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"comm_wait_s\":\"1\""), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"dumps\":2"), 0);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"dumps\":-1"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"dumps\":1.5"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"error\":\"disk \\\"full\\\"\""), 0);
    /* the optional fields: node, compute_ms, redone, the checkpoint's */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576",
                        "\"node\":\"node3\",\"compute_ms\":null,\"redone\":2,\"ckpt_commit\":"
                        "56,\"ckpt_failed\":1,\"ckpt_error\":\"No space left on device\""),
             0);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"ckpt_failed\":-1"), -1);
    /* commits that stood with a warning: the count, the last one's step and text, together */
    char warned[sizeof GOOD + 128];
    snprintf(warned, sizeof warned,
             "%.*s,\"ckpt_warned\":2,\"ckpt_warn_step\":16,\"ckpt_warning\":\"fsync directory\"}",
             (int)strlen(GOOD) - 1, GOOD);
    T_EQ_INT(sup_beat_parse(warned, strlen(warned), TOK, 8, &b, &why), 0);
    T_OK(b.ckpt_warned == 2 && b.ckpt_warn_step == 16 &&
         !strcmp(b.ckpt_warning, "fsync directory"));
    T_EQ_INT(parse(GOOD), 0);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"ckpt_warned\":1,\"ckpt_warn_step\":4"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"ckpt_warning\":\"x\""), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576",
                        "\"ckpt_warned\":0,\"ckpt_warn_step\":4,\"ckpt_warning\":\"x\""),
             -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"ckpt_commit\":1.5"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"redone\":\"2\""), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"node\":\"../etc\""), -1);
    /* the loop's start: at most the step (GOOD's is 57) */
    T_EQ_INT(b.start, -1); /* not sent */
    char started[sizeof GOOD + 16];
    snprintf(started, sizeof started, "%.*s,\"start\":50}", (int)strlen(GOOD) - 1, GOOD);
    T_EQ_INT(sup_beat_parse(started, strlen(started), TOK, 8, &b, &why), 0);
    T_EQ_INT(b.start, 50);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"start\":58"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"start\":-1"), -1);
    /* skipped updates: the count with the last such step, together */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"skipped\":2,\"skip_step\":9"), 0);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"skipped\":2"), -1);   /* alone */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"skip_step\":9"), -1); /* alone */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"skipped\":0,\"skip_step\":9"), -1);
    /* where a non-finite gradient was: nan_step with its ranks, in the world */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"nan_step\":5,\"nan_ranks\":[2,7]"), 0);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"nan_step\":5"), -1);    /* alone */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"nan_ranks\":[1]"), -1); /* alone */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"nan_step\":0,\"nan_ranks\":[1]"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"nan_step\":5,\"nan_ranks\":[8]"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"nan_step\":5,\"nan_ranks\":[1.5]"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"nan_step\":5,\"nan_ranks\":[\"1\"]"), -1);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576",
                        "\"nan_step\":5,\"nan_ranks\":[0,1,2,3,4,5,6,7,0]"), /* more than 8 */
             -1);
    /* usage: true or false, on an error beat only */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"usage\":true"), -1); /* phase train */
    char err[sizeof GOOD + 64];
    const char *ph = strstr(GOOD, "\"phase\":\"train\"");
    snprintf(err, sizeof err, "%.*s\"phase\":\"error\",\"usage\":true%s", (int)(ph - GOOD), GOOD,
             ph + strlen("\"phase\":\"train\""));
    T_EQ_INT(sup_beat_parse(err, strlen(err), TOK, 8, &b, &why), 0);
    T_EQ_INT(b.usage, 1);
    memcpy(strstr(err, "true"), "1   ", 4);
    T_EQ_INT(sup_beat_parse(err, strlen(err), TOK, 8, &b, &why), -1); /* not a boolean */
    T_EQ_INT(sup_beat_parse(GOOD, strlen(GOOD), TOK, 8, &b, &why), 0);
    T_EQ_INT(b.usage, 0);
    T_EQ_INT(b.stop_here, 0);
    /* stop_here: true or false, on a stopped beat only */
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"stop_here\":true"), -1); /* phase train */
    char stp[sizeof GOOD + 64];
    snprintf(stp, sizeof stp, "%.*s\"phase\":\"stopped\",\"stop_here\":true%s", (int)(ph - GOOD),
             GOOD, ph + strlen("\"phase\":\"train\""));
    T_EQ_INT(sup_beat_parse(stp, strlen(stp), TOK, 8, &b, &why), 0);
    T_EQ_INT(b.stop_here, 1);
    memcpy(strstr(stp, "true"), "1   ", 4);
    T_EQ_INT(sup_beat_parse(stp, strlen(stp), TOK, 8, &b, &why), -1); /* not a boolean */
}

static void test_rejected(void) {
    T_EQ_INT(parse_edit(TOK, "0123456789abcdef0123456789abcdee"), -1); /* wrong token */
    T_EQ_INT(parse_edit(TOK, "0123456789abcdef"), -1);                 /* a prefix of it */
    /* the token, then an escaped NUL and junk: cJSON's string ends at the NUL, and the
     * comparison passed it */
    T_EQ_INT(parse_edit(TOK, TOK "\\u0000junk"), -1);
    T_EQ_INT(parse_edit("\"host\":\"node7\"", "\"host\":\"node7\\u0000x\""), -1);
    T_EQ_INT(parse_edit("\"v\":1", "\"v\":2"), -1);
    T_EQ_INT(parse_edit("\"rank\":3", "\"rank\":8"), -1); /* out of the world */
    T_EQ_INT(parse_edit("\"rank\":3", "\"rank\":-1"), -1);
    T_EQ_INT(parse_edit("\"rank\":3", "\"rank\":3.5"), -1);
    T_EQ_INT(parse_edit("\"rank\":3", "\"rank\":\"3\""), -1);
    T_EQ_INT(parse_edit("\"world\":8", "\"world\":9"), -1);
    T_EQ_INT(parse_edit("\"phase\":\"train\"", "\"phase\":\"rm -rf\""), -1);
    T_EQ_INT(parse_edit("\"host\":\"node7\"", "\"host\":\"a\\u0001b\""), -1);
    T_EQ_INT(parse_edit("\"loss\":2.5", "\"loss\":\"2.5\""), -1);
    T_EQ_INT(parse_edit("\"seq\":12", "\"seq\":0"), -1);
    T_EQ_INT(parse_edit("\"step\":57", "\"step\":1e300"), -1);
    T_EQ_INT(parse_edit("\"pid\":4242,", ""), -1);                          /* missing */
    T_EQ_INT(parse_edit("\"pid\":4242", "\"pid\":4242,\"cmd\":\"x\""), -1); /* unknown */
    T_EQ_INT(parse_edit("\"pid\":4242", "\"pid\":4242,\"rank\":3"), -1);    /* duplicate */
    T_EQ_INT(parse("[1,2]"), -1);
    T_EQ_INT(parse(GOOD " {}"), -1);
    char nul[sizeof GOOD + 1];
    memcpy(nul, GOOD, sizeof GOOD);
    nul[10] = 0;
    sup_beat b;
    const char *why = "";
    T_EQ_INT(sup_beat_parse(nul, sizeof GOOD - 1, TOK, 8, &b, &why), -1);
    int bad = 0;
    for (size_t n = 0; n < strlen(GOOD); n++) /* every truncation */
        bad += sup_beat_parse(GOOD, n, TOK, 8, &b, &why) == 0;
    T_EQ_INT(bad, 0);
}

/* sup_beat_admit: the driver's per-connection rules (sup_watch.c's
 * read_conn), each with its reason. */
static void test_admit(void) {
    sup_beat b;
    const char *why = "";
    T_EQ_INT(sup_beat_parse(GOOD, strlen(GOOD), TOK, 8, &b, &why), 0); /* rank 3, seq 12 */
    T_OK(sup_beat_admit(&b, -1, 0, 0, 0) == NULL);   /* a new connection's first beat */
    T_OK(sup_beat_admit(&b, 3, 11, 1, 0) == NULL);   /* the next on its own connection */
    T_OK(sup_beat_admit(&b, 3, 1, 1, 0) == NULL);    /* a gap is fine (beats are dropped) */
    const char *r = sup_beat_admit(&b, 3, 12, 1, 0); /* a repeat */
    T_STR_CONTAINS(r, "out of order");
    r = sup_beat_admit(&b, 3, 13, 1, 0); /* older than the last */
    T_STR_CONTAINS(r, "out of order");
    r = sup_beat_admit(&b, -1, 0, 1, 0); /* rank 3 is connected elsewhere */
    T_STR_CONTAINS(r, "a second connection for the rank");
    r = sup_beat_admit(&b, 2, 11, 1, 0); /* the connection spoke for rank 2 */
    T_STR_CONTAINS(r, "another rank on the connection");
    r = sup_beat_admit(&b, 2, 12, 1, 0); /* both: the rank is named first */
    T_STR_CONTAINS(r, "another rank on the connection");
    /* the job's attempt: a rank of another one (an earlier start's, left behind) is refused,
     * whatever its connection; without the field, or a driver that does not know, taken */
    b.attempt = 2;
    T_OK(sup_beat_admit(&b, -1, 0, 0, 2) == NULL);
    T_OK(sup_beat_admit(&b, -1, 0, 0, 0) == NULL);
    r = sup_beat_admit(&b, -1, 0, 0, 3);
    T_STR_CONTAINS(r, "a rank of another attempt of the job");
    b.attempt = 0;
    T_OK(sup_beat_admit(&b, -1, 0, 0, 3) == NULL);
    char with[sizeof GOOD + 16];
    snprintf(with, sizeof with, "%.*s,\"attempt\":4}", (int)strlen(GOOD) - 1, GOOD);
    T_EQ_INT(sup_beat_parse(with, strlen(with), TOK, 8, &b, &why), 0);
    T_EQ_INT(b.attempt, 4);
    T_EQ_INT(parse_edit("\"comm_bytes\":1048576", "\"attempt\":0"), -1);
}

/* --heartbeat HOST:PORT: a port outside 1..65535 is refused (getaddrinfo
 * took 70000 as 4464, and the beats went to whatever listened there). */
static void test_client_addr(void) {
    static const char *const bad[] = {"127.0.0.1:70000",          "127.0.0.1:0",  "127.0.0.1:",
                                      "127.0.0.1:99999999999999", "127.0.0.1:-1", "nohost"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mon_heartbeat *hb = NULL;
        mon_heartbeat_config c = {.addr = bad[i], .token = TOK, .rank = 0, .world = 1};
        T_EQ_INT(mon_heartbeat_open(&hb, &c), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), "expected HOST:PORT (PORT 1..65535)");
        T_OK(hb == NULL);
    }
}

static void test_mutations(void) {
    char buf[sizeof GOOD];
    sup_beat b;
    const char *why = "";
    int parsed = 0;
    for (uint64_t i = 0; i < 20000; i++) {
        memcpy(buf, GOOD, sizeof GOOD);
        int flips = 1 + (int)(ms_rng_u64(99, i, 0) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = ms_rng_u64(99, i, 1 + 2 * (uint64_t)k) % (sizeof GOOD - 1);
            buf[at] = (char)(ms_rng_u64(99, i, 2 + 2 * (uint64_t)k) & 0xff);
        }
        int ok = sup_beat_parse(buf, sizeof GOOD - 1, TOK, 8, &b, &why) == 0;
        parsed += ok;
        if (ok && (b.rank < 0 || b.rank >= 8 || b.step < 0)) T_OK(0); /* a parse is in range */
    }
    T_OK(parsed < 20000); /* most mutations break it; none crashed */
}

/* Read lines from fd until one with phase `want` (or 5 s); returns the
 * number of beats seen, the last one in *b. */
static int read_until(int fd, const char *want, sup_beat *b) {
    static char buf[65536];
    static size_t len;
    int n = 0;
    for (int tries = 0; tries < 250; tries++) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 20) == 1) {
            ssize_t got = recv(fd, buf + len, sizeof buf - len, 0);
            if (got <= 0) return n;
            len += (size_t)got;
        }
        char *nl;
        while ((nl = memchr(buf, '\n', len)) != NULL) {
            const char *why = "";
            int rc = sup_beat_parse(buf, (size_t)(nl - buf), TOK, 2, b, &why);
            T_EQ_INT(rc, 0);
            if (rc) fprintf(stderr, "beat rejected: %s: %.*s\n", why, (int)(nl - buf), buf);
            n++;
            memmove(buf, nl + 1, len - (size_t)(nl - buf) - 1);
            len -= (size_t)(nl - buf) + 1;
            if (rc == 0 && !strcmp(b->phase, want)) return n;
        }
    }
    return n;
}

/* A socket listening on a free loopback port, its "127.0.0.1:PORT" in addr. */
static int listen_loopback(char *addr, size_t n) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    T_OK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0 &&
         getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    snprintf(addr, n, "127.0.0.1:%d", ntohs(sa.sin_port));
    return lfd;
}

/* A client (rank, beat period) connected to a fresh loopback listener
 * (*lfd, its address in addr): the accepted socket, its "start" beat read. */
static double blocked_s(void *ctx) {
    return *(const double *)ctx;
}

static int dumps_answered(void *ctx) {
    (void)ctx;
    return 3; /* rank 1 has answered 3 hang-dump requests */
}

static int open_client(int rank, double period_s, char *addr, size_t n, int *lfd,
                       mon_heartbeat **hb) {
    static const double blocked = 2.25; /* rank 1 has waited in communication for 2.25 s */
    *lfd = listen_loopback(addr, n);
    mon_heartbeat_config c = {.addr = addr,
                              .token = TOK,
                              .rank = rank,
                              .world = 2,
                              .has_stage = rank == 1, /* rank 1 says its pipeline stage */
                              .stage = rank,
                              .comm_blocked_s = rank == 1 ? blocked_s : NULL,
                              .comm_dumps = rank == 1 ? dumps_answered : NULL,
                              .comm_ctx = (void *)&blocked,
                              .period_s = period_s,
                              .attempt = rank == 1 ? 3 : 0}; /* rank 1 says its job's attempt */
    T_EQ_INT(mon_heartbeat_open(hb, &c), MS_OK);
    int fd = accept(*lfd, NULL, NULL);
    T_OK(fd >= 0);
    sup_beat b;
    T_OK(read_until(fd, "start", &b) >= 1);
    return fd;
}

/* The client (monitor/heartbeat.c) against a listening socket: its beats
 * parse, carry the step record, and the last one says why it failed. */
static void test_client(void) {
    char addr[64];
    int lfd;
    mon_heartbeat *hb = NULL;
    int fd = open_client(1, 0.05, addr, sizeof addr, &lfd, &hb);
    sup_beat b;
    mon_sink s = mon_sink_heartbeat(hb);
    mon_step st = {.step = 7,
                   .steps = 10,
                   .loss = 3.25f,
                   .grad_norm = 1.5f,
                   .sec = 0.25,
                   .redone = 1,
                   .nan_ranks = {1},
                   .n_nan_ranks = 1};
    mon_heartbeat_train(hb, 6); /* the loop starts at step 6 (a resumed run) */
    T_EQ_INT(s.on_step(s.ctx, &st), MS_OK);
    for (int i = 0; i < 50 && b.step != 7; i++) /* the state covers both: step 7, start 6 */
        T_OK(read_until(fd, "train", &b) >= 1);
    T_EQ_INT(b.start, 6);
    T_EQ_INT(b.attempt, 3);
    T_EQ_INT(b.redone, 1);
    T_EQ_INT(b.nan_step, 7); /* the step and the rank where the gradient was not finite */
    T_EQ_INT(b.n_nan_ranks, 1);
    T_EQ_INT(b.nan_ranks[0], 1);
    T_EQ_INT(b.rank, 1);
    T_EQ_INT(b.stage, 1);
    T_NEAR(b.comm_wait_s, 2.3, 1e-9); /* sent to 0.1 s */
    T_EQ_INT(b.dumps, 3);
    T_EQ_INT(b.step, 7);
    T_NEAR(b.loss, 3.25, 0);
    T_NEAR(b.step_ms, 250, 1e-9);
    T_EQ_INT(b.pid, getpid());
    T_EQ_INT(b.skipped, 0);
    /* a step redone and then skipped (its redo not finite either): skipped, not redone */
    mon_step sk = {.step = 8, .steps = 10, .sec = 0.25, .redone = 1, .skipped = 1};
    T_EQ_INT(s.on_step(s.ctx, &sk), MS_OK);
    for (int i = 0; i < 50 && b.step != 8; i++) /* past the periodic beats sent before it */
        T_OK(read_until(fd, "train", &b) >= 1);
    T_EQ_INT(b.step, 8);
    T_EQ_INT(b.redone, 1);
    T_EQ_INT(b.skipped, 1);
    T_EQ_INT(b.skip_step, 8);
    T_OK(read_until(fd, "train", &b) >= 1); /* periodic beats go on */
    mon_heartbeat_error(hb, "disk \"full\"\n at step 7", 0);
    mon_heartbeat_close(hb);
    T_OK(read_until(fd, "error", &b) >= 1);
    T_OK(!strcmp(b.phase, "error") && strstr(b.error, "disk \"full\"  at step 7") != NULL);
    T_EQ_INT(b.usage, 0);
    close(fd);
    close(lfd);
    /* a usage error says so: the driver does not restart the job */
    fd = open_client(1, 0.05, addr, sizeof addr, &lfd, &hb);
    mon_heartbeat_error(hb, "--batch 16 is not a multiple of --dp 3", 1);
    mon_heartbeat_close(hb);
    T_OK(read_until(fd, "error", &b) >= 1);
    T_OK(b.usage == 1 && strstr(b.error, "--batch 16") != NULL);
    close(fd);
    close(lfd);
    /* a warned commit, a failed one and an error, each all quotes: escaped they pass the
     * line's bound, which a beat never crosses (before, such a beat was never sent, and the
     * driver heard nothing more): the texts are cut, the rest says what it said */
    fd = open_client(1, 0.05, addr, sizeof addr, &lfd, &hb);
    char quotes[1024];
    memset(quotes, '"', sizeof quotes - 1);
    quotes[sizeof quotes - 1] = 0;
    mon_heartbeat_ckpt(hb, 4, 2, quotes);
    mon_heartbeat_ckpt_warned(hb, 1, 8, quotes);
    mon_heartbeat_error(hb, quotes, 0);
    mon_heartbeat_close(hb);
    T_OK(read_until(fd, "error", &b) >= 1);
    T_OK(!strcmp(b.phase, "error") && b.ckpt_warned == 1 && b.ckpt_warn_step == 8 &&
         b.ckpt_failed == 2 && b.ckpt_commit == 4);
    T_OK(strlen(b.ckpt_warning) == 160 && strlen(b.ckpt_error) == 320 && strlen(b.error) == 640);
    close(fd);
    close(lfd);
    /* a malformed address or token is an error naming it */
    mon_heartbeat_config c = {.addr = "nowhere", .token = TOK, .rank = 1, .world = 2};
    T_OK(mon_heartbeat_open(&hb, &c) == MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "nowhere");
    c.addr = addr, c.token = "not hex!";
    T_OK(mon_heartbeat_open(&hb, &c) == MS_ERR_ARG);
}

/* The time waited in communication as comm_world_blocked_s says it: since *ctx (0: none). */
static double waiting_since(void *ctx) {
    double t = atomic_load((_Atomic double *)ctx); /* set by the test, read by the beat thread */
    return t > 0 ? ms_now() - t : 0;
}

/* A wait in communication that the last beat did not show is beaten once it lasts 0.25 s,
 * not a period later; once per wait (before, a rank that began to wait just after a beat
 * said so a period later: a peer's --comm-timeout of 1 s ran out first, and the supervisor
 * took the waiting rank for the stuck one it waited for). */
static void test_wait_news(void) {
    char addr[64];
    static _Atomic double since = 0;
    int lfd = listen_loopback(addr, sizeof addr);
    mon_heartbeat *hb = NULL;
    mon_heartbeat_config c = {.addr = addr,
                              .token = TOK,
                              .rank = 1,
                              .world = 2,
                              .comm_blocked_s = waiting_since,
                              .comm_ctx = &since,
                              .period_s = 30};
    T_EQ_INT(mon_heartbeat_open(&hb, &c), MS_OK);
    int fd = accept(lfd, NULL, NULL);
    T_OK(fd >= 0);
    sup_beat b;
    T_OK(read_until(fd, "start", &b) >= 1);
    T_NEAR(b.comm_wait_s, 0, 0);
    for (int round = 0; round < 2; round++) { /* a wait, its end, and a second wait */
        double t0 = ms_now();
        atomic_store(&since, t0);
        struct pollfd p = {fd, POLLIN, 0};
        T_EQ_INT(poll(&p, 1, 2000), 1); /* 0.25 s and a slice of 0.1 s: not 30 s */
        T_OK(read_until(fd, "start", &b) >= 1);
        T_OK(ms_now() - t0 >= 0.2 && ms_now() - t0 < 1.5);
        T_OK(b.comm_wait_s >= 0.2 && b.comm_wait_s <= 1.5);
        T_EQ_INT(poll(&p, 1, 600), 0); /* the same wait: said once */
        atomic_store(&since, 0.0);
        T_EQ_INT(poll(&p, 1, 300), 0); /* its end: no news */
    }
    mon_heartbeat_close(hb);
    close(fd);
    close(lfd);
}

/* mon_heartbeat_flush: when it returns, the beat with the latest step is
 * out (before an injected fault ends the process: the driver must know the
 * steps done, or it hands the fault that fired to the next start again). */
static void test_flush(void) {
    char addr[64];
    int lfd;
    mon_heartbeat *hb = NULL;
    int fd = open_client(0, 60, addr, sizeof addr, &lfd, &hb);
    sup_beat b;
    mon_sink s = mon_sink_heartbeat(hb);
    for (int step = 1; step <= 20; step++) {
        mon_step st = {.step = step, .steps = 20, .loss = 3.0f, .grad_norm = 1.0f, .sec = 0.01};
        T_EQ_INT(s.on_step(s.ctx, &st), MS_OK);
        mon_heartbeat_flush(hb, 5.0);
        /* the beat of this step was handed to the kernel (send returned): it
         * arrives even if the process ends now; loopback delivery itself may
         * take a moment under load, so a short wait */
        char buf[65536], want[32];
        snprintf(want, sizeof want, "\"step\":%d,", step);
        ssize_t got = 0;
        buf[0] = 0;
        for (int tries = 0; tries < 100 && !strstr(buf, want); tries++) {
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, 10) != 1) continue;
            ssize_t r = recv(fd, buf + got, sizeof buf - 1 - (size_t)got, MSG_DONTWAIT);
            if (r <= 0) break;
            got += r;
            buf[got] = 0;
        }
        T_OK(got > 0 && strstr(buf, want) != NULL);
        if (!(got > 0 && strstr(buf, want))) fprintf(stderr, "step %d: got '%s'\n", step, buf);
    }
    mon_heartbeat_phase(hb, "stopped"); /* ended before --steps: the driver's own phase */
    mon_heartbeat_close(hb);
    T_OK(read_until(fd, "stopped", &b) >= 1);
    T_OK(!strcmp(b.phase, "stopped"));
    close(fd);
    close(lfd);
}

/* The connection lost (the driver closed it and listens again on the same
 * address: a driver taken over), flushes right after: the client connects
 * again at once, so that the beat of the last step is out when its flush
 * returns.  Before, it waited its 2 s between tries (here: past the whole
 * test), the flush returned with nothing sent, and an injected fault or an
 * error that ended the process then was never known to the driver. */
static void test_flush_reconnects(void) {
    char addr[64];
    int lfd;
    mon_heartbeat *hb = NULL;
    int fd = open_client(0, 60, addr, sizeof addr, &lfd, &hb);
    close(fd);
    mon_sink s = mon_sink_heartbeat(hb);
    for (int step = 1; step <= 3; step++) { /* a send finds the connection gone */
        mon_step st = {.step = step, .steps = 10, .loss = 3.0f, .grad_norm = 1.0f, .sec = 0.01};
        T_EQ_INT(s.on_step(s.ctx, &st), MS_OK);
        mon_heartbeat_flush(hb, 5.0);
        usleep(50 * 1000);
    }
    struct pollfd p = {lfd, POLLIN, 0};
    T_EQ_INT(poll(&p, 1, 500), 1); /* connected again, within a moment */
    fd = p.revents & POLLIN ? accept(lfd, NULL, NULL) : -1;
    T_OK(fd >= 0);
    sup_beat b = {0};
    int got3 = 0;
    for (int k = 0; fd >= 0 && k < 5 && !got3; k++)
        got3 = read_until(fd, "train", &b) >= 1 && b.step == 3;
    T_OK(got3);
    mon_heartbeat_close(hb);
    if (fd >= 0) close(fd);
    close(lfd);
}

/* CPU seconds this process used so far. */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* The driver gone (its sockets closed): the beat thread waits a period
 * between tries, it does not spin (a step's beat left it with nothing sent
 * and its wait returning at once: a core busy, training 4x slower). */
static void test_driver_gone(void) {
    char addr[64];
    int lfd;
    mon_heartbeat *hb = NULL;
    int fd = open_client(0, 0.2, addr, sizeof addr, &lfd, &hb);
    close(fd);
    close(lfd);
    mon_sink s = mon_sink_heartbeat(hb);
    for (int step = 1; step <= 3; step++) { /* the send that finds the driver gone */
        mon_step st = {.step = step, .steps = 10, .loss = 3.0f, .grad_norm = 1.0f, .sec = 0.01};
        T_EQ_INT(s.on_step(s.ctx, &st), MS_OK);
        usleep(100 * 1000);
    }
    mon_step st = {.step = 4, .steps = 10, .loss = 3.0f, .grad_norm = 1.0f, .sec = 0.01};
    T_EQ_INT(s.on_step(s.ctx, &st), MS_OK); /* a beat to send, and nobody to send it to */
    double c0 = cpu_s();
    usleep(1000 * 1000);
    double used = cpu_s() - c0;
    T_OK(used < 0.2); /* a spinning thread takes the whole second */
    if (used >= 0.2) fprintf(stderr, "the beat thread used %.2f s of CPU in 1 s\n", used);
    mon_heartbeat_close(hb);
}

int main(void) {
    test_client();
    test_driver_gone();
    test_flush();
    test_wait_news();
    test_flush_reconnects();
    test_valid();
    test_rejected();
    test_admit();
    test_client_addr();
    test_mutations();
    return ms_test_summary("test_sup_beat");
}
