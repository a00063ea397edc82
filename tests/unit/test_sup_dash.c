/* test_sup_dash.c - the dashboard's parts: the model fed line by line
 * (curves, a redone step range, the thinning of a long run, val and
 * checkpoint lines, the rank and node states from the events, the heat map
 * and its stragglers, replies bounded), the incremental file reader (cut
 * lines, over-long lines, a replaced file), the compute rows the driver
 * writes, and the server itself: the token (401 with an empty body), the
 * fixed paths (404, nothing from the file system), the methods, while
 * another thread pushes the live view (run under ThreadSanitizer by `make
 * tsan`); replies that stay UTF-8, the events where `launch --events` put
 * them, slow clients past the connection bound, a push that never waits for
 * the files, a moved run directory, the heat map made once per change. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/timeutil.h"
#include "check.h"
#include "supervisor/sup_dash_internal.h"
#include "supervisor/sup_internal.h"
#include "tmpdir.h"

static void feed(void (*fn)(dash_model *, const char *, size_t), dash_model *m, const char *s) {
    fn(m, s, strlen(s));
}

static void event_line_of(dash_model *m, const char *s, size_t n) {
    T_OK(dash_model_event_line(m, s, n) >= 1);
}

static cJSON *item(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static const char *state_of(const cJSON *status, int rank) {
    const cJSON *r = cJSON_GetArrayItem(item(status, "ranks"), rank);
    const cJSON *s = item(r, "state");
    return cJSON_IsString(s) ? s->valuestring : "?";
}

static void test_metrics(void) {
    dash_model *m = dash_model_new();
    feed(dash_model_metrics_line, m,
         "{\"type\":\"config\",\"version\":1,\"options\":{\"model\":\"d6\",\"steps\":300},"
         "\"layout\":{\"world\":8,\"dp\":2,\"tp\":2,\"pp\":2}}");
    /* the validation before training, at step 0 */
    feed(dash_model_metrics_line, m, "{\"step\":0,\"val_loss\":5.5,\"val_ms\":3,\"wall\":99}");
    char line[256];
    for (int s = 1; s <= 20; s++) {
        snprintf(
            line, sizeof line,
            "{\"step\":%d,\"loss\":%g,\"lr\":0.001,\"grad_norm\":null,\"ms\":10,\"tok_s\":1000,"
            "\"mfu\":0.5,\"wall\":%d,\"tokens\":%d}",
            s, 10.0 / s, 100 + s, 64 * s);
        feed(dash_model_metrics_line, m, line);
    }
    feed(dash_model_metrics_line, m, "{\"step\":10,\"val_loss\":2.5,\"val_ms\":3,\"wall\":111}");
    feed(dash_model_metrics_line, m,
         "{\"type\":\"ckpt\",\"step\":10,\"bytes\":1000,\"stall_ms\":4,\"persist_ms\":50,\"wall\":"
         "112}");
    feed(dash_model_metrics_line, m, "not json");
    feed(dash_model_metrics_line, m, "{\"what\":1}");
    T_EQ_INT(dash_model_bad_lines(m), 2);
    cJSON *r = dash_model_metrics(m, 15, 15, 100);
    T_EQ_INT(cJSON_GetArraySize(item(r, "steps")), 5);
    T_EQ_INT(cJSON_GetArrayItem(cJSON_GetArrayItem(item(r, "steps"), 0), 0)->valueint, 16);
    T_OK(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(item(r, "steps"), 0), 4)));
    T_EQ_INT(item(r, "last_step")->valueint, 20);
    T_OK(cJSON_IsFalse(item(r, "more")));
    long epoch = (long)item(r, "epoch")->valuedouble;
    cJSON_Delete(r);
    r = dash_model_metrics(m, 0, 0, 7); /* bounded: the rest follows with since=7 */
    T_EQ_INT(cJSON_GetArraySize(item(r, "steps")), 7);
    T_OK(cJSON_IsTrue(item(r, "more")));
    T_EQ_INT(cJSON_GetArraySize(item(r, "val")), 1);
    cJSON_Delete(r);
    r = dash_model_metrics(m, -1, -1, 7); /* from the first: step 0's validation too */
    T_EQ_INT(cJSON_GetArraySize(item(r, "steps")), 7);
    T_EQ_INT(cJSON_GetArraySize(item(r, "val")), 2);
    T_EQ_INT(cJSON_GetArrayItem(cJSON_GetArrayItem(item(r, "val"), 0), 0)->valueint, 0);
    cJSON_Delete(r);
    /* the validation points by their own cursor: a page that polled between step 10's train
     * and validation lines asks from step 20 on, and still gets step 10's validation */
    r = dash_model_metrics(m, 20, 9, 100);
    T_EQ_INT(cJSON_GetArraySize(item(r, "steps")), 0);
    T_EQ_INT(cJSON_GetArraySize(item(r, "val")), 1);
    T_EQ_INT(cJSON_GetArrayItem(cJSON_GetArrayItem(item(r, "val"), 0), 0)->valueint, 10);
    cJSON_Delete(r);
    r = dash_model_metrics(m, 20, 10, 100);
    T_EQ_INT(cJSON_GetArraySize(item(r, "val")), 0);
    cJSON_Delete(r);
    /* the same steps again (redone after a restart): the newer replace them */
    feed(dash_model_metrics_line, m, "{\"step\":18,\"loss\":7,\"wall\":200}");
    r = dash_model_metrics(m, 0, 0, 100);
    T_EQ_INT(item(r, "last_step")->valueint, 18);
    T_EQ_INT(cJSON_GetArraySize(item(r, "steps")), 18);
    T_OK((long)item(r, "epoch")->valuedouble != epoch);
    cJSON_Delete(r);
    cJSON *c = dash_model_checkpoints(m);
    const cJSON *c0 = cJSON_GetArrayItem(item(c, "checkpoints"), 0);
    T_EQ_INT(item(c0, "step")->valueint, 10);
    T_NEAR(item(c0, "persist_ms")->valuedouble, 50, 0);
    cJSON_Delete(c);
    cJSON *st = dash_model_status(m, NULL, "run", 1000);
    T_EQ_INT(item(item(st, "layout"), "pp")->valueint, 2);
    T_EQ_INT(item(item(st, "job"), "steps")->valueint, 300);
    T_OK(!strcmp(item(item(st, "job"), "model")->valuestring, "d6"));
    T_OK(cJSON_IsNull(item(item(st, "job"), "params")));
    T_NEAR(item(item(st, "last"), "loss")->valuedouble, 7, 0);
    cJSON_Delete(st);
    /* dimensions given beside the preset, or an --init-from file's shape: said, with the
     * parameters (the header read "d6" for a run of 2 layers of width 32) */
    static const char *const cfgs[][2] = {
        {"{\"model\":\"d6\",\"layers\":2,\"dim\":32,\"heads\":0,\"vocab\":256}",
         "d6 (2 layers, dim 32, vocab 256)"},
        {"{\"init-from\":\"/w/gpt2.safetensors\",\"layers\":0}", "gpt2.safetensors"},
        {"{\"model\":\"d12\",\"heads\":6}", "d12 (6 heads)"},
        {"{\"model\":\"d12\\n\",\"layers\":-3}", "d12?"}};
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
        char line[256];
        snprintf(line, sizeof line, "{\"type\":\"config\",\"params\":1634720,\"options\":%s}",
                 cfgs[i][0]);
        feed(dash_model_metrics_line, m, line);
        st = dash_model_status(m, NULL, "run", 1000);
        T_OK(!strcmp(item(item(st, "job"), "model")->valuestring, cfgs[i][1]));
        T_NEAR(item(item(st, "job"), "params")->valuedouble, 1634720, 0);
        cJSON_Delete(st);
    }
    /* the file replaced: everything forgotten, a new epoch */
    dash_model_metrics_reset(m);
    r = dash_model_metrics(m, 0, 0, 100);
    T_EQ_INT(cJSON_GetArraySize(item(r, "steps")), 0);
    cJSON_Delete(r);
    /* a long run thins out but keeps its newest point and its order; points
     * were dropped, so the epoch changes (clients fetch the thinned curve,
     * else a page open for a long run keeps every point it was sent) */
    for (int s = 1; s <= DASH_MAX_POINTS; s++) {
        snprintf(line, sizeof line, "{\"step\":%d,\"loss\":1,\"wall\":%d}", s, s);
        feed(dash_model_metrics_line, m, line);
    }
    r = dash_model_metrics(m, 0, 0, 1);
    epoch = (long)item(r, "epoch")->valuedouble;
    cJSON_Delete(r);
    for (int s = DASH_MAX_POINTS + 1; s <= DASH_MAX_POINTS + 10; s++) {
        snprintf(line, sizeof line, "{\"step\":%d,\"loss\":1,\"wall\":%d}", s, s);
        feed(dash_model_metrics_line, m, line);
    }
    r = dash_model_metrics(m, 0, 0, DASH_MAX_POINTS);
    T_OK((long)item(r, "epoch")->valuedouble != epoch);
    int n = cJSON_GetArraySize(item(r, "steps")), sorted = 1, prev = 0;
    for (const cJSON *p = item(r, "steps")->child; p; p = p->next) {
        sorted &= p->child->valueint > prev;
        prev = p->child->valueint;
    }
    T_OK(n <= DASH_MAX_POINTS && n > DASH_MAX_POINTS / 2);
    T_OK(sorted);
    T_EQ_INT(prev, DASH_MAX_POINTS + 10);
    cJSON_Delete(r);
    dash_model_free(m);
}

/* Events of about 900 KB each (a long detail): a reply holds at most
 * DASH_EVENTS_REPLY_BYTES of them and says "more", and paging reaches every one.  Before,
 * 500 such events made a 450 MB reply, over the server's limit: "reply too large". */
/* Events from..to-1 into m, each a note whose detail is `big` bytes. */
static void feed_big_events(dash_model *m, int from, int to, size_t big) {
    char *line = malloc(big + 128);
    T_OK(line != NULL);
    for (int i = from; line && i < to; i++) {
        int n = snprintf(line, 128, "{\"time\":%d,\"t\":%d,\"event\":\"note\",\"detail\":\"", i, i);
        memset(line + n, 'x', big);
        memcpy(line + n + big, "\"}", 3);
        dash_model_event_line(m, line, strlen(line));
    }
    free(line);
}

