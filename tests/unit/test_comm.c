/* test_comm.c - the communicator (src/comm) on any number of ranks: every
 * collective against values computed locally from fresh random data (each
 * rank can regenerate every other rank's input from the shared seed),
 * in-place variants, a send/recv ring, several outstanding ops at once,
 * progress while the main thread computes, groups by split and by rank
 * list, argument and MPI errors.  Run directly (a world of 1) or under
 * mpirun through tests/comm/mpirun.sh.  Each rank prints its own summary
 * line and exits non-zero on any failure. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/rng.h"
#include "base/timeutil.h"
#include "base/ctx.h"
#include "check.h"
#include "comm/comm.h"
#include "comm/comm_internal.h" /* w->stream_until */
#include "comm/env_options.h"

static uint64_t seed;
static int R, N; /* world rank, size */

/* Input element i of rank r for test case k. */
static double gen_f(int r, int k, size_t i) {
    return ms_rng_normal(seed, (uint64_t)r * 1000 + (uint64_t)k, i);
}
static int32_t gen_i(int r, int k, size_t i) {
    return (int32_t)(ms_rng_u64(seed, (uint64_t)r * 1000 + (uint64_t)k, i) % 2001) - 1000;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* Shared seed: MS_TEST_SEED or rank 0's clock, broadcast. */
static void pick_seed(comm_group *world) {
    const char *s = getenv("MS_TEST_SEED");
    seed = s ? strtoull(s, NULL, 10) : (uint64_t)(ms_wall_now() * 1e6);
    T_EQ_INT(comm_broadcast(world, &seed, 8, COMM_U8, 0), MS_OK);
    if (R == 0) printf("test_comm: %d ranks, seed %llu\n", N, (unsigned long long)seed);
}

static void test_world(comm_world *w) {
    comm_group *g = comm_world_group(w);
    T_STR_CONTAINS(comm_group_name(g), "world");
    T_EQ_INT(comm_group_size(g), N);
    T_EQ_INT(comm_group_rank(g), R);
    for (int i = 0; i < N; i++)
        T_EQ_INT(comm_group_global_rank(g, i), i);
    const char *env = getenv("OMPI_COMM_WORLD_SIZE");
    if (env) T_EQ_INT(N, atoi(env));
    T_OK(comm_world_timeout(w) > 0);
    T_OK(!comm_world_broken(w));
}

/* All-reduce of count elements in f32, f64, i32 (sum, and max for i32),
 * out of place and in place. */
static void test_allreduce(comm_group *g, size_t count, int inplace) {
    float *f = xmalloc(count * 4), *fo = xmalloc(count * 4);
    double *d = xmalloc(count * 8), *dout = xmalloc(count * 8);
    int32_t *x = xmalloc(count * 4), *xo = xmalloc(count * 4), *xm = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++) {
        f[i] = (float)gen_f(R, 1, i);
        d[i] = gen_f(R, 2, i);
        x[i] = xm[i] = gen_i(R, 3, i);
    }
    T_EQ_INT(comm_allreduce(g, f, inplace ? f : fo, count, COMM_F32, COMM_SUM), MS_OK);
    T_EQ_INT(comm_allreduce(g, d, inplace ? d : dout, count, COMM_F64, COMM_SUM), MS_OK);
    T_EQ_INT(comm_allreduce(g, x, inplace ? x : xo, count, COMM_I32, COMM_SUM), MS_OK);
    T_EQ_INT(comm_allreduce(g, xm, xm, count, COMM_I32, COMM_MAX), MS_OK);
    const float *rf = inplace ? f : fo;
    const double *rd = inplace ? d : dout;
    const int32_t *rx = inplace ? x : xo;
    int bad = 0;
    for (size_t i = 0; i < count && bad < 5; i++) {
        double sf = 0, sd = 0;
        long long sx = 0, mx = -100000;
        for (int r = 0; r < N; r++) {
            sf += (float)gen_f(r, 1, i);
            sd += gen_f(r, 2, i);
            sx += gen_i(r, 3, i);
            if (gen_i(r, 3, i) > mx) mx = gen_i(r, 3, i);
        }
        int ok = fabs(rf[i] - sf) <= 1e-5 * (1 + fabs(sf)) && fabs(rd[i] - sd) <= 1e-12 &&
                 rx[i] == sx && xm[i] == mx;
        if (!ok) {
            bad++;
            fprintf(stderr,
                    "allreduce[%zu] (count %zu%s): f32 %.9g vs %.9g, f64 %.17g vs %.17g, "
                    "i32 %d vs %lld, max %d vs %lld\n",
                    i, count, inplace ? ", in place" : "", rf[i], sf, rd[i], sd, rx[i], sx, xm[i],
                    mx);
        }
    }
    T_EQ_INT(bad, 0);
    free(f), free(fo), free(d), free(dout), free(x), free(xo), free(xm);
}