static void test_events_big(void) {
    dash_model *m = dash_model_new();
    size_t big = 900u << 10;
    feed_big_events(m, 0, 30, big);
    long since = -1;
    int got = 0, replies = 0;
    for (int more = 1; more && replies < 40; replies++) {
        cJSON *r = dash_model_events(m, since, DASH_EVENTS_REPLY);
        int n = cJSON_GetArraySize(item(r, "events"));
        T_OK(n >= 1 && (size_t)n * big <= DASH_EVENTS_REPLY_BYTES + big);
        got += n;
        since = (long)item(r, "next")->valuedouble;
        more = cJSON_IsTrue(item(r, "more"));
        cJSON_Delete(r);
    }
    T_EQ_INT(got, 30);
    T_OK(replies > 1);
    /* 100 more: the model keeps at most DASH_EVENTS_BYTES of them, the newest (it kept
     * DASH_MAX_EVENTS lines of up to DASH_LINE_MAX each: 20 GiB) */
    feed_big_events(m, 30, 130, big);
    since = -1, got = 0, replies = 0;
    long first = -1, last = -1;
    for (int more = 1; more && replies < 100; replies++) {
        cJSON *r = dash_model_events(m, since, DASH_EVENTS_REPLY);
        for (const cJSON *e = item(r, "events")->child; e; e = e->next, got++) {
            if (first < 0) first = (long)item(e, "seq")->valuedouble;
            last = (long)item(e, "seq")->valuedouble;
        }
        since = (long)item(r, "next")->valuedouble;
        more = cJSON_IsTrue(item(r, "more"));
        cJSON_Delete(r);
    }
    T_OK(got > 10 && (size_t)got * big <= DASH_EVENTS_BYTES);
    T_EQ_INT(last, 129);
    T_EQ_INT(first, 130 - got);
    dash_model_free(m);
    /* a line with its own "seq" is sent with the server's, once */
    m = dash_model_new();
    feed(event_line_of, m, "{\"time\":1,\"event\":\"anomaly\",\"seq\":99,\"kind\":\"x\"}");
    cJSON *r = dash_model_events(m, -1, DASH_EVENTS_REPLY);
    char *text = cJSON_PrintUnformatted(item(r, "events"));
    T_OK(text && strstr(text, "\"seq\":0") && !strstr(text, "99"));
    if (text && !strstr(text, "\"seq\":0")) fprintf(stderr, "events: %s\n", text);
    free(text);
    cJSON_Delete(r);
    dash_model_free(m);
}

static void test_events(void) {
    dash_model *m = dash_model_new();
    feed(dash_model_metrics_line, m,
         "{\"type\":\"config\",\"layout\":{\"world\":4,\"dp\":2,\"tp\":2,\"pp\":1}}");
    feed(event_line_of, m,
         "{\"time\":100,\"t\":0,\"event\":\"job_start\",\"np\":4,\"pool\":\"n0,n1,n2\","
         "\"metrics\":\"/x/m.jsonl\",\"straggler_score\":0.7}");
    feed(event_line_of, m,
         "{\"time\":101,\"t\":1,\"event\":\"launch\",\"attempt\":1,\"nodes\":\"n0,n1\"}");
    T_OK(!strcmp(dash_model_metrics_path(m), "/x/m.jsonl"));
    char line[256];
    for (int r = 0; r < 4; r++) {
        snprintf(line, sizeof line,
                 "{\"time\":102,\"t\":2,\"event\":\"rank_up\",\"rank\":%d,\"node\":\"n%d\","
                 "\"host\":\"h%d\",\"pid\":%d}",
                 r, r / 2, r / 2, 10 + r);
        feed(event_line_of, m, line);
    }
    cJSON *st = dash_model_status(m, NULL, "run", 103);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "running"));
    T_OK(!strcmp(state_of(st, 3), "running"));
    T_OK(!strcmp(item(cJSON_GetArrayItem(item(st, "ranks"), 3), "node")->valuestring, "n1"));
    T_OK(!strcmp(item(cJSON_GetArrayItem(item(st, "nodes"), 2), "state")->valuestring, "spare"));
    cJSON_Delete(st);
    /* a live view refines a running rank, never a dead one */
    sup_dash_rank lr[4] = {{SUP_DASH_RUNNING, 5, 0.1, 10},
                           {SUP_DASH_SLOW, 5, 0.1, 30},
                           {SUP_DASH_RUNNING, 5, 0.1, 10},
                           {SUP_DASH_HUNG, 4, 9, NAN}};
    sup_dash_live live = {.attempt = 1, .best_step = 5, .ettr = 0.5, .n_ranks = 4, .ranks = lr};
    st = dash_model_status(m, &live, "run", 103);
    T_OK(!strcmp(state_of(st, 1), "slow"));
    T_OK(!strcmp(state_of(st, 3), "hung"));
    T_OK(cJSON_IsTrue(item(st, "live")));
    T_NEAR(item(item(st, "job"), "ettr")->valuedouble, 0.5, 0);
    cJSON_Delete(st);
    feed(event_line_of, m,
         "{\"time\":110,\"t\":10,\"event\":\"fault_detected\",\"kind\":\"crash\",\"rank\":3,"
         "\"node\":\"n1\",\"step\":7,\"action\":\"restart\"}");
    feed(event_line_of, m, "{\"time\":111,\"t\":11,\"event\":\"job_stopped\"}");
    feed(event_line_of, m,
         "{\"time\":112,\"t\":12,\"event\":\"evict\",\"node\":\"n1\",\"by\":\"diag\",\"reason\":"
         "\"gemm\"}");
    st = dash_model_status(m, &live, "run", 113);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "recovering"));
    T_OK(!strcmp(state_of(st, 3), "evicted"));
    T_OK(!strcmp(state_of(st, 0), "stopped"));
    const cJSON *r3 = cJSON_GetArrayItem(item(st, "ranks"), 3);
    T_EQ_INT(item(r3, "faults")->valueint, 1);
    T_OK(!strcmp(item(r3, "last_fault")->valuestring, "crash at step 7"));
    T_OK(!strcmp(item(cJSON_GetArrayItem(item(st, "nodes"), 1), "state")->valuestring, "evicted"));
    cJSON_Delete(st);
    feed(event_line_of, m,
         "{\"time\":113,\"t\":13,\"event\":\"launch\",\"attempt\":2,\"nodes\":\"n0,n2\"}");
    st = dash_model_status(m, NULL, "run", 114);
    T_OK(!strcmp(item(cJSON_GetArrayItem(item(st, "ranks"), 3), "node")->valuestring, "n2"));
    T_OK(!strcmp(state_of(st, 3), "starting"));
    T_EQ_INT(item(cJSON_GetArrayItem(item(st, "ranks"), 3), "faults")->valueint, 1); /* kept */
    cJSON_Delete(st);
    feed(event_line_of, m,
         "{\"time\":120,\"t\":20,\"event\":\"summary\",\"outcome\":\"done\",\"ettr\":0.8,\"steps\":"
         "40,\"wall_s\":20}");
    feed(event_line_of, m, "{\"time\":120,\"t\":20,\"event\":\"job_done\"}");
    feed(event_line_of, m, "{\"no_event\":1}");
    st = dash_model_status(m, NULL, "run", 121);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "done"));
    T_NEAR(item(item(st, "job"), "ettr")->valuedouble, 0.8, 0);
    T_EQ_INT(item(item(st, "job"), "step")->valueint, 40);
    T_OK(!strcmp(state_of(st, 2), "done"));
    cJSON_Delete(st);
    /* the log: by sequence number, bounded */
    cJSON *e = dash_model_events(m, -1, 3);
    T_EQ_INT(cJSON_GetArraySize(item(e, "events")), 3);
    T_EQ_INT(item(e, "next")->valueint, 2);
    T_OK(cJSON_IsTrue(item(e, "more")));
    cJSON_Delete(e);
    e = dash_model_events(m, 2, 1000);
    const cJSON *first = cJSON_GetArrayItem(item(e, "events"), 0);
    T_EQ_INT(item(first, "seq")->valueint, 3);
    T_OK(!strcmp(item(first, "event")->valuestring, "rank_up"));
    T_OK(cJSON_IsFalse(item(e, "more")));
    T_EQ_INT(cJSON_GetArraySize(item(e, "events")), 12 - 3);
    cJSON_Delete(e);
    T_EQ_INT(dash_model_bad_lines(m), 1);
    /* more events than kept: the oldest go */
    for (int i = 0; i < DASH_MAX_EVENTS + 5; i++)
        feed(event_line_of, m, "{\"time\":1,\"event\":\"ctl\"}");
    e = dash_model_events(m, -1, 1);
    T_EQ_INT(item(cJSON_GetArrayItem(item(e, "events"), 0), "seq")->valueint, 17);
    cJSON_Delete(e);
    dash_model_free(m);
}

/* A fault whose action is stop (the policy gave up when it was seen): the
 * job reads failing, also beside a live view that says it recovers, and
 * its rank dead, until job_failed. */
static void test_fault_stop(void) {
    dash_model *m = dash_model_new();
    static const char *const lines[] = {
        "{\"time\":1,\"event\":\"job_start\",\"np\":2,\"pool\":\"n0,n1\"}",
        "{\"time\":2,\"event\":\"launch\",\"attempt\":1,\"nodes\":\"n0,n1\"}",
        "{\"time\":3,\"event\":\"fault_detected\",\"kind\":\"crash\",\"rank\":1,\"step\":7,"
        "\"action\":\"stop\"}"};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
        feed(event_line_of, m, lines[i]);
    sup_dash_live live = {.attempt = 1, .best_step = 7, .recovering = 1};
    cJSON *st = dash_model_status(m, &live, "run", 4);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "failing"));
    T_OK(!strcmp(state_of(st, 1), "dead"));
    T_EQ_INT(item(item(st, "job"), "faults")->valueint, 1);
    cJSON_Delete(st);
    feed(event_line_of, m, "{\"time\":5,\"event\":\"job_failed\",\"exit\":3}");
    st = dash_model_status(m, NULL, "run", 6);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "failed"));
    cJSON_Delete(st);
    dash_model_free(m);
}

/* A second job_start in the run directory: a new job (the first one ended)
 * has its own fault and restart counts; a driver that took over its
 * predecessor's job (driver_resumed, then job_start) goes on counting. */