/* Reduce-scatter of N blocks of count f32 (out of place and in place). */
static void test_reduce_scatter(comm_group *g, size_t count, int inplace) {
    int n = comm_group_size(g), me = comm_group_rank(g);
    float *in = xmalloc(count * (size_t)n * 4), *out = xmalloc(count * 4);
    for (size_t i = 0; i < count * (size_t)n; i++)
        in[i] = (float)gen_f(R, 4, i);
    float *res = inplace ? in + (size_t)me * count : out;
    T_EQ_INT(comm_reduce_scatter(g, in, res, count, COMM_F32, COMM_SUM), MS_OK);
    int bad = 0;
    for (size_t i = 0; i < count && bad < 5; i++) {
        double s = 0;
        for (int r = 0; r < n; r++)
            s += (float)gen_f(comm_group_global_rank(g, r), 4, (size_t)me * count + i);
        if (fabs(res[i] - s) > 1e-5 * (1 + fabs(s))) {
            bad++;
            fprintf(stderr, "reduce_scatter[%zu] (count %zu%s): %.9g vs %.9g\n", i, count,
                    inplace ? ", in place" : "", res[i], s);
        }
    }
    T_EQ_INT(bad, 0);
    free(in), free(out);
}

/* All-gather of count f64 per rank (out of place and in place). */
static void test_allgather(comm_group *g, size_t count, int inplace) {
    int n = comm_group_size(g), me = comm_group_rank(g);
    double *mine = xmalloc(count * 8), *all = xmalloc(count * (size_t)n * 8);
    for (size_t i = 0; i < (size_t)n * count; i++)
        all[i] = -1;
    for (size_t i = 0; i < count; i++)
        mine[i] = gen_f(R, 5, i);
    if (inplace) memcpy(all + (size_t)me * count, mine, count * 8);
    const double *send = inplace ? all + (size_t)me * count : mine;
    T_EQ_INT(comm_allgather(g, send, all, count, COMM_F64), MS_OK);
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count && bad < 5; i++) {
            double e = gen_f(comm_group_global_rank(g, r), 5, i);
            if (all[(size_t)r * count + i] != e) {
                bad++;
                fprintf(stderr, "allgather block %d [%zu]: %.17g vs %.17g\n", r, i,
                        all[(size_t)r * count + i], e);
            }
        }
    T_EQ_INT(bad, 0);
    free(mine), free(all);
}

/* Broadcast of i32 from every root in turn. */
static void test_broadcast(comm_group *g, size_t count) {
    int n = comm_group_size(g);
    int32_t *buf = xmalloc(count * 4);
    for (int root = 0; root < n; root++) {
        int gr = comm_group_global_rank(g, root);
        for (size_t i = 0; i < count; i++)
            buf[i] = gen_i(R, 6 + root, i);
        T_EQ_INT(comm_broadcast(g, buf, count, COMM_I32, root), MS_OK);
        int bad = 0;
        for (size_t i = 0; i < count; i++)
            bad += buf[i] != gen_i(gr, 6 + root, i);
        T_EQ_INT(bad, 0);
    }
    free(buf);
}

/* Ring: each rank sends to rank+1 and receives from rank-1, both posted
 * before either is waited for (a blocking send first would deadlock). */
static void test_ring(comm_group *g, size_t count) {
    int n = comm_group_size(g), me = comm_group_rank(g);
    int to = (me + 1) % n, from = (me + n - 1) % n;
    float *s = xmalloc(count * 4), *r = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        s[i] = (float)gen_f(R, 20, i), r[i] = 0;
    comm_req *rq[2] = {NULL, NULL};
    T_EQ_INT(comm_recv_start(g, r, count, COMM_F32, from, 3, &rq[0]), MS_OK);
    T_EQ_INT(comm_send_start(g, s, count, COMM_F32, to, 3, &rq[1]), MS_OK);
    T_EQ_INT(comm_wait_all(rq, 2), MS_OK);
    int bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += r[i] != (float)gen_f(comm_group_global_rank(g, from), 20, i);
    T_EQ_INT(bad, 0);
    free(s), free(r);
}

/* Eight ops outstanding at once on the world, waited in reverse order. */
static void test_overlap(comm_group *g) {
    enum { K = 6, C = 4099 };
    float *a[K];
    comm_req *rq[K + 2] = {0};
    for (int k = 0; k < K; k++) {
        a[k] = xmalloc((size_t)C * 4);
        for (size_t i = 0; i < C; i++)
            a[k][i] = (float)gen_f(R, 30 + k, i);
        T_EQ_INT(comm_allreduce_start(g, a[k], a[k], C, COMM_F32, COMM_SUM, &rq[k]), MS_OK);
    }
    int32_t b[17], *gath = xmalloc((size_t)N * 5 * 4), mine[5];
    for (int i = 0; i < 17; i++)
        b[i] = gen_i(R, 40, (size_t)i);
    for (int i = 0; i < 5; i++)
        mine[i] = gen_i(R, 41, (size_t)i);
    T_EQ_INT(comm_broadcast_start(g, b, 17, COMM_I32, N - 1, &rq[K]), MS_OK);
    T_EQ_INT(comm_allgather_start(g, mine, gath, 5, COMM_I32, &rq[K + 1]), MS_OK);
    for (int k = K + 1; k >= 0; k--)
        T_EQ_INT(comm_wait(rq[k]), MS_OK);
    int bad = 0;
    for (int k = 0; k < K; k++)
        for (size_t i = 0; i < C; i++) {
            double s = 0;
            for (int r = 0; r < N; r++)
                s += (float)gen_f(r, 30 + k, i);
            bad += fabs(a[k][i] - s) > 1e-5 * (1 + fabs(s));
        }
    for (int i = 0; i < 17; i++)
        bad += b[i] != gen_i(N - 1, 40, (size_t)i);
    for (int r = 0; r < N; r++)
        for (int i = 0; i < 5; i++)
            bad += gath[r * 5 + i] != gen_i(r, 41, (size_t)i);
    T_EQ_INT(bad, 0);
    for (int k = 0; k < K; k++)
        free(a[k]);
    free(gath);
}

/* The hard-polling window of large ops (w->stream_until, see
 * COMM_STREAM_MIN_BYTES) counts the ops still streaming only: after
 * ops that completed faster than COMM_STREAM_MIN_RATE it is over, so that a
 * later op waiting for a peer gets the back-off back, and the window does
 * not grow with every op of a run that moves more than that rate. */
static void test_stream_window(comm_world *w) {
    enum { K = 8 };
    size_t count = (size_t)1 << 20; /* 4 MB: a 16 ms window each, 133 ms in all */
    float *x = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        x[i] = (float)gen_f(R, 70, i);
    double t0 = ms_now();
    for (int k = 0; k < K; k++)
        T_EQ_INT(comm_allreduce(comm_world_group(w), x, x, count, COMM_F32, COMM_MAX), MS_OK);
    double took = ms_now() - t0;
    pthread_mutex_lock(&w->mpi_mu);
    double until = w->stream_until;
    int nactive = w->nactive;
    pthread_mutex_unlock(&w->mpi_mu);
    T_EQ_INT(nactive, 0);
    /* nothing streams: the window is not ahead of now (only meaningful
     * when the ops ran faster than the window rate; a world of one does) */
    if (took < COMM_HARD_POLL_S + K * (double)(count * 4) / COMM_STREAM_MIN_RATE)
        T_OK(until <= ms_now());
    free(x);
}

/* The same inputs reduce to bit-identical results every time (MPI's
 * reduction order depends only on the layout; we add no nondeterminism). */
static void test_determinism(comm_group *g) {
    size_t count = 40009;
    float *a = xmalloc(count * 4), *b = xmalloc(count * 4);
    for (int rep = 0; rep < 2; rep++) {
        float *x = rep ? b : a;
        for (size_t i = 0; i < count; i++)
            x[i] = (float)gen_f(R, 60, i) * 1e3f;
        T_EQ_INT(comm_allreduce(g, x, x, count, COMM_F32, COMM_SUM), MS_OK);
    }
    T_OK(memcmp(a, b, count * 4) == 0);
    free(a), free(b);
}

/* Compute for `seconds` without touching the comm layer. */
static double busy(double seconds) {
    double t0 = ms_now(), acc = 0;
    while (ms_now() - t0 < seconds)
        for (int i = 1; i < 20000; i++)
            acc += 1.0 / i;
    return acc;
}