static void test_second_job(void) {
    dash_model *m = dash_model_new();
    static const char *const first[] = {
        "{\"time\":1,\"event\":\"job_start\",\"np\":2,\"pool\":\"n0,n1\"}",
        "{\"time\":2,\"event\":\"launch\",\"attempt\":1,\"nodes\":\"n0,n1\"}",
        "{\"time\":3,\"event\":\"fault_detected\",\"kind\":\"crash\",\"rank\":1,\"step\":7,"
        "\"action\":\"restart\"}",
        "{\"time\":4,\"event\":\"restart\",\"restart\":1}",
        "{\"time\":5,\"event\":\"launch\",\"attempt\":2,\"nodes\":\"n0,n1\"}",
        "{\"time\":6,\"event\":\"job_done\"}"};
    for (size_t i = 0; i < sizeof first / sizeof *first; i++)
        feed(event_line_of, m, first[i]);
    cJSON *st = dash_model_status(m, NULL, "run", 7);
    T_EQ_INT(item(item(st, "job"), "faults")->valueint, 1);
    T_EQ_INT(item(item(st, "job"), "restarts")->valueint, 1);
    cJSON_Delete(st);
    /* the driver killed and started again: the same job goes on */
    feed(event_line_of, m, "{\"time\":8,\"event\":\"driver_resumed\",\"restarts\":1}");
    feed(event_line_of, m, "{\"time\":8,\"event\":\"job_start\",\"np\":2}");
    st = dash_model_status(m, NULL, "run", 9);
    T_EQ_INT(item(item(st, "job"), "faults")->valueint, 1);
    T_EQ_INT(item(item(st, "job"), "restarts")->valueint, 1);
    T_EQ_INT(item(cJSON_GetArrayItem(item(st, "ranks"), 1), "faults")->valueint, 1);
    /* and its start and wall time are the job's, not the new driver's (the
     * wall time read 1 s, from the takeover) */
    T_EQ_INT((int)item(item(st, "job"), "started")->valuedouble, 1);
    T_EQ_INT((int)item(item(st, "job"), "wall_s")->valuedouble, 8);
    cJSON_Delete(st);
    /* the live view: a rank's step -1 (not started yet) is the events' one,
     * 0 or more the driver's */
    feed(dash_model_compute_line, m, "{\"step\":7,\"compute_ms\":[5,6]}"); /* heard before */
    sup_dash_rank lr[2] = {{SUP_DASH_RUNNING, 0, 0.1, NAN}, {SUP_DASH_STARTING, -1, NAN, NAN}};
    sup_dash_live lv = {.n_ranks = 2, .ranks = lr, .ettr = NAN};
    st = dash_model_status(m, &lv, "run", 9);
    T_EQ_INT(item(cJSON_GetArrayItem(item(st, "ranks"), 0), "step")->valueint, 0);
    T_EQ_INT(item(cJSON_GetArrayItem(item(st, "ranks"), 1), "step")->valueint, 7);
    cJSON_Delete(st);
    /* from the files alone (the driver gone, the ranks training on): a live
     * rank's step is at least the metrics' last, not the driver's last row */
    feed(dash_model_metrics_line, m, "{\"step\":12,\"loss\":3,\"wall\":30}");
    st = dash_model_status(m, NULL, "run", 31);
    T_EQ_INT(item(cJSON_GetArrayItem(item(st, "ranks"), 1), "step")->valueint, 12);
    cJSON_Delete(st);
    /* a new job: counted from 0, no fault left on rank 1 */
    feed(event_line_of, m, "{\"time\":20,\"event\":\"job_start\",\"np\":2}");
    feed(event_line_of, m, "{\"time\":21,\"event\":\"launch\",\"attempt\":1,\"nodes\":\"n0,n1\"}");
    st = dash_model_status(m, NULL, "run", 22);
    T_EQ_INT(item(item(st, "job"), "faults")->valueint, 0);
    T_EQ_INT(item(item(st, "job"), "restarts")->valueint, 0);
    T_EQ_INT(item(item(st, "job"), "attempt")->valueint, 1);
    const cJSON *r1 = cJSON_GetArrayItem(item(st, "ranks"), 1);
    T_EQ_INT(item(r1, "faults")->valueint, 0);
    T_OK(!cJSON_IsString(item(r1, "last_fault")) || !*item(r1, "last_fault")->valuestring);
    cJSON_Delete(st);
    dash_model_free(m);
}

/* A run without a supervisor (metrics, no events): its state from the
 * metrics: starting before a step, running while its newest step is recent
 * (10 of its steps, at least 5 minutes), stopped after, done at --steps
 * (before: "starting" for good). */
static void test_plain_state(void) {
    dash_model *m = dash_model_new();
    feed(dash_model_metrics_line, m, "{\"type\":\"config\",\"wall\":90,\"options\":{\"steps\":3}}");
    cJSON *st = dash_model_status(m, NULL, "run", 100);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "starting"));
    cJSON_Delete(st);
    feed(dash_model_metrics_line, m, "{\"step\":1,\"loss\":5,\"ms\":40000,\"wall\":100}");
    static const struct {
        double now;
        const char *want;
    } at[] = {{150, "running"}, {399, "running"}, {401, "running"}, {501, "stopped"}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) { /* 10 x 40 s steps: 400 s */
        st = dash_model_status(m, NULL, "run", at[i].now);
        T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, at[i].want));
        cJSON_Delete(st);
    }
    feed(dash_model_metrics_line, m, "{\"step\":2,\"loss\":5,\"ms\":10,\"wall\":600}");
    st = dash_model_status(m, NULL, "run", 899);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "running"));
    cJSON_Delete(st);
    st = dash_model_status(m, NULL, "run", 901);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "stopped"));
    cJSON_Delete(st);
    feed(dash_model_metrics_line, m, "{\"step\":3,\"loss\":5,\"ms\":10,\"wall\":610}");
    st = dash_model_status(m, NULL, "run", 5000);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "done"));
    /* its start: the config line's time; its time ends with its last step (it had none: the
     * wall-time axis was empty) */
    T_NEAR(item(item(st, "job"), "started")->valuedouble, 90, 0);
    T_NEAR(item(item(st, "job"), "wall_s")->valuedouble, 520, 1e-9);
    cJSON_Delete(st);
    cJSON *mt = dash_model_metrics(m, 0, 0, 100);
    T_NEAR(item(mt, "t0")->valuedouble, 90, 0);
    cJSON_Delete(mt);
    /* the file replaced by a new run's: that run's start (the earlier one's stayed) */
    dash_model_metrics_reset(m);
    feed(dash_model_metrics_line, m,
         "{\"type\":\"config\",\"wall\":700,\"options\":{\"steps\":3}}");
    mt = dash_model_metrics(m, 0, 0, 100);
    T_NEAR(item(mt, "t0")->valuedouble, 700, 0);
    cJSON_Delete(mt);
    feed(dash_model_metrics_line, m, "{\"step\":3,\"loss\":5,\"ms\":10,\"wall\":710}");
    /* with events (a supervised run), the events say it: a job_start alone is starting */
    feed(event_line_of, m, "{\"time\":1,\"event\":\"job_start\",\"np\":1}");
    st = dash_model_status(m, NULL, "run", 5000);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "starting"));
    cJSON_Delete(st);
    dash_model_free(m);
    /* from the files alone, a restart's launch and rank_up leave a job recovering until its
     * `recovered` (they said "starting", then "running", while the driver's page said
     * recovering) */
    m = dash_model_new();
    static const char *const ev[] = {
        "{\"time\":1,\"event\":\"job_start\",\"np\":1}",
        "{\"time\":2,\"event\":\"launch\",\"attempt\":1,\"nodes\":\"n0\"}",
        "{\"time\":3,\"event\":\"rank_up\",\"rank\":0}",
        "{\"time\":4,\"event\":\"fault_detected\",\"kind\":\"crash\",\"rank\":0,"
        "\"action\":\"restart\"}",
        "{\"time\":5,\"event\":\"launch\",\"attempt\":2,\"nodes\":\"n0\"}",
        "{\"time\":6,\"event\":\"rank_up\",\"rank\":0}",
        "{\"time\":7,\"event\":\"recovered\",\"step\":9}"};
    static const char *const want[] = {"starting",   "starting",   "running", "recovering",
                                       "recovering", "recovering", "running"};
    for (int i = 0; i < 7; i++) {
        feed(event_line_of, m, ev[i]);
        st = dash_model_status(m, NULL, "run", 8);
        T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, want[i]));
        cJSON_Delete(st);
    }
    dash_model_free(m);
}

/* Before the metrics' config line (or without one) the layout is not
 * known: no coordinates (they said pp 0, 1, 2: as many pipeline stages as
 * ranks), and the heat map's labels have none; then the layout's. */
static void test_no_layout(void) {
    dash_model *m = dash_model_new();
    feed(event_line_of, m, "{\"time\":1,\"event\":\"job_start\",\"np\":3}");
    cJSON *st = dash_model_status(m, NULL, "run", 2);
    const cJSON *r1 = cJSON_GetArrayItem(item(st, "ranks"), 1);
    T_OK(cJSON_IsNull(item(r1, "dp")) && cJSON_IsNull(item(r1, "pp")) &&
         cJSON_IsNull(item(r1, "tp")));
    cJSON_Delete(st);
    cJSON *h = dash_model_heatmap(m, DASH_HEAT_COLS);
    T_OK(!strcmp(cJSON_GetArrayItem(item(h, "labels"), 1)->valuestring, "r1 "));
    cJSON_Delete(h);
    feed(dash_model_metrics_line, m,
         "{\"type\":\"config\",\"layout\":{\"world\":3,\"dp\":3,\"tp\":1,\"pp\":1}}");
    st = dash_model_status(m, NULL, "run", 2);
    r1 = cJSON_GetArrayItem(item(st, "ranks"), 1);
    T_EQ_INT(item(r1, "dp")->valueint, 1);
    T_EQ_INT(item(r1, "pp")->valueint, 0);
    cJSON_Delete(st);
    /* a layout whose product is past any run (dp x tp = 2^32 wrapped to 0 and the server
     * divided by it: SIGFPE) is no layout: one line of ranks */
    feed(dash_model_metrics_line, m,
         "{\"type\":\"config\",\"layout\":{\"world\":3,\"dp\":65536,\"tp\":65536,\"pp\":1}}");
    st = dash_model_status(m, NULL, "run", 2);
    r1 = cJSON_GetArrayItem(item(st, "ranks"), 1);
    T_OK(cJSON_IsNull(item(r1, "dp")) && cJSON_IsNull(item(r1, "pp")) &&
         cJSON_IsNull(item(r1, "tp")));
    cJSON_Delete(st);
    h = dash_model_heatmap(m, DASH_HEAT_COLS);
    T_OK(h != NULL);
    cJSON_Delete(h);
    dash_model_free(m);
}

/* A model whose metrics said a layout of dp x pp ranks (tp 1) and whose job started with
 * them all: the heat map's set-up. */
static dash_model *layout_job(int dp, int pp) {
    char cfg[160], start[96];
    snprintf(cfg, sizeof cfg,
             "{\"type\":\"config\",\"layout\":{\"world\":%d,\"dp\":%d,\"tp\":1,\"pp\":%d}}",
             dp * pp, dp, pp);
    snprintf(start, sizeof start, "{\"time\":1,\"event\":\"job_start\",\"np\":%d}", dp * pp);
    dash_model *m = dash_model_new();
    feed(dash_model_metrics_line, m, cfg);
    feed(event_line_of, m, start);
    return m;
}

static void test_heatmap(void) {
    dash_model *m = layout_job(2, 2);
    char line[256];
    for (int s = 1; s <= 300; s++) { /* rank 2 at half speed */
        snprintf(line, sizeof line, "{\"step\":%d,\"attempt\":1,\"compute_ms\":[10,11,%d,%s]}", s,
                 20, s % 7 ? "10.5" : "null");
        feed(dash_model_compute_line, m, line);
    }
    feed(dash_model_compute_line, m, "{\"step\":5,\"compute_ms\":[1,2]}"); /* wrong width */
    T_EQ_INT(dash_model_bad_lines(m), 1);
    cJSON *h = dash_model_heatmap(m, DASH_HEAT_COLS);
    T_EQ_INT(cJSON_GetArraySize(item(h, "steps")), DASH_HEAT_COLS);
    T_EQ_INT(cJSON_GetArrayItem(item(h, "steps"), DASH_HEAT_COLS - 1)->valueint, 300);
    /* rows by (pp, dp, tp): ranks 0, 1 are pp 0 */
    T_EQ_INT(cJSON_GetArrayItem(item(h, "ranks"), 2)->valueint, 2);
    T_EQ_INT(cJSON_GetArraySize(item(h, "stragglers")), 1);
    T_EQ_INT(cJSON_GetArrayItem(item(h, "stragglers"), 0)->valueint, 2);
    /* its colour: the step's compute time over its stage's lower median (ranks 2 and 3: 20
     * and 10.5, the faster; 20 alone where rank 3 has no value); the healthy peer reads 1x
     * (over their mean both read as far off, 1.31x and 0.69x) */
    const cJSON *row2 = cJSON_GetArrayItem(item(h, "ratio"), 2);
    double hi = 0;
    for (const cJSON *v = row2->child; v; v = v->next)
        if (cJSON_IsNumber(v) && v->valuedouble > hi) hi = v->valuedouble;
    T_NEAR(hi, 20 / 10.5, 0.01);
    const cJSON *q3 = cJSON_GetArrayItem(cJSON_GetArrayItem(item(h, "ratio"), 3), 0);
    T_OK(cJSON_IsNumber(q3) && fabs(q3->valuedouble - 1) < 1e-9);
    int nulls = 0;
    for (const cJSON *v = cJSON_GetArrayItem(item(h, "ratio"), 3)->child; v; v = v->next)
        nulls += cJSON_IsNull(v);
    T_OK(nulls > 20);
    cJSON_Delete(h);
    /* a redone step's newer row replaces the older */
    feed(dash_model_compute_line, m, "{\"step\":300,\"attempt\":2,\"compute_ms\":[10,10,10,10]}");
    h = dash_model_heatmap(m, 1);
    T_NEAR(cJSON_GetArrayItem(cJSON_GetArrayItem(item(h, "ratio"), 2), 0)->valuedouble, 1, 1e-9);
    cJSON_Delete(h);
    dash_model_free(m);
    /* pp 3 x dp 2 whose last stage (ranks 4, 5: the head and the loss too)
     * takes 3x the others' time on every step: a healthy layout, no
     * straggler, every rank's colour near its stage's median */
    m = layout_job(2, 3);
    for (int s = 1; s <= 40; s++) {
        snprintf(line, sizeof line,
                 "{\"step\":%d,\"attempt\":1,\"compute_ms\":[10,10.4,10.2,10.1,30,31]}", s);
        feed(dash_model_compute_line, m, line);
    }
    h = dash_model_heatmap(m, DASH_HEAT_COLS);
    T_EQ_INT(cJSON_GetArraySize(item(h, "stragglers")), 0);
    for (int r = 0; r < 6; r++) {
        const cJSON *q = cJSON_GetArrayItem(cJSON_GetArrayItem(item(h, "ratio"), r), 0);
        T_OK(cJSON_IsNumber(q) && q->valuedouble > 0.95 && q->valuedouble < 1.05);
        T_OK(!strcmp(cJSON_GetArrayItem(item(h, "against"), r)->valuestring, "stage"));
    }
    cJSON_Delete(h);
    dash_model_free(m);
    /* pp 3 alone (a stage of one rank each): rank 1 at 3x from step 11 on shows, against its
     * own early speed (the lower quartile of its first 16 times), also once every step shown
     * is a slowed one (over the step's own time every cell read 1x; over the steps shown
     * alone, such a rank read 1x again) */
    m = layout_job(1, 3);
    for (int s = 1; s <= 40; s++) {
        snprintf(line, sizeof line, "{\"step\":%d,\"attempt\":1,\"compute_ms\":[10,%d,12]}", s,
                 s > 10 ? 30 : 10);
        feed(dash_model_compute_line, m, line);
    }
    h = dash_model_heatmap(m, DASH_HEAT_COLS);
    const cJSON *r1 = cJSON_GetArrayItem(item(h, "ratio"), 1);
    T_NEAR(cJSON_GetArrayItem(r1, 0)->valuedouble, 1, 1e-9);
    T_NEAR(cJSON_GetArrayItem(r1, cJSON_GetArraySize(r1) - 1)->valuedouble, 3, 1e-9);
    T_NEAR(cJSON_GetArrayItem(cJSON_GetArrayItem(item(h, "ratio"), 2), 39)->valuedouble, 1, 1e-9);
    /* each row says its reference (the tooltip read "x median" for these too) */
    T_OK(!strcmp(cJSON_GetArrayItem(item(h, "against"), 1)->valuestring, "own"));
    cJSON_Delete(h);
    for (int s = 41; s <= 40 + 2 * DASH_HEAT_COLS; s++) { /* the slowed steps fill the map */
        snprintf(line, sizeof line, "{\"step\":%d,\"attempt\":1,\"compute_ms\":[10,30,12]}", s);
        feed(dash_model_compute_line, m, line);
    }
    h = dash_model_heatmap(m, DASH_HEAT_COLS);
    r1 = cJSON_GetArrayItem(item(h, "ratio"), 1);
    T_NEAR(cJSON_GetArrayItem(r1, 0)->valuedouble, 3, 1e-9);
    cJSON_Delete(h);
    dash_model_free(m);
    /* a job of one rank: over its own early speed too (every cell read 1x against itself) */
    m = layout_job(1, 1);
    for (int s = 1; s <= 40; s++) {
        snprintf(line, sizeof line, "{\"step\":%d,\"attempt\":1,\"compute_ms\":[%d]}", s,
                 s > 30 ? 20 : 10);
        feed(dash_model_compute_line, m, line);
    }
    h = dash_model_heatmap(m, DASH_HEAT_COLS);
    r1 = cJSON_GetArrayItem(item(h, "ratio"), 0);
    T_NEAR(cJSON_GetArrayItem(r1, 0)->valuedouble, 1, 1e-9);
    T_NEAR(cJSON_GetArrayItem(r1, 39)->valuedouble, 2, 1e-9);
    T_OK(!strcmp(cJSON_GetArrayItem(item(h, "against"), 0)->valuestring, "own"));
    cJSON_Delete(h);
    dash_model_free(m);
}

typedef struct {
    char lines[16][64];
    int n, replaced;
} sink;

static int on_line(void *arg, const char *l, size_t n) {
    sink *s = arg;
    if (s->n < 16) snprintf(s->lines[s->n++], 64, "%.*s", (int)n, l);
    return 0;
}

/* The first line of each read only: a line function's budget ends the read. */
static int one_line(void *arg, const char *l, size_t n) {
    on_line(arg, l, n);
    return 1;
}

static void on_replaced(void *arg) {
    ((sink *)arg)->replaced++;
}

static void append(const char *path, const char *text, const char *mode) {
    FILE *f = fopen(path, mode);
    fputs(text, f);
    fclose(f);
}

static void test_tail(void) {
    const char *p = tpath("grow.jsonl");
    dash_tail t;
    sink s = {0};
    dash_tail_init(&t, p);
    T_EQ_INT(dash_tail_read(&t, 1 << 20, on_line, &s, on_replaced), 0); /* missing: nothing */
    append(p, "one\ntw", "w");
    dash_tail_read(&t, 1 << 20, on_line, &s, on_replaced);
    T_EQ_INT(s.n, 1);
    append(p, "o\nthree\n", "a");
    dash_tail_read(&t, 1 << 20, on_line, &s, on_replaced);
    T_EQ_INT(s.n, 3);
    T_OK(!strcmp(s.lines[1], "two") && !strcmp(s.lines[2], "three"));
    /* an over-long line is skipped, the next one is read */
    FILE *f = fopen(p, "a");
    for (int i = 0; i < DASH_LINE_MAX + 10; i++)
        fputc('x', f);
    fputs("\nafter\n", f);
    fclose(f);
    for (int i = 0; i < 40; i++) /* small reads: the long line spans many */
        dash_tail_read(&t, 65536, on_line, &s, on_replaced);
    T_EQ_INT(s.n, 4);
    T_OK(!strcmp(s.lines[3], "after"));
    /* replaced atomically (another inode): from its start */
    const char *q = tpath("grow.tmp");
    append(q, "new\n", "w");
    rename(q, p);
    T_EQ_INT(dash_tail_read(&t, 1 << 20, on_line, &s, on_replaced), 1);
    T_EQ_INT(s.replaced, 1);
    T_OK(!strcmp(s.lines[4], "new"));
    dash_tail_free(&t);
    /* rotated (compute.jsonl renamed .1, a new one started): the rest of
     * the old file, its cut last line too, before the new file's lines */
    const char *r = tpath("rot.jsonl"), *r1 = tpath("rot.jsonl.1");
    sink u = {0};
    dash_tail_init(&t, r);
    append(r, "a\nb", "w");
    dash_tail_read(&t, 1 << 20, on_line, &u, NULL);
    append(r, "c\nd\n", "a"); /* written, then rotated before the next read */
    rename(r, r1);
    append(r, "e\n", "w");
    T_EQ_INT(dash_tail_read(&t, 1 << 20, on_line, &u, NULL), 1);
    T_EQ_INT(u.n, 4);
    T_OK(u.n == 4 && !strcmp(u.lines[0], "a") && !strcmp(u.lines[1], "bc") &&
         !strcmp(u.lines[2], "d") && !strcmp(u.lines[3], "e"));
    dash_tail_free(&t);
    /* a FIFO in the file's place: refused at once (its open blocked the
     * server's thread, and the stop that joins it, for ever) */
    const char *fifo = tpath("fifo.jsonl");
    T_EQ_INT(mkfifo(fifo, 0600), 0);
    dash_tail_init(&t, fifo);
    alarm(10); /* a hang ends the test */
    T_EQ_INT(dash_tail_read(&t, 1 << 20, on_line, &s, on_replaced), -1);
    alarm(0);
    T_EQ_INT(s.n, 5);
    dash_tail_free(&t);
}