/* A large all-reduce (many protocol rounds, each needing MPI progress)
 * finishes while the main thread computes and never calls the comm layer:
 * its completion time (stamped by the comm thread) is before the compute
 * loop ended, and the first comm_test afterwards already says done. */
static void test_progress(comm_group *g) {
    size_t count = (size_t)1 << 20;
    float *x = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        x[i] = (float)gen_f(R, 50, i);
    double t0 = ms_now();
    T_EQ_INT(comm_allreduce(g, x, x, count, COMM_F32, COMM_SUM), MS_OK); /* warm-up, timing */
    double once = ms_now() - t0, dummy = 0;
    T_EQ_INT(comm_allreduce(g, &once, &once, 1, COMM_F64, COMM_MAX), MS_OK);
    double compute = 0.3 + 4 * once;
    for (size_t i = 0; i < count; i++)
        x[i] = (float)gen_f(R, 50, i);
    comm_req *rq = NULL;
    T_EQ_INT(comm_allreduce_start(g, x, x, count, COMM_F32, COMM_SUM, &rq), MS_OK);
    double tc0 = ms_now();
    dummy += busy(compute);
    double tc1 = ms_now(), ts = 0, td = 0;
    int done = 0;
    T_EQ_INT(comm_test(rq, &done), MS_OK);
    comm_req_times(rq, &ts, &td);
    T_OK(done);
    T_OK(td > 0 && td < tc1);
    if (!(done && td > 0 && td < tc1))
        fprintf(stderr,
                "progress: done %d, op finished %.3f s after compute start, compute %.3f "
                "s (one all-reduce %.3f s)\n",
                done, td - tc0, tc1 - tc0, once);
    T_EQ_INT(comm_wait(rq), MS_OK);
    int bad = 0;
    for (size_t i = 0; i < count && bad < 5; i += 997) {
        double s = 0;
        for (int r = 0; r < N; r++)
            s += (float)gen_f(r, 50, i);
        bad += fabs(x[i] - s) > 1e-5 * (1 + fabs(s));
    }
    T_EQ_INT(bad, 0);
    if (R == 0)
        printf("progress: 4 MB all-reduce finished %.3f s into a %.3f s compute loop (%g)\n",
               td - tc0, tc1 - tc0, dummy > 0 ? 1.0 : 0.0);
    free(x);
}

typedef struct {
    comm_world *w;
    double seen; /* comm_world_blocked_s 0.3 s in */
} blocked_probe;

static void *probe_blocked(void *arg) {
    blocked_probe *p = arg;
    usleep(300000);
    p->seen = comm_world_blocked_s(p->w);
    return NULL;
}

typedef struct {
    comm_group *g;
    int x;
    ms_status st;
} bg_reduce;

static void *bg_allreduce(void *arg) {
    bg_reduce *b = arg;
    comm_thread_set_background(1);
    b->st = comm_allreduce(b->g, &b->x, &b->x, 1, COMM_I32, COMM_SUM);
    return NULL;
}

/* comm_world_blocked_s: 0 with no caller in comm_wait; rank 0 blocked in an
 * all-reduce that rank 1 joins 0.6 s late has waited about 0.3 s when a
 * second thread looks, and 0 again after.  The same wait on a background
 * thread (comm_thread_set_background: a checkpoint's persist thread) is not
 * counted: 0 when the main thread looks meanwhile. */
static void test_blocked(comm_world *w) {
    comm_group *g = comm_world_group(w);
    T_NEAR(comm_world_blocked_s(w), 0, 0);
    int x = 1;
    if (N < 2) return;
    if (R == 1) usleep(600000);
    blocked_probe p = {w, -1};
    pthread_t th;
    T_EQ_INT(R == 0 ? pthread_create(&th, NULL, probe_blocked, &p) : 0, 0);
    T_EQ_INT(comm_allreduce(g, &x, &x, 1, COMM_I32, COMM_SUM), MS_OK);
    if (R == 0) {
        pthread_join(th, NULL);
        T_OK(p.seen >= 0.2 && p.seen < 5);
        if (!(p.seen >= 0.2 && p.seen < 5)) fprintf(stderr, "blocked: %.3f s\n", p.seen);
    }
    T_NEAR(comm_world_blocked_s(w), 0, 0);
    T_EQ_INT(x, N);
    if (R == 1) usleep(600000);
    bg_reduce b = {g, 1, MS_OK};
    pthread_t bt;
    T_EQ_INT(pthread_create(&bt, NULL, bg_allreduce, &b), 0);
    if (R == 0) {
        usleep(300000);
        T_NEAR(comm_world_blocked_s(w), 0, 0);
    }
    pthread_join(bt, NULL);
    T_EQ_INT(b.st, MS_OK);
    T_EQ_INT(b.x, N);
}