static int compute_line_of(void *m, const char *l, size_t n) {
    dash_model_compute_line(m, l, n);
    return 0;
}

/* A read ended by its line function goes on after that line the next time, whole lines only
 * (the events' work budget per refresh). */
static void test_tail_stop(void) {
    const char *p = tpath("stop.jsonl");
    dash_tail t;
    sink s = {0};
    append(p, "a1\nb22\nc333\n", "w");
    dash_tail_init(&t, p);
    for (int i = 0; i < 5; i++)
        dash_tail_read(&t, 1 << 20, one_line, &s, NULL);
    T_EQ_INT(s.n, 3);
    T_OK(!strcmp(s.lines[0], "a1") && !strcmp(s.lines[1], "b22") && !strcmp(s.lines[2], "c333"));
    dash_tail_free(&t);
}

/* Events of a hostile run directory: a launch whose node list is far longer than the job
 * (one pass, names past np not read), control characters in a host (printed as '?', not
 * \u00XX), a repeated "seq" (the server's only), and the work an event reports (its ranks). */
static void test_events_hostile(void) {
    dash_model *m = dash_model_new();
    T_EQ_INT(dash_model_event_line(m, "{\"time\":1,\"event\":\"job_start\",\"np\":4}",
                                   strlen("{\"time\":1,\"event\":\"job_start\",\"np\":4}")) >= 5,
             1);
    size_t big = 400000;
    char *line = malloc(big * 2 + 128);
    T_OK(line != NULL);
    if (!line) return;
    int n = snprintf(line, 128, "{\"time\":2,\"event\":\"launch\",\"attempt\":1,\"nodes\":\"");
    for (size_t i = 0; i < big; i++)
        line[n++] = i % 2 ? ',' : (char)('a' + (i / 2) % 26);
    memcpy(line + n, "x\"}", 4);
    long work = dash_model_event_line(m, line, strlen(line));
    T_OK(work >= 5);
    free(line);
    feed(event_line_of, m,
         "{\"time\":3,\"event\":\"rank_up\",\"rank\":3,\"host\":\"h\\u0001\\u0002x\"}");
    feed(event_line_of, m, "{\"time\":4,\"event\":\"note\",\"seq\":1,\"seq\":2}");
    cJSON *st = dash_model_status(m, NULL, "run", 5);
    cJSON *r0 = cJSON_GetArrayItem(item(st, "ranks"), 0),
          *r3 = cJSON_GetArrayItem(item(st, "ranks"), 3);
    T_OK(r0 && !strcmp(item(r0, "node")->valuestring, "a")); /* ranks 0..3: a, b, c, d */
    T_OK(r3 && !strcmp(item(r3, "node")->valuestring, "d"));
    T_OK(r3 && !strcmp(item(r3, "host")->valuestring, "h??x"));
    cJSON_Delete(st);
    cJSON *ev = dash_model_events(m, -1, DASH_EVENTS_REPLY);
    cJSON *last =
        ev ? cJSON_GetArrayItem(item(ev, "events"), cJSON_GetArraySize(item(ev, "events")) - 1)
           : NULL;
    int seqs = 0;
    for (cJSON *c = last ? last->child : NULL; c; c = c->next)
        seqs += !strcmp(c->string, "seq");
    T_EQ_INT(seqs, 1);
    cJSON_Delete(ev);
    dash_model_free(m);
}

static void test_heatlog(void) {
    const char *p = tpath("compute.jsonl");
    sup_heatlog h;
    char why[256];
    sup_writer *w = sup_writer_start(why, sizeof why);
    T_OK(w != NULL);
    T_EQ_INT(sup_heatlog_open(&h, w, p, 3, 0, why, sizeof why), 0);
    sup_heatlog_feed(&h, 1, 0, 1, 5);
    sup_heatlog_feed(&h, 1, 1, 1, 6);
    sup_heatlog_feed(&h, 1, 2, 1, 7); /* complete: written */
    sup_heatlog_feed(&h, 1, 0, 2, 5); /* rank 1 and 2 never report step 2 */
    for (int s = 3; s <= 12; s++)
        for (int r = 0; r < 3; r++)
            sup_heatlog_feed(&h, 1, r, s, 1);
    sup_heatlog_feed(&h, 2, 0, 11, 2); /* a new attempt flushes the old rows */
    sup_heatlog_close(&h);
    T_EQ_INT(sup_writer_stop(w, 10), 0); /* the rows on disk */
    dash_model *m = dash_model_new();
    feed(event_line_of, m, "{\"time\":1,\"event\":\"job_start\",\"np\":3}");
    dash_tail t;
    dash_tail_init(&t, p);
    dash_tail_read(&t, 1 << 20, compute_line_of, m, NULL);
    dash_tail_free(&t);
    T_EQ_INT(dash_model_bad_lines(m), 0);
    cJSON *hm = dash_model_heatmap(m, 100);
    T_EQ_INT(cJSON_GetArraySize(item(hm, "steps")), 12);
    const cJSON *r1 = cJSON_GetArrayItem(item(hm, "compute_ms"), 1);
    T_NEAR(cJSON_GetArrayItem(r1, 0)->valuedouble, 6, 0);
    T_OK(cJSON_IsNull(cJSON_GetArrayItem(r1, 1))); /* step 2: incomplete, written anyway */
    const cJSON *r0 = cJSON_GetArrayItem(item(hm, "compute_ms"), 0);
    T_NEAR(cJSON_GetArrayItem(r0, 10)->valuedouble, 2, 0); /* attempt 2's step 11 */
    cJSON_Delete(hm);
    dash_model_free(m);
}

/* The driver's writer thread, stalled by a disk that takes no write (its
 * temp file is a FIFO nobody reads, so its open blocks): queueing lines
 * does not wait for it, a save waited for times out, a bounded file's lines
 * are dropped and counted (the others never); once the disk takes writes
 * again every line is written, in order, and the newest state wins. */
static void test_writer(void) {
    char why[256], line[64], tmp[600], *text = NULL;
    size_t len = 0;
    const char *a = tpath("w_events.jsonl"), *b = tpath("w_rows.jsonl"), *st = tpath("w.json");
    sup_writer *w = sup_writer_start(why, sizeof why);
    T_OK(w != NULL);
    int ka = sup_writer_open(w, a, 0, why, sizeof why), kb = sup_writer_open(w, b, 100, why, 256);
    T_OK(ka >= 0 && kb >= 0 && ka != kb);
    T_EQ_INT(sup_writer_open(w, tpath("no/such/dir/x"), 0, why, sizeof why), -1);
    T_OK(strstr(why, "no/such/dir/x") != NULL);
    snprintf(tmp, sizeof tmp, "%s.tmp", st);
    T_EQ_INT(mkfifo(tmp, 0600), 0);
    unsigned long g1 = sup_writer_replace(w, st, strdup("{\"n\":1}\n"));
    T_EQ_INT(sup_writer_wait(w, g1, 0.3), -1); /* stalled in its open */
    double t0 = ms_now();
    int kept = 0;
    for (int i = 0; i < 2000; i++) {
        int n = snprintf(line, sizeof line, "{\"i\":%d}", i);
        T_EQ_INT(sup_writer_line(w, ka, line, (size_t)n), 0);
        kept += sup_writer_line(w, kb, line, (size_t)n) == 0;
    }
    T_OK(ms_now() - t0 < 1.0);          /* nothing waited for the disk */
    T_OK(kept >= 1 && kept <= 100 / 8); /* 100 bytes may wait, 8 a line or more */
    T_EQ_INT((int)sup_writer_dropped(w, kb), 2000 - kept);
    T_EQ_INT((int)sup_writer_dropped(w, ka), 0);
    int rd = open(tmp, O_RDONLY | O_NONBLOCK); /* the disk takes writes again */
    T_OK(rd >= 0);
    T_EQ_INT(sup_writer_wait(w, g1, 10), 0);
    char got[64] = "";
    T_OK(read(rd, got, sizeof got - 1) > 0);
    close(rd);
    T_OK(!strcmp(got, "{\"n\":1}\n"));
    unsigned long g2 = sup_writer_replace(w, st, strdup("{\"n\":2}\n"));
    T_OK(g2 > g1);
    T_EQ_INT(sup_writer_stop(w, 10), 0); /* writes what is queued */
    T_EQ_INT(ms_file_read_max(a, 1 << 20, &text, &len), MS_OK);
    int i = 0, bad = 0;
    for (char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL, i++)
        bad += atoi(p + 5) != i;
    free(text);
    T_EQ_INT(i, 2000); /* every line, in order */
    T_EQ_INT(bad, 0);
    T_EQ_INT(ms_file_read_max(b, 1 << 20, &text, &len), MS_OK);
    int lines = 0;
    for (size_t k = 0; k < len; k++)
        lines += text[k] == '\n';
    free(text);
    T_EQ_INT(lines, kept);
    T_EQ_INT(ms_file_read_max(st, 100, &text, &len), MS_OK);
    T_OK(!strcmp(text, "{\"n\":2}\n"));
    free(text);
}

/* Lines of the file at path (0 if it cannot be read); *first: the number in
 * the first one ({"i":N}), *whole: 1 if it ends at a line's end. */
static int count_lines(const char *path, int *first, int *whole) {
    char *text = NULL;
    size_t len = 0;
    if (ms_file_read_max(path, 1 << 20, &text, &len) != MS_OK) return 0;
    int lines = 0;
    for (size_t k = 0; k < len; k++)
        lines += text[k] == '\n';
    *first = len > 5 ? atoi(text + 5) : -1;
    *whole = len > 0 && text[len - 1] == '\n';
    free(text);
    return lines;
}

/* A file given a rotation size: past it, renamed PATH.1 (the older .1
 * replaced) and started again, each at a line's end; the newest lines are
 * all there, in order, in PATH.1 then PATH.  A size of 0 never rotates. */
static void test_writer_rotate(void) {
    char why[256], line[64], old[600];
    const char *a = tpath("rot.jsonl"), *b = tpath("norot.jsonl");
    snprintf(old, sizeof old, "%s.1", a);
    sup_writer *w = sup_writer_start(why, sizeof why);
    T_OK(w != NULL);
    int ka = sup_writer_open(w, a, 0, why, sizeof why), kb = sup_writer_open(w, b, 0, why, 256);
    sup_writer_rotate(w, ka, 1000);
    sup_writer_rotate(w, kb, 0);
    int n_lines = 0;
    for (int i = 0; i < 500; i++) { /* 9-10 bytes a line: about 4.7 kB */
        int n = snprintf(line, sizeof line, "{\"i\":%d}", i);
        T_EQ_INT(sup_writer_line(w, ka, line, (size_t)n), 0);
        T_EQ_INT(sup_writer_line(w, kb, line, (size_t)n), 0);
        n_lines++;
        if (i % 50 == 49) usleep(20000); /* batches: the writer takes what is queued */
    }
    T_EQ_INT(sup_writer_stop(w, 10), 0);
    int f1 = -1, w1 = 0, f0 = -1, w0 = 0, fb = -1, wb = 0;
    int l1 = count_lines(old, &f1, &w1), l0 = count_lines(a, &f0, &w0);
    T_OK(l1 > 0 && w1);                    /* rotated, at a line's end */
    T_OK(f0 == f1 + l1 && f0 + l0 == 500); /* .1 then the file: the newest lines, in order */
    T_OK(f1 > 0);                          /* the first .1 was replaced by a later one */
    T_OK(l0 == 0 || w0);
    T_EQ_INT(count_lines(b, &fb, &wb), n_lines); /* never rotated */
    T_OK(fb == 0 && access(tpath("norot.jsonl.1"), F_OK) != 0);
}

/* ---- the server -------------------------------------------------------------- */

/* One request (raw HTTP/1.0); the status code, the body into body[n]. */
static char reply_raw[1 << 20]; /* the last reply, its headers too */

static int http(const char *addr, const char *req, char *body, size_t n) {
    char host[64];
    snprintf(host, sizeof host, "%s", addr);
    char *colon = strrchr(host, ':');
    *colon = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    inet_pton(AF_INET, host, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 10}; /* a server that does not answer fails, not hangs */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) return close(fd), -1;
    if (write(fd, req, strlen(req)) < 0) return close(fd), -1;
    char *buf = reply_raw;
    size_t len = 0;
    ssize_t got;
    while (len < sizeof reply_raw - 1 &&
           (got = read(fd, buf + len, sizeof reply_raw - 1 - len)) > 0)
        len += (size_t)got;
    buf[len] = 0;
    close(fd);
    int code = -1;
    sscanf(buf, "HTTP/1.%*d %d", &code);
    const char *b = strstr(buf, "\r\n\r\n");
    snprintf(body, n, "%s", b ? b + 4 : "");
    return code;
}

static int get(const char *addr, const char *path, const char *extra, char *body, size_t n) {
    char req[2048];
    snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n%s\r\n", path, extra ? extra : "");
    return http(addr, req, body, n);
}

typedef struct {
    sup_dash *d;
    atomic_int stop;
} pusher;

static void *push_loop(void *arg) {
    pusher *p = arg;
    sup_dash_rank r[2] = {{SUP_DASH_RUNNING, 0, 0.1, 1}, {SUP_DASH_SLOW, 0, 0.2, 2}};
    for (int i = 0; !atomic_load(&p->stop); i++) {
        r[0].step = r[1].step = i;
        sup_dash_live l = {.attempt = 1, .best_step = i, .n_ranks = 2, .ranks = r};
        sup_dash_push(p->d, &l);
        usleep(1000);
    }
    return NULL;
}