/* Split into even / odd world ranks; a reversed list group. */
static void test_groups(comm_world *w) {
    comm_group *world = comm_world_group(w), *par = NULL, *rev = NULL, *none = NULL;
    T_EQ_INT(comm_group_create_split(world, R % 2, R, "parity", &par), MS_OK);
    T_OK(par != NULL);
    if (!par) return;
    T_STR_CONTAINS(comm_group_name(par), "parity");
    T_EQ_INT(comm_group_size(par), (N - R % 2 + 1) / 2);
    T_EQ_INT(comm_group_rank(par), R / 2);
    for (int i = 0; i < comm_group_size(par); i++)
        T_EQ_INT(comm_group_global_rank(par, i), 2 * i + R % 2);
    int32_t v = R + 1, sum = 0;
    T_EQ_INT(comm_allreduce(par, &v, &sum, 1, COMM_I32, COMM_SUM), MS_OK);
    int32_t want = 0;
    for (int r = R % 2; r < N; r += 2)
        want += r + 1;
    T_EQ_INT(sum, want);
    test_reduce_scatter(par, 301, 1);
    test_allgather(par, 33, 1);
    test_broadcast(par, 9);
    test_ring(par, 1000);
    /* color < 0: no group */
    T_EQ_INT(comm_group_create_split(world, R == 0 ? -1 : 0, 0, "no-zero", &none), MS_OK);
    T_OK((none == NULL) == (R == 0));
    /* reversed order: group rank = N-1-R */
    int *ranks = xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++)
        ranks[i] = N - 1 - i;
    T_EQ_INT(comm_group_create_ranks(world, ranks, N, "reversed", &rev), MS_OK);
    if (rev) {
        T_EQ_INT(comm_group_rank(rev), N - 1 - R);
        T_EQ_INT(comm_group_global_rank(rev, 0), N - 1);
        test_allgather(rev, 7, 0);
        test_ring(rev, 5);
    }
    free(ranks);
    comm_group_destroy(rev);
    comm_group_destroy(none);
    comm_group_destroy(par);
}

/* Bad arguments are refused at once, naming the op and the group. */
/* The hang dump's host states are whole JSON whatever the host holds:
 * 300 stopped ranks and 900 exited ones in a dump's 8 KiB, or a tiny
 * buffer, leave some out and count them (before, ~45 stopped ranks cut
 * the text before its closing bracket). */
static void test_host_states(void) {
    enum { NP = 1200 };
    static comm_host_peer p[NP];
    for (int i = 0; i < NP; i++)
        p[i] = (comm_host_peer){.rank = 100000 + i,
                                .age_s = i % 4 == 0 ? 6.5 : 0.1,
                                .exited = i % 4 == 1 || i % 4 == 2 || (i >= 400 && i % 4 == 3)};
    size_t sizes[] = {144, 200, 2048, 8192, 1 << 20};
    for (int k = 0; k < 5; k++) {
        char *buf = malloc(sizes[k]);
        if (!buf) abort();
        memset(buf, 'x', sizes[k]);
        comm_host_states_format(p, NP, buf, sizes[k]);
        char *text = malloc(sizes[k] + 2);
        if (!text) abort();
        snprintf(text, sizes[k] + 2, "{%s}", buf);
        cJSON *o = cJSON_Parse(text);
        const cJSON *u = cJSON_GetObjectItem(o, "unresponsive"),
                    *e = cJSON_GetObjectItem(o, "exited"),
                    *uo = cJSON_GetObjectItem(o, "unresponsive_omitted"),
                    *eo = cJSON_GetObjectItem(o, "exited_omitted");
        int nu = cJSON_GetArraySize(u) + (uo ? (int)uo->valuedouble : 0);
        int ne = cJSON_GetArraySize(e) + (eo ? (int)eo->valuedouble : 0);
        T_OK(o && cJSON_IsArray(u) && cJSON_IsArray(e) && strlen(buf) < sizes[k]);
        T_EQ_INT(nu, 300);
        T_EQ_INT(ne, 600 + 200);
        if (sizes[k] == 1 << 20) T_EQ_INT(cJSON_GetArraySize(u), 300); /* all fit */
        if (sizes[k] <= 8192) T_OK(uo && uo->valuedouble > 0);
        cJSON_Delete(o);
        free(text), free(buf);
    }
    char small[64] = "x";
    comm_host_states_format(p, NP, small, sizeof small);
    T_OK(small[0] == 0);
}

static void test_arg_errors(comm_group *g) {
    comm_req *rq = (comm_req *)1;
    float f[4] = {0};
    T_EQ_INT(comm_broadcast_start(g, f, 4, COMM_F32, N, &rq), MS_ERR_ARG);
    T_OK(rq == NULL);
    T_STR_CONTAINS(ms_errmsg(), "comm_broadcast_start on group 'world': root");
    T_EQ_INT(comm_send(g, f, 4, COMM_F32, -1, 0), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "peer -1");
    T_EQ_INT(comm_recv(g, f, 4, COMM_F32, 0, 1 << 20), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "tag");
    T_EQ_INT(comm_allreduce(g, f, f, 2, COMM_F32, (comm_redop)7), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "bad reduction op 7");
    T_EQ_INT(comm_allreduce(g, f, f + 1, 2, COMM_F32, COMM_SUM), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "overlap");
    T_EQ_INT(comm_allgather(g, f, NULL, 1, COMM_F32), MS_ERR_ARG);
    T_EQ_INT(comm_wait(NULL), MS_OK);
}

/* Errors from MPI (truncation) and a short message are reported and do not
 * break the world. */
static void test_mpi_errors(comm_group *g) {
    if (N < 2) return;
    int32_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8] = {0};
    if (R == 0) {
        T_EQ_INT(comm_send(g, buf, 8, COMM_I32, 1, 5), MS_OK);
        T_EQ_INT(comm_send(g, buf, 4, COMM_I32, 1, 6), MS_OK);
    } else if (R == 1) {
        ms_status st = comm_recv(g, got, 4, COMM_I32, 0, 5);
        T_EQ_INT(st, MS_ERR_INTERNAL);
        T_STR_CONTAINS(ms_errmsg(), "recv from rank 0 (global 0) tag 5");
        T_STR_CONTAINS(ms_errmsg(), "truncat");
        T_EQ_INT(comm_recv(g, got, 8, COMM_I32, 0, 6), MS_ERR_RANGE);
        T_STR_CONTAINS(ms_errmsg(), "received 4 elements, expected 8");
        T_EQ_INT(got[3], 4);
    }
    T_OK(!comm_world_broken(comm_group_world(g)));
    T_EQ_INT(comm_barrier(g), MS_OK);
}

int main(int argc, char **argv) {
    ms_ctx_init(); /* rank-aware log lines */
    comm_world *w = NULL;
    comm_options co = ms_test_comm_options(); /* MS_COMM_TIMEOUT, MS_COMM_NCCL_SYNC */
    ms_status st = comm_world_init(&w, &argc, &argv, &co);
    if (st != MS_OK) {
        fprintf(stderr, "test_comm: comm_world_init: %s\n", ms_errmsg());
        return 1;
    }
    R = comm_world_rank(w), N = comm_world_size(w);
    comm_group *g = comm_world_group(w);
    pick_seed(g);
    test_world(w);
    size_t counts[] = {0, 1, 7, 1000, 65537};
    for (int c = 0; c < 5; c++)
        for (int ip = 0; ip < 2; ip++) {
            test_allreduce(g, counts[c], ip);
            test_reduce_scatter(g, counts[c], ip);
            test_allgather(g, counts[c], ip);
        }
    test_broadcast(g, 1);
    test_broadcast(g, 10007);
    test_ring(g, 1);
    test_ring(g, 100003);
    test_overlap(g);
    test_stream_window(w);
    test_determinism(g);
    test_progress(g);
    test_blocked(w);
    test_groups(w);
    test_arg_errors(g);
    test_host_states();
    test_mpi_errors(g);
    T_EQ_INT(comm_barrier(g), MS_OK);
    st = comm_world_finalize(w);
    T_EQ_INT(st, MS_OK);
    if (st != MS_OK) fprintf(stderr, "finalize: %s\n", ms_errmsg());
    char name[64];
    snprintf(name, sizeof name, "test_comm r%d/%d", R, N);
    return ms_test_summary(name);
}