static void test_server(void) {
    append(tpath("events.jsonl"),
           "{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":2,\"pool\":\"node0\"}\n", "w");
    /* bytes that are not UTF-8 (a rank's error line may hold any): the
     * reply stays JSON, each such byte a U+FFFD */
    append(tpath("events.jsonl"),
           "{\"time\":2,\"t\":1,\"event\":\"ctl\",\"why\":\"bad \xff \xc0\xaf \xed\xa0\x80 ok "
           "\xe2\x82\xac \xe2\x82\"}\n",
           "a");
    sup_dash *d = NULL;
    char why[256], body[1 << 16], path[512];
    sup_dash_config c = {tmpdir, NULL, 0, 1, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    const char *addr = sup_dash_addr(d), *tok = sup_dash_token(d);
    T_OK(!strncmp(addr, "127.0.0.1:", 10));
    T_OK(strstr(sup_dash_url(d), tok) != NULL);
    pusher p;
    p.d = d;
    atomic_init(&p.stop, 0);
    pthread_t th;
    pthread_create(&th, NULL, push_loop, &p);
    /* no token, a wrong one, one of the wrong length: 401 and nothing else */
    T_EQ_INT(get(addr, "/api/status", NULL, body, sizeof body), 401);
    T_OK(strstr(reply_raw, "\r\nWWW-Authenticate: Bearer") != NULL); /* RFC 7235: every 401 */
    T_OK(!*body);
    T_EQ_INT(get(addr, "/?token=0123456789abcdef0123456789abcdef", NULL, body, sizeof body), 401);
    T_EQ_INT(get(addr, "/?token=abc", NULL, body, sizeof body), 401);
    T_EQ_INT(get(addr, "/../../etc/passwd", NULL, body, sizeof body), 401);
    /* with it */
    snprintf(path, sizeof path, "/api/status?token=%s", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    cJSON *st = cJSON_Parse(body);
    T_OK(cJSON_IsTrue(item(st, "live")));
    T_EQ_INT(cJSON_GetArraySize(item(st, "ranks")), 2);
    cJSON_Delete(st);
    char auth[128];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", tok);
    T_EQ_INT(get(addr, "/api/events?since=-1", auth, body, sizeof body), 200);
    T_OK(strstr(body, "\"job_start\"") != NULL);
    T_OK(
        strstr(body,
               "\"why\":\"bad \xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd "
               "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd ok \xe2\x82\xac \xef\xbf\xbd\xef\xbf\xbd\"") !=
        NULL);
    T_EQ_INT(get(addr, "/", auth, body, sizeof body), 200);
    T_OK(strstr(body, "{{token}}") == NULL); /* the page has the token filled in */
    T_EQ_INT(get(addr, "/static/chart.js", auth, body, sizeof body), 200);
    /* nothing but the table: no file is ever opened for a request */
    static const char *const bad[] = {"/../../../etc/passwd",
                                      "/static/../../etc/passwd",
                                      "/etc/passwd",
                                      "//etc/passwd",
                                      "/%2e%2e/etc/passwd",
                                      "/static/",
                                      "/api/",
                                      "/api/status/../metrics",
                                      "/events.jsonl",
                                      "/api/../events.jsonl"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int code = get(addr, bad[i], auth, body, sizeof body);
        T_EQ_INT(code, 404);
        T_OK(!strstr(body, "root:") && !strstr(body, "job_start"));
    }
    snprintf(path, sizeof path, "/api/metrics?since=x&token=%s", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 400);
    char req[256];
    snprintf(req, sizeof req, "POST /api/status?token=%s HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc",
             tok);
    T_EQ_INT(http(addr, req, body, sizeof body), 405);
    /* a request line and headers beyond the bound: refused, the server lives on */
    char *big = malloc(200000);
    snprintf(big, 200000, "GET /api/status?token=%s HTTP/1.0\r\nX-Big: ", tok);
    size_t L = strlen(big);
    memset(big + L, 'a', 150000);
    strcpy(big + L + 150000, "\r\n\r\n");
    int code = http(addr, big, body, sizeof body);
    T_OK(code == 431 || code == 413 || code == 414 || code == -1);
    free(big);
    snprintf(path, sizeof path, "/api/heatmap?token=%s", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    /* the scheme's name in any case (RFC 7235) */
    snprintf(auth, sizeof auth, "Authorization: bEARER %s\r\n", tok);
    T_EQ_INT(get(addr, "/api/status", auth, body, sizeof body), 200);
    /* a %00 ends no path or token early: "/api/status%00x" is no path */
    snprintf(path, sizeof path, "/api/status%%00x?token=%s", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 404);
    snprintf(path, sizeof path, "/api/status?token=%s%%00", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 401);
    /* HTTP/1.1: two requests on one connection, both answered (the first
     * reply closed it: a polling page opened a connection a request) */
    char two[512];
    snprintf(two, sizeof two,
             "GET /api/status?token=%s HTTP/1.1\r\nHost: x\r\n\r\n"
             "GET /api/checkpoints?token=%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
             tok, tok);
    T_EQ_INT(http(addr, two, body, sizeof body), 200);
    T_OK(strstr(body, "HTTP/1.1 200") != NULL && strstr(body, "\"checkpoints\"") != NULL);
    atomic_store(&p.stop, 1);
    pthread_join(th, NULL);
    sup_dash_stop(d);
}

typedef struct {
    sup_dash *d;
    double linger_s, took_s;
} finisher;

static void *finish_thread(void *arg) {
    finisher *f = arg;
    double t0 = ms_now();
    sup_dash_finish(f->d, f->linger_s);
    f->took_s = ms_now() - t0;
    return NULL;
}

/* The driver's end: the live view is dropped (the status is the files': the
 * job's end), and a page that was polling gets to read the status and the
 * events once more before the server goes; with no page, no wait. */
static void test_finish(void) {
    append(tpath("events.jsonl"),
           "{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":1,\"pool\":\"node0\"}\n"
           "{\"time\":5,\"t\":4,\"event\":\"job_done\"}\n",
           "w");
    char why[256], body[1 << 16], path[512];
    sup_dash_config c = {tmpdir, NULL, 0, 1, NULL};
    sup_dash *d = NULL;
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    finisher f = {d, 30, -1};
    /* a request without the token is no page: the end is not kept waiting for one (it was,
     * 5 s: a stranger changed what the driver does) */
    T_EQ_INT(get(sup_dash_addr(d), "/api/status", NULL, body, sizeof body), 401);
    finish_thread(&f); /* nobody asked anything: at once */
    T_OK(f.took_s >= 0 && f.took_s < 1);
    sup_dash_stop(d);
    d = NULL;
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    const char *addr = sup_dash_addr(d), *tok = sup_dash_token(d);
    sup_dash_rank r = {SUP_DASH_RUNNING, 3, 0.1, 1};
    sup_dash_live l = {.attempt = 1, .best_step = 3, .n_ranks = 1, .ranks = &r, .ettr = NAN};
    sup_dash_push(d, &l);
    snprintf(path, sizeof path, "/api/status?token=%s", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    T_OK(strstr(body, "\"live\":true") != NULL);
    pthread_t th;
    f = (finisher){d, 30, -1};
    pthread_create(&th, NULL, finish_thread, &f);
    usleep(100000);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    T_OK(strstr(body, "\"live\":false") != NULL && strstr(body, "\"state\":\"done\"") != NULL);
    T_OK(strstr(body, "\"closing\":true") != NULL); /* the page reads the rest, then stops */
    static const char *const rest[] = {"events", "metrics", "heatmap", "checkpoints"};
    for (int i = 0; i < 4; i++) { /* a read begun before the page knew: not its last */
        snprintf(path, sizeof path, "/api/%s?token=%s", rest[i], tok);
        T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    }
    usleep(300000);
    T_EQ_INT(pthread_tryjoin_np(th, NULL), EBUSY); /* still serving: no final read yet */
    snprintf(path, sizeof path, "/api/heatmap?final=2&token=%s", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 400);
    for (int i = 0; i < 4; i++) { /* the page's last reads */
        snprintf(path, sizeof path, "/api/%s?final=1&token=%s", rest[i], tok);
        T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    }
    pthread_join(th, NULL);
    T_OK(f.took_s > 0.3 && f.took_s < 10); /* once all five were read, not the whole 30 s */
    sup_dash_stop(d);
    /* status and events alone (a script, a page of before): the linger's bound */
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    addr = sup_dash_addr(d), tok = sup_dash_token(d);
    sup_dash_push(d, &l);
    snprintf(path, sizeof path, "/api/status?token=%s", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    T_OK(strstr(body, "\"closing\":false") != NULL);
    f = (finisher){d, 1.0, -1};
    pthread_create(&th, NULL, finish_thread, &f);
    usleep(100000);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    snprintf(path, sizeof path, "/api/events?final=1&token=%s", tok);
    T_EQ_INT(get(addr, path, NULL, body, sizeof body), 200);
    pthread_join(th, NULL);
    T_OK(f.took_s >= 0.9 && f.took_s < 10);
    sup_dash_stop(d);
}

/* Connections that never finish their request (slowloris: a header line
 * now and then), more than the server's 64: a real request is still
 * answered, at once (it was locked out until they went away). */
static void test_slow_clients(void) {
    sup_dash *d = NULL;
    char why[256], body[1 << 16], path[512], host[64];
    sup_dash_config c = {tmpdir, NULL, 0, 0, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(host, sizeof host, "%s", sup_dash_addr(d));
    *strrchr(host, ':') = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(strrchr(sup_dash_addr(d), ':') + 1))};
    inet_pton(AF_INET, host, &sa.sin_addr);
    enum { N = 80 };
    static const char slow[] = "GET /api/status HTTP/1.1\r\nHost: x\r\n";
    int fds[N], n = 0;
    for (int i = 0; i < N; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) break;
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
            write(fd, slow, strlen(slow)) != (ssize_t)strlen(slow)) {
            close(fd);
            break;
        }
        fds[n++] = fd;
    }
    T_EQ_INT(n, N);
    usleep(200000);
    for (int i = 0; i < n; i++) /* still talking, never done */
        if (write(fds[i], "X: y\r\n", 6) < 0) continue;
    snprintf(path, sizeof path, "/api/status?token=%s", sup_dash_token(d));
    double t0 = ms_now();
    T_EQ_INT(get(sup_dash_addr(d), path, NULL, body, sizeof body), 200);
    T_OK(ms_now() - t0 < 5);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    sup_dash_stop(d);
}

typedef struct {
    const char *addr, *path;
    atomic_int done;
} asker;

static void *ask_loop(void *arg) {
    asker *a = arg;
    static char body[1 << 16];
    for (int i = 0; i < 2; i++) {
        get(a->addr, a->path, NULL, body, sizeof body);
        usleep(260000); /* past the refresh period: each reads another 16 MiB */
    }
    atomic_store(&a->done, 1);
    return NULL;
}

/* The driver's push does not wait while the server reads a long run's
 * files (16 MiB a look, a quarter of a second): the driver's loop, which
 * detects the faults, is not held up by a page being opened. */
static void test_push_not_blocked(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tpath("long"));
    mkdir(dir, 0700);
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/events.jsonl");
    FILE *f = fopen(dir, "w");
    fputs("{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":2,\"pool\":\"node0\"}\n", f);
    for (long n = 0; n < 20l << 20;)
        n += fprintf(f,
                     "{\"time\":2,\"t\":1,\"event\":\"anomaly\",\"kind\":\"straggler\",\"rank\":1,"
                     "\"step\":%ld,\"detail\":\"rank 1 computes at 0.5 of the median speed\"}\n",
                     n);
    fclose(f);
    *strrchr(dir, '/') = 0;
    sup_dash *d = NULL;
    char why[256], path[512];
    sup_dash_config c = {dir, NULL, 0, 1, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(path, sizeof path, "/api/status?token=%s", sup_dash_token(d));
    asker a;
    a.addr = sup_dash_addr(d), a.path = path;
    atomic_init(&a.done, 0);
    pthread_t th;
    pthread_create(&th, NULL, ask_loop, &a);
    sup_dash_rank r[2] = {{SUP_DASH_RUNNING, 0, 0.1, 1}, {SUP_DASH_SLOW, 0, 0.2, 2}};
    double worst = 0;
    while (!atomic_load(&a.done)) {
        sup_dash_live l = {.attempt = 1, .n_ranks = 2, .ranks = r};
        double t0 = ms_now();
        sup_dash_push(d, &l);
        worst = fmax(worst, ms_now() - t0);
        usleep(1000);
    }
    pthread_join(th, NULL);
    printf("test_sup_dash: the longest push while the server read 20 MiB: %.3f s\n", worst);
    T_OK(worst < 0.05);
    sup_dash_stop(d);
}

/* METHOD path: the whole reply, headers and body (malloc'd, NUL-terminated),
 * its status in *code. */
static char *get_all(const char *addr, const char *method, const char *path, int *code) {
    char host[64], req[1024];
    snprintf(host, sizeof host, "%s", addr);
    char *colon = strrchr(host, ':');
    *colon = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    inet_pton(AF_INET, host, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: x\r\n\r\n", method, path);
    size_t len = 0, cap = 1 << 20;
    char *buf = malloc(cap + 1);
    *code = -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && write(fd, req, strlen(req)) > 0) {
        ssize_t got;
        while ((got = read(fd, buf + len, cap - len)) > 0)
            if ((len += (size_t)got) == cap) buf = realloc(buf, (cap *= 2) + 1);
    }
    close(fd);
    buf[len] = 0;
    sscanf(buf, "HTTP/1.%*d %d", code);
    return buf;
}

/* The heat map of a big job (400000 cells: about a second of the server's
 * thread, with the model locked) is made again only when a line came: the
 * page asks for it every second. */
static void test_heatmap_cached(void) {
    char dir[512], path[600], line[64];
    snprintf(dir, sizeof dir, "%s", tpath("big"));
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    append(path, "{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":2048}\n", "w");
    snprintf(path, sizeof path, "%s/compute.jsonl", dir);
    FILE *f = fopen(path, "w");
    for (int s = 1; s <= 200; s++) {
        fprintf(f, "{\"step\":%d,\"compute_ms\":[", s);
        for (int r = 0; r < 2048; r++)
            fprintf(f, "%s%.3f", r ? "," : "", 10 + (r * 7 + s) % 13 * 0.1);
        fputs("]}\n", f);
    }
    fclose(f);
    sup_dash *d = NULL;
    char why[256], url[256];
    sup_dash_config c = {dir, NULL, 0, 0, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(url, sizeof url, "/api/heatmap?token=%s", sup_dash_token(d));
    int code1, code2, code3;
    double t0 = ms_now();
    char *a = get_all(sup_dash_addr(d), "GET", url, &code1);
    double t1 = ms_now();
    usleep(300000); /* a refresh, with nothing new */
    double t2 = ms_now();
    char *b = get_all(sup_dash_addr(d), "GET", url, &code2);
    double t3 = ms_now();
    printf("test_sup_dash: the heat map of 2048 ranks x 200 steps: %.3f s, again %.3f s\n", t1 - t0,
           t3 - t2);
    T_EQ_INT(code1, 200);
    T_EQ_INT(code2, 200);
    const char *ba = strstr(a, "\r\n\r\n"), *bb = strstr(b, "\r\n\r\n"); /* not the Date */
    T_OK(ba && bb && strlen(ba) > 1000000 && !strcmp(ba, bb));
    T_OK(t3 - t2 < (t1 - t0) / 4);
    /* a new row: made again, with it */
    snprintf(line, sizeof line, "{\"step\":201,\"compute_ms\":[");
    FILE *g = fopen(path, "a");
    fputs(line, g);
    for (int r = 0; r < 2048; r++)
        fprintf(g, "%s5", r ? "," : "");
    fputs("]}\n", g);
    fclose(g);
    usleep(300000);
    char *e = get_all(sup_dash_addr(d), "GET", url, &code3);
    const char *body = strstr(e, "\r\n\r\n");
    cJSON *h = body ? cJSON_Parse(body + 4) : NULL;
    const cJSON *steps = item(h, "steps");
    T_EQ_INT(code3, 200);
    T_EQ_INT(cJSON_GetArrayItem(steps, cJSON_GetArraySize(steps) - 1)->valueint, 201);
    cJSON_Delete(h);
    free(a), free(b), free(e);
    sup_dash_stop(d);
}

/* A run directory copied or moved elsewhere: job_start names its metrics
 * file where it was; the dashboard reads RUN_DIR/metrics.jsonl instead of
 * showing no curves. */
static void test_moved_run(void) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s", tpath("moved"));
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    append(path,
           "{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":1,\"metrics\":"
           "\"/nonexistent/where/it/ran/metrics.jsonl\"}\n",
           "w");
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    append(path, "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n", "w");
    sup_dash *d = NULL;
    char why[256], body[1 << 16];
    sup_dash_config c = {dir, NULL, 0, 0, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(path, sizeof path, "/api/metrics?token=%s", sup_dash_token(d));
    T_EQ_INT(get(sup_dash_addr(d), path, NULL, body, sizeof body), 200);
    cJSON *m = cJSON_Parse(body);
    T_EQ_INT(cJSON_GetArraySize(item(m, "steps")), 2);
    cJSON_Delete(m);
    sup_dash_stop(d);
}

/* A method other than GET and HEAD: 405 with the Allow header HTTP asks
 * for (it had none). */
static void test_method_not_allowed(void) {
    sup_dash *d = NULL;
    char why[256], url[256];
    sup_dash_config c = {tmpdir, NULL, 0, 0, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(url, sizeof url, "/api/status?token=%s", sup_dash_token(d));
    int code;
    char *r = get_all(sup_dash_addr(d), "DELETE", url, &code);
    T_EQ_INT(code, 405);
    T_OK(strstr(r, "\r\nAllow: GET, HEAD\r\n") != NULL);
    free(r);
    sup_dash_stop(d);
}

/* Faults as the summary counts them: a skipped update is none (10 to the summary's 2), every
 * rank an event names has it, and a node name's control characters are '?' (they went to the
 * page raw). */
static void test_fault_counts(void) {
    dash_model *m = dash_model_new();
    feed(event_line_of, m, "{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":2}");
    feed(event_line_of, m,
         "{\"time\":2,\"t\":1,\"event\":\"launch\",\"attempt\":1,\"nodes\":\"a\\u0007b\"}");
    feed(event_line_of, m,
         "{\"time\":3,\"t\":2,\"event\":\"fault_detected\",\"kind\":\"nonfinite\",\"rank\":0,"
         "\"ranks\":[0,1],\"step\":5,\"action\":\"redo\"}");
    for (int s = 6; s < 9; s++) {
        char line[256];
        snprintf(line, sizeof line,
                 "{\"time\":3,\"t\":2,\"event\":\"fault_detected\",\"kind\":\"nonfinite\","
                 "\"rank\":0,\"ranks\":[0,1,7,-1,\"x\"],\"step\":%d,\"action\":\"skip\"}",
                 s);
        feed(event_line_of, m, line);
    }
    cJSON *st = dash_model_status(m, NULL, "run", 4);
    T_EQ_INT(item(item(st, "job"), "faults")->valueint, 1);
    const cJSON *r1 = cJSON_GetArrayItem(item(st, "ranks"), 1);
    T_EQ_INT(item(r1, "faults")->valueint, 1);
    T_OK(!strcmp(item(r1, "last_fault")->valuestring, "nonfinite at step 8"));
    T_OK(!strcmp(item(cJSON_GetArrayItem(item(st, "nodes"), 0), "node")->valuestring, "a?b"));
    cJSON_Delete(st);
    dash_model_free(m);
}

/* Over the files alone: a job that has not ended and whose driver.lock no process holds is
 * "abandoned", with a warning (it read "running" for ever); the events file gone is said;
 * a request without the token is 401 whatever its method (a POST was 405). */
static void test_files_warning(void) {
    char dir[512], path[600], url[256], body[1 << 16], why[256];
    snprintf(dir, sizeof dir, "%s", tpath("abandoned"));
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    append(path, "{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":3}\n", "w");
    append(path, "{\"time\":1,\"t\":0,\"event\":\"rank_up\",\"rank\":0}\n", "a");
    append(path,
           "{\"time\":1,\"t\":0,\"event\":\"fault_detected\",\"kind\":\"crash\",\"rank\":2,"
           "\"step\":3,\"action\":\"restart\"}\n",
           "a");
    sup_dash *d = NULL;
    sup_dash_config c = {dir, NULL, 0, 0, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(url, sizeof url, "/api/status?token=%s", sup_dash_token(d));
    T_EQ_INT(get(sup_dash_addr(d), url, NULL, body, sizeof body), 200);
    /* no driver.lock (a run directory copied without it): held by none, abandoned (it read
     * "running" for ever), its time ending with its last event (it counted on to now) */
    cJSON *st = cJSON_Parse(body);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "abandoned"));
    T_OK(cJSON_IsString(item(st, "warning")));
    T_NEAR(item(item(st, "job"), "wall_s")->valuedouble, 0, 1e-9);
    /* nor do its ranks read "running" (they did): unknown, with what was said last; a rank
     * the events said had died stays dead */
    const cJSON *rk = item(st, "ranks");
    T_EQ_INT(cJSON_GetArraySize(rk), 3);
    T_OK(!strcmp(item(cJSON_GetArrayItem(rk, 0), "state")->valuestring, "unknown"));
    T_OK(!strcmp(item(cJSON_GetArrayItem(rk, 0), "last_state")->valuestring, "running"));
    T_OK(!strcmp(item(cJSON_GetArrayItem(rk, 1), "last_state")->valuestring, "starting"));
    T_OK(!strcmp(item(cJSON_GetArrayItem(rk, 2), "state")->valuestring, "dead"));
    T_OK(item(cJSON_GetArrayItem(rk, 2), "last_state") == NULL);
    cJSON_Delete(st);
    snprintf(path, sizeof path, "%s/driver.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    T_OK(fd >= 0 && flock(fd, LOCK_EX) == 0); /* a driver runs */
    usleep(300000);                           /* past the refresh interval */
    T_EQ_INT(get(sup_dash_addr(d), url, NULL, body, sizeof body), 200);
    st = cJSON_Parse(body);
    T_OK(strcmp(item(item(st, "job"), "state")->valuestring, "abandoned") != 0);
    T_OK(cJSON_IsNull(item(st, "warning")));
    rk = item(st, "ranks"); /* a driver watches: the events' states */
    T_OK(!strcmp(item(cJSON_GetArrayItem(rk, 0), "state")->valuestring, "running"));
    T_OK(item(cJSON_GetArrayItem(rk, 0), "last_state") == NULL);
    cJSON_Delete(st);
    close(fd); /* the driver is gone */
    T_EQ_INT(get(sup_dash_addr(d), url, NULL, body, sizeof body), 200);
    st = cJSON_Parse(body);
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "abandoned"));
    T_OK(cJSON_IsString(item(st, "warning")) &&
         strstr(item(st, "warning")->valuestring, "no driver holds") != NULL);
    cJSON_Delete(st);
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    unlink(path); /* the run directory deleted under it */
    T_EQ_INT(get(sup_dash_addr(d), url, NULL, body, sizeof body), 200);
    st = cJSON_Parse(body);
    T_OK(cJSON_IsString(item(st, "warning")) &&
         strstr(item(st, "warning")->valuestring, "events.jsonl is gone") != NULL);
    cJSON_Delete(st);
    int code;
    char *r = get_all(sup_dash_addr(d), "POST", "/api/status", &code);
    T_EQ_INT(code, 401);
    free(r);
    sup_dash_stop(d);
}

/* An events file not read to its end at the first look (a line of 20 MiB: a refresh reads 16
 * MiB of it): the status says so and shows what was read, not "abandoned" (the job's end was
 * still unread); the next refreshes read on, to the job's end. */
static void test_still_reading(void) {
    char dir[512], path[600], url[256], body[1 << 16], why[256];
    snprintf(dir, sizeof dir, "%s", tpath("still_reading"));
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    append(path, "{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":1}\n", "w");
    FILE *f = fopen(path, "a");
    T_OK(f != NULL);
    if (!f) return;
    fputs("{\"time\":2,\"t\":1,\"event\":\"note\",\"x\":\"", f);
    for (int i = 0; i < 20 << 10; i++)
        fprintf(f, "%01023d", 0);
    fputs("\"}\n{\"time\":3,\"t\":2,\"event\":\"job_done\"}\n", f);
    fclose(f);
    sup_dash *d = NULL;
    sup_dash_config c = {dir, NULL, 0, 0, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(url, sizeof url, "/api/status?token=%s", sup_dash_token(d));
    T_EQ_INT(get(sup_dash_addr(d), url, NULL, body, sizeof body), 200);
    cJSON *st = cJSON_Parse(body);
    T_OK(strcmp(item(item(st, "job"), "state")->valuestring, "abandoned") != 0);
    T_OK(cJSON_IsString(item(st, "warning")) &&
         strstr(item(st, "warning")->valuestring, "events.jsonl is still being read") != NULL);
    cJSON_Delete(st);
    st = NULL;
    const char *state = "";
    for (int i = 0; i < 20 && strcmp(state, "done"); i++) {
        usleep(300000); /* past the refresh interval */
        T_EQ_INT(get(sup_dash_addr(d), url, NULL, body, sizeof body), 200);
        cJSON_Delete(st);
        st = cJSON_Parse(body);
        state = item(item(st, "job"), "state")->valuestring;
    }
    T_OK(!strcmp(state, "done") && cJSON_IsNull(item(st, "warning")));
    cJSON_Delete(st);
    sup_dash_stop(d);
}

/* A plain run's directory (metrics, no events, no driver.lock): no warning (it said its
 * events file "is gone"), and its state from the metrics. */
static void test_plain_no_warning(void) {
    char dir[512], path[600], url[256], body[1 << 16], why[256];
    snprintf(dir, sizeof dir, "%s", tpath("plainrun"));
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    append(path,
           "{\"type\":\"config\",\"wall\":10,\"options\":{\"steps\":2}}\n"
           "{\"step\":1,\"loss\":5,\"ms\":1,\"wall\":11}\n{\"step\":2,\"loss\":4,\"ms\":1,"
           "\"wall\":12}\n",
           "w");
    sup_dash *d = NULL;
    sup_dash_config c = {dir, NULL, 0, 0, NULL};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(url, sizeof url, "/api/status?token=%s", sup_dash_token(d));
    T_EQ_INT(get(sup_dash_addr(d), url, NULL, body, sizeof body), 200);
    cJSON *st = cJSON_Parse(body);
    T_OK(cJSON_IsNull(item(st, "warning")));
    T_OK(!strcmp(item(item(st, "job"), "state")->valuestring, "done"));
    cJSON_Delete(st);
    sup_dash_stop(d);
}

/* `launch --events PATH` keeps the events elsewhere: the dashboard reads
 * them there (it showed no ranks and no events). */
static void test_events_elsewhere(void) {
    append(tpath("elsewhere.jsonl"),
           "{\"time\":1,\"t\":0,\"event\":\"job_start\",\"np\":3,\"pool\":\"node0\"}\n", "w");
    sup_dash *d = NULL;
    char why[256], body[1 << 16], path[512];
    sup_dash_config c = {tpath("no_such_run"), NULL, 0, 0, tpath("elsewhere.jsonl")};
    T_EQ_INT(sup_dash_start(&d, &c, why, sizeof why), 0);
    if (!d) return;
    snprintf(path, sizeof path, "/api/status?token=%s", sup_dash_token(d));
    T_EQ_INT(get(sup_dash_addr(d), path, NULL, body, sizeof body), 200);
    cJSON *st = cJSON_Parse(body);
    T_EQ_INT(cJSON_GetArraySize(item(st, "ranks")), 3);
    cJSON_Delete(st);
    sup_dash_stop(d);
}

int main(void) {
    if (!ms_tmpdir_make("sup_dash")) return 1;
    test_metrics();
    test_events();
    test_events_big();
    test_fault_stop();
    test_second_job();
    test_heatmap();
    test_no_layout();
    test_plain_state();
    test_plain_no_warning();
    test_tail();
    test_tail_stop();
    test_events_hostile();
    test_heatlog();
    test_writer();
    test_writer_rotate();
    test_server();
    test_finish();
    test_events_elsewhere();
    test_fault_counts();
    test_files_warning();
    test_still_reading();
    test_method_not_allowed();
    test_slow_clients();
    test_push_not_blocked();
    test_moved_run();
    test_heatmap_cached();
    ms_tmpdir_remove();
    return ms_test_summary("test_sup_dash");
}
