/* test_comm_device.c - MPI ops on device buffers staged through pinned host
 * memory (comm_world_set_device), and bf16 reductions, with the fake device
 * of tests/comm/fake_device.h (no GPU needed).  Checks, on any number of
 * ranks:
 *  - every collective (f32 and bf16; in place and out of place; counts 0 to
 *    65537) and send/recv on fake-device buffers gives bit for bit what the
 *    same op gives on host buffers, copies exactly what the staging table in
 *    comm_stage.c says, leaves the send buffer alone, and host buffers are
 *    never copied (mixed host/device pairs copy only the device side);
 *  - the host results are right: f32 sums to 1e-5 relative, bf16 sums
 *    within the bound below, bf16 max exact, all ranks bit-identical;
 *  - the staging pool stops growing after one warm-up step;
 *  - comm_test never copies back: after it says done the device buffer is
 *    untouched until comm_wait;
 *  - no hook ever runs on the communication thread;
 *  - a failed pinned allocation is an MS_ERR_NOMEM that leaves the world
 *    usable; a short recv copies back what arrived; a truncated one nothing;
 *  - with set_device(NULL) device pointers pass through and the pool is
 *    freed.
 * "test_comm_device timeout" (one process) checks that a staged recv that
 * never matches times out with the usual message, copies nothing back and
 * leaves its staging buffer to MPI.
 *
 * bf16 sum bound: MPI may combine the n ranks' values in any order (the op
 * is commutative), each of the n-1 combining steps rounds its fp32 sum to
 * bf16 (error <= 1/2 ulp of that partial sum), and the reference rounds the
 * exact sum once (<= 1/2 ulp).  Every partial sum is at most
 * M = sum_r |x_r| in magnitude, so |result - ref| <= (n/2) ulp(M) <=
 * (n-1) ulp(M) for n >= 2, with ulp(M) = 2^(floor(log2 M) - 7): 1 ulp of M
 * per combining step is what is tested.  On 2 ranks there is one step and
 * the result must be bf16(fp32(a) + fp32(b)) bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/ctx.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "check.h"
#include "comm/comm.h"
#include "comm/env_options.h"
#include "comm/fake_device.h"

static uint64_t seed;
static int R, N; /* world rank, size */
static fake_dev fd;
static comm_device dev;

typedef enum { OP_ALLREDUCE, OP_RS, OP_AG, OP_BCAST, OP_MAX } opkind;
static const char *op_names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                 "all_reduce(max)"};

/* ---- bf16 and data --------------------------------------------------------- */

/* bf16 rounding of a double through fp32 is a double rounding: round the
 * double to bf16 directly (ties to even on the 8-bit mantissa). */
static uint16_t d2bf(double x) {
    if (x == 0) return 0;
    int e;
    double m = frexp(fabs(x), &e);            /* x = m 2^e, m in [0.5, 1) */
    double q = ldexp(m, 8), r = nearbyint(q); /* 8 significant bits, ties to even */
    return ms_f32_to_bf16((float)copysign(ldexp(r, e - 8), x));
}

static double ulp_bf16(double m) {
    if (m <= 0) return 0;
    int e;
    frexp(m, &e); /* m in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 1 - 7);
}

/* Element i of rank r's input for case k, as a float (bf16-representable
 * when dt is bf16). */
static float gen(int r, int k, size_t i, comm_dtype dt) {
    float x = ms_rng_normal(seed, (uint64_t)r * 1000 + (uint64_t)k, i) * 3.0f;
    return dt == COMM_BF16 ? ms_bf16_to_f32(ms_f32_to_bf16(x)) : x;
}

static void put(void *buf, comm_dtype dt, size_t i, float x) {
    if (dt == COMM_BF16)
        ((uint16_t *)buf)[i] = ms_f32_to_bf16(x);
    else
        ((float *)buf)[i] = x;
}

static float get(const void *buf, comm_dtype dt, size_t i) {
    return dt == COMM_BF16 ? ms_bf16_to_f32(((const uint16_t *)buf)[i]) : ((const float *)buf)[i];
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* ---- copy counters ----------------------------------------------------------- */

typedef struct {
    long th, td, bth, btd, allocs;
} counts;

static counts snap(void) {
    pthread_mutex_lock(&fd.mu);
    counts c = {fd.to_host, fd.to_device, fd.bytes_to_host, fd.bytes_to_device, fd.host_allocs};
    pthread_mutex_unlock(&fd.mu);
    return c;
}

static counts diff(counts a, counts b) {
    return (counts){b.th - a.th, b.td - a.td, b.bth - a.bth, b.btd - a.btd, b.allocs - a.allocs};
}

/* ---- one collective on host or device buffers ------------------------------- */

typedef struct {
    void *res;     /* malloc'd copy of the result region */
    size_t bytes;  /* its size */
    counts copies; /* what the op copied */
    int send_kept; /* out of place: the send buffer is unchanged */
} run_out;

/* Run op on count elements per block, buffers in host memory (on_dev 0),
 * fake-device memory (1), or send on the host and recv on the device (2)
 * or the reverse (3, out of place only).  Inputs depend on (rank, k). */
static run_out run_op(comm_group *g, opkind op, comm_dtype dt, size_t count, int inplace,
                      int on_dev, int k) {
    int n = comm_group_size(g), me = comm_group_rank(g), root = k % n;
    size_t es = comm_dtype_size(dt), sn = count, rn = count;
    if (op == OP_RS) sn = count * (size_t)n;
    if (op == OP_AG) rn = count * (size_t)n;
    int sdev = on_dev == 1 || on_dev == 3, rdev = on_dev == 1 || on_dev == 2;
    run_out o = {0};
    char *sbuf = NULL, *rbuf = NULL, *orig = xmalloc(sn * es);
    if (inplace || op == OP_BCAST) {
        size_t big = op == OP_RS ? sn : rn;
        rbuf = rdev ? fake_dev_alloc(&fd, big * es) : xmalloc(big * es);
        memset(rbuf, 0x11, big * es);
        sbuf = op == OP_AG ? rbuf + (size_t)me * count * es : rbuf;
        rbuf = op == OP_RS ? rbuf + (size_t)me * count * es : rbuf;
    } else {
        sbuf = sdev ? fake_dev_alloc(&fd, sn * es) : xmalloc(sn * es);
        rbuf = rdev ? fake_dev_alloc(&fd, rn * es) : xmalloc(rn * es);
        memset(rbuf, 0x11, rn * es);
    }
    int gr = comm_group_global_rank(g, me);
    for (size_t i = 0; i < sn && (op != OP_BCAST || me == root); i++)
        put(sbuf, dt, i, gen(gr, k, i, dt));
    memcpy(orig, sbuf, sn * es);
    counts c0 = snap();
    ms_status st = MS_OK;
    switch (op) {
    case OP_ALLREDUCE:
    case OP_MAX:
        st = comm_allreduce(g, sbuf, rbuf, count, dt, op == OP_MAX ? COMM_MAX : COMM_SUM);
        break;
    case OP_RS:
        st = comm_reduce_scatter(g, sbuf, rbuf, count, dt, COMM_SUM);
        break;
    case OP_AG:
        st = comm_allgather(g, sbuf, rbuf, count, dt);
        break;
    case OP_BCAST:
        st = comm_broadcast(g, rbuf, count, dt, root);
        break;
    }
    T_EQ_INT(st, MS_OK);
    if (st != MS_OK) fprintf(stderr, "%s: %s\n", op_names[op], ms_errmsg());
    o.copies = diff(c0, snap());
    o.bytes = rn * es;
    o.res = xmalloc(o.bytes);
    memcpy(o.res, rbuf, o.bytes);
    o.send_kept = inplace || op == OP_BCAST || memcmp(orig, sbuf, sn * es) == 0;
    /* free: the allocation starts at the lower of the two pointers */
    if (inplace || op == OP_BCAST) {
        char *base = op == OP_AG ? rbuf : sbuf;
        if (rdev)
            fake_dev_free(&fd, base);
        else
            free(base);
    } else {
        if (sdev)
            fake_dev_free(&fd, sbuf);
        else
            free(sbuf);
        if (rdev)
            fake_dev_free(&fd, rbuf);
        else
            free(rbuf);
    }
    free(orig);
    return o;
}

/* The copies a device run must make (comm_stage.c's table). */
static void expect_copies(opkind op, size_t count, size_t es, int n, int me, int root, int on_dev,
                          counts *e) {
    memset(e, 0, sizeof *e);
    if (count == 0) return;
    size_t b = count * es, sb = op == OP_RS ? b * (size_t)n : b,
           rb = op == OP_AG ? b * (size_t)n : b;
    int sdev = on_dev == 1 || on_dev == 3, rdev = on_dev == 1 || on_dev == 2;
    if (op == OP_BCAST) {
        if (me == root)
            e->th = 1, e->bth = (long)b;
        else
            e->td = 1, e->btd = (long)b;
        return;
    }
    if (sdev) e->th = 1, e->bth = (long)sb;
    if (rdev) e->td = 1, e->btd = (long)rb;
}

/* Check a host result against values computed from every rank's inputs. */
static int check_result(comm_group *g, opkind op, comm_dtype dt, size_t count, int k,
                        const void *res) {
    int n = comm_group_size(g), me = comm_group_rank(g), bad = 0;
    size_t total = op == OP_AG ? count * (size_t)n : count;
    for (size_t i = 0; i < total && bad < 5; i++) {
        double want = 0, m = 0, got = get(res, dt, i), tol = 0;
        if (op == OP_ALLREDUCE || op == OP_RS || op == OP_MAX) {
            size_t j = op == OP_RS ? (size_t)me * count + i : i;
            want = op == OP_MAX ? -INFINITY : 0;
            for (int r = 0; r < n; r++) {
                double x = gen(comm_group_global_rank(g, r), k, j, dt);
                if (op == OP_MAX)
                    want = x > want ? x : want;
                else
                    want += x, m += fabs(x);
            }
            if (op != OP_MAX && dt == COMM_BF16 && n == 2) {
                /* one combining step, the op exactly: fp32 add, round once */
                want = ms_bf16_to_f32(ms_f32_to_bf16(gen(comm_group_global_rank(g, 0), k, j, dt) +
                                                     gen(comm_group_global_rank(g, 1), k, j, dt)));
            } else if (op != OP_MAX && dt == COMM_BF16) {
                want = ms_bf16_to_f32(d2bf(want));
                tol = (n - 1) * ulp_bf16(m);
            } else if (op != OP_MAX) {
                tol = 1e-5 * (1 + m);
            }
        } else if (op == OP_AG) {
            want = gen(comm_group_global_rank(g, (int)(i / count)), k, i % count, dt);
        } else {
            want = gen(comm_group_global_rank(g, k % n), k, i, dt);
        }
        if (!(fabs(got - want) <= tol)) {
            bad++;
            fprintf(stderr, "r%d %s %s count %zu [%zu]: got %.9g, want %.9g (tol %.3g)\n", R,
                    op_names[op], comm_dtype_name(dt), count, i, got, want, tol);
        }
    }
    return bad;
}

/* Every rank got the same bits (all-gather of the results over MPI). */
static int same_on_all_ranks(comm_group *g, const void *res, size_t bytes) {
    int n = comm_group_size(g);
    char *all = xmalloc(bytes * (size_t)n);
    T_EQ_INT(comm_allgather(g, res, all, bytes, COMM_U8), MS_OK);
    int same = 1;
    for (int r = 0; r < n; r++)
        same &= memcmp(all + (size_t)r * bytes, res, bytes) == 0;
    free(all);
    return same;
}

/* One case: host run, device run(s), compare. */
static void test_case(comm_group *g, opkind op, comm_dtype dt, size_t count, int inplace, int k) {
    int n = comm_group_size(g), me = comm_group_rank(g);
    run_out h = run_op(g, op, dt, count, inplace, 0, k);
    T_EQ_INT(h.copies.th + h.copies.td + h.copies.allocs, 0); /* host buffers: nothing */
    int bad = check_result(g, op, dt, count, k, h.res);
    T_EQ_INT(bad, 0);
    if (op == OP_ALLREDUCE || op == OP_MAX) T_OK(same_on_all_ranks(g, h.res, h.bytes));
    int modes = inplace || op == OP_BCAST ? 1 : 3;
    for (int m = 1; m <= modes; m++) {
        run_out d = run_op(g, op, dt, count, inplace, m, k);
        counts e;
        expect_copies(op, count, comm_dtype_size(dt), n, me, k % n, m, &e);
        int same = d.bytes == h.bytes && memcmp(d.res, h.res, h.bytes) == 0;
        int copies_ok = d.copies.th == e.th && d.copies.td == e.td && d.copies.bth == e.bth &&
                        d.copies.btd == e.btd;
        T_OK(same);
        T_OK(copies_ok);
        T_OK(d.send_kept);
        if (!same || !copies_ok || !d.send_kept)
            fprintf(stderr,
                    "r%d %s %s count %zu%s mode %d: same %d send kept %d; copies to host %ld "
                    "(%ld B), to device %ld (%ld B); expected %ld (%ld B), %ld (%ld B)\n",
                    R, op_names[op], comm_dtype_name(dt), count, inplace ? " in place" : "", m,
                    same, d.send_kept, d.copies.th, d.copies.bth, d.copies.td, d.copies.btd, e.th,
                    e.bth, e.td, e.btd);
        free(d.res);
    }
    free(h.res);
}

static void test_collectives(comm_group *g) {
    size_t counts_[] = {0, 1, 7, 1000, 65537};
    comm_dtype dts[] = {COMM_F32, COMM_BF16};
    int k = 1;
    for (int c = 0; c < 5; c++)
        for (int d = 0; d < 2; d++)
            for (int ip = 0; ip < 2; ip++) {
                test_case(g, OP_ALLREDUCE, dts[d], counts_[c], ip, k++);
                test_case(g, OP_RS, dts[d], counts_[c], ip, k++);
                test_case(g, OP_AG, dts[d], counts_[c], ip, k++);
                if (!ip) test_case(g, OP_BCAST, dts[d], counts_[c], 0, k++);
            }
    test_case(g, OP_MAX, COMM_BF16, 4099, 1, k++);
    test_case(g, OP_MAX, COMM_BF16, 4099, 0, k++);
}

/* ---- send / recv ----------------------------------------------------------- */

/* Ring (recv from rank-1 and send to rank+1, both started before either is
 * waited) with the send and recv buffers on the device or not. */
static void test_ring(comm_group *g, size_t count, int sdev, int rdev) {
    int n = comm_group_size(g), me = comm_group_rank(g);
    int to = (me + 1) % n, from = (me + n - 1) % n;
    float *s = sdev ? fake_dev_alloc(&fd, count * 4) : xmalloc(count * 4);
    float *r = rdev ? fake_dev_alloc(&fd, count * 4) : xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        s[i] = gen(R, 90, i, COMM_F32), r[i] = -1;
    counts c0 = snap();
    comm_req *rq[2] = {NULL, NULL};
    T_EQ_INT(comm_recv_start(g, r, count, COMM_F32, from, 4, &rq[0]), MS_OK);
    T_EQ_INT(comm_send_start(g, s, count, COMM_F32, to, 4, &rq[1]), MS_OK);
    T_EQ_INT(comm_wait_all(rq, 2), MS_OK);
    counts d = diff(c0, snap());
    T_EQ_INT(d.th, sdev && count);
    T_EQ_INT(d.td, rdev && count);
    T_EQ_INT(d.bth, sdev ? (long)count * 4 : 0);
    T_EQ_INT(d.btd, rdev ? (long)count * 4 : 0);
    int bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += r[i] != gen(comm_group_global_rank(g, from), 90, i, COMM_F32);
    T_EQ_INT(bad, 0);
    if (sdev)
        fake_dev_free(&fd, s);
    else
        free(s);
    if (rdev)
        fake_dev_free(&fd, r);
    else
        free(r);
}

/* A short message into a staged recv copies back what arrived (MS_ERR_RANGE)
 * and leaves the rest; a truncated one (MPI error) copies nothing. */
static void test_p2p_errors(comm_group *g) {
    if (N < 2) return;
    int32_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    if (R == 0) {
        T_EQ_INT(comm_send(g, buf, 8, COMM_I32, 1, 5), MS_OK);
        T_EQ_INT(comm_send(g, buf, 4, COMM_I32, 1, 6), MS_OK);
    } else if (R == 1) {
        int32_t *got = fake_dev_alloc(&fd, 8 * 4);
        for (int i = 0; i < 8; i++)
            got[i] = -7;
        counts c0 = snap();
        T_EQ_INT(comm_recv(g, got, 4, COMM_I32, 0, 5), MS_ERR_INTERNAL);
        T_STR_CONTAINS(ms_errmsg(), "truncat");
        T_EQ_INT(diff(c0, snap()).td, 0);
        T_EQ_INT(got[0], -7);
        c0 = snap();
        T_EQ_INT(comm_recv(g, got, 8, COMM_I32, 0, 6), MS_ERR_RANGE);
        T_STR_CONTAINS(ms_errmsg(), "received 4 elements, expected 8");
        counts d = diff(c0, snap());
        T_EQ_INT(d.td, 1);
        T_EQ_INT(d.btd, 16);
        T_EQ_INT(got[3], 4);
        T_EQ_INT(got[4], -7);
        fake_dev_free(&fd, got);
    }
    T_EQ_INT(comm_barrier(g), MS_OK);
}

/* ---- pool, comm_test, failures, host-only ----------------------------------- */

/* One "training step": ops of several sizes in flight at once, waited in
 * reverse order, all on device buffers. */
static void step(comm_group *g, void **bufs) {
    int n = comm_group_size(g), me = comm_group_rank(g);
    comm_req *rq[6] = {0};
    T_EQ_INT(comm_allreduce_start(g, bufs[0], bufs[0], 1000, COMM_F32, COMM_SUM, &rq[0]), MS_OK);
    T_EQ_INT(comm_reduce_scatter_start(g, bufs[1], (char *)bufs[1] + (size_t)me * 5000 * 2, 5000,
                                       COMM_BF16, COMM_SUM, &rq[1]),
             MS_OK);
    T_EQ_INT(comm_allgather_start(g, bufs[2], bufs[3], 3000, COMM_F32, &rq[2]), MS_OK);
    T_EQ_INT(comm_broadcast_start(g, bufs[4], 777, COMM_BF16, n - 1, &rq[3]), MS_OK);
    T_EQ_INT(comm_recv_start(g, bufs[5], 100, COMM_F32, (me + n - 1) % n, 1, &rq[4]), MS_OK);
    T_EQ_INT(comm_send_start(g, bufs[6], 100, COMM_F32, (me + 1) % n, 1, &rq[5]), MS_OK);
    for (int i = 5; i >= 0; i--)
        T_EQ_INT(comm_wait(rq[i]), MS_OK);
}

static void test_pool(comm_group *g) {
    int n = comm_group_size(g);
    size_t sizes[7] = {
        1000 * 4, 5000 * 2 * (size_t)n, 3000 * 4, 3000 * 4 * (size_t)n, 777 * 2, 100 * 4, 100 * 4};
    void *bufs[7];
    for (int i = 0; i < 7; i++) {
        bufs[i] = fake_dev_alloc(&fd, sizes[i]);
        memset(bufs[i], 0, sizes[i]);
    }
    step(g, bufs);
    long warm = snap().allocs;
    for (int it = 0; it < 3; it++)
        step(g, bufs);
    T_EQ_INT(snap().allocs, warm);
    if (R == 0)
        printf("pool: %ld pinned buffers after warm-up, none added in 3 more steps\n", warm);
    for (int i = 0; i < 7; i++)
        fake_dev_free(&fd, bufs[i]);
}

/* comm_test says done without copying; comm_wait copies. */
static void test_no_copy_in_test(comm_group *g) {
    size_t count = 65537;
    float *x = fake_dev_alloc(&fd, count * 4), *want = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        x[i] = gen(R, 95, i, COMM_F32), want[i] = x[i];
    T_EQ_INT(comm_allreduce(g, want, want, count, COMM_F32, COMM_SUM), MS_OK); /* host: reference */
    for (size_t i = 0; i < count; i++)
        x[i] = gen(R, 95, i, COMM_F32);
    float *before = xmalloc(count * 4);
    memcpy(before, x, count * 4);
    comm_req *rq = NULL;
    T_EQ_INT(comm_allreduce_start(g, x, x, count, COMM_F32, COMM_SUM, &rq), MS_OK);
    counts c0 = snap();
    int done = 0, polls = 0;
    double t0 = ms_now();
    while (!done && ms_now() - t0 < 30) {
        T_EQ_INT(comm_test(rq, &done), MS_OK);
        polls++;
        if (!done) usleep(200);
    }
    T_OK(done);
    for (int i = 0; i < 3; i++) /* and again after done */
        T_EQ_INT(comm_test(rq, &done), MS_OK);
    T_EQ_INT(diff(c0, snap()).td, 0);
    T_OK(memcmp(x, before, count * 4) == 0);
    T_EQ_INT(comm_wait(rq), MS_OK);
    T_EQ_INT(diff(c0, snap()).td, 1);
    T_OK(memcmp(x, want, count * 4) == 0);
    fake_dev_free(&fd, x);
    free(want), free(before);
}

/* A pinned allocation that fails: MS_ERR_NOMEM naming the op, no handle,
 * the world still works (every rank fails the same way before posting). */
static void test_alloc_failure(comm_group *g) {
    size_t count = 3000001; /* a size class no other test uses */
    float *x = fake_dev_alloc(&fd, count * 4);
    memset(x, 0, count * 4);
    fd.fail_allocs = 1;
    comm_req *rq = (comm_req *)1;
    counts c0 = snap();
    T_EQ_INT(comm_allreduce_start(g, x, x, count, COMM_F32, COMM_SUM, &rq), MS_ERR_NOMEM);
    T_STR_CONTAINS(ms_errmsg(), "pinned staging memory");
    T_STR_CONTAINS(ms_errmsg(), "all_reduce");
    T_OK(rq == NULL);
    T_EQ_INT(diff(c0, snap()).th, 0);
    fd.fail_allocs = 0;
    T_OK(!comm_world_broken(comm_group_world(g)));
    T_EQ_INT(comm_allreduce(g, x, x, count, COMM_F32, COMM_SUM), MS_OK);
    fake_dev_free(&fd, x);
}

/* Without hooks device pointers go to MPI as they are (the fake's memory
 * is host memory, so the op still works) and the pool was freed. */
static void test_host_only(comm_world *w, comm_group *g) {
    T_EQ_INT(comm_world_set_device(w, NULL), MS_OK);
    T_EQ_INT(fd.host_frees, fd.host_allocs); /* the whole pool went back */
    T_EQ_INT(fd.npin, 0);
    run_out d = run_op(g, OP_ALLREDUCE, COMM_F32, 1000, 0, 1, 7);
    T_EQ_INT(d.copies.th + d.copies.td + d.copies.allocs, 0);
    T_EQ_INT(check_result(g, OP_ALLREDUCE, COMM_F32, 1000, 7, d.res), 0);
    free(d.res);
    comm_device bad = dev;
    bad.to_device = NULL;
    T_EQ_INT(comm_world_set_device(w, &bad), MS_ERR_ARG);
    T_EQ_INT(comm_world_set_device(w, &dev), MS_OK);
}

/* comm_group_enable_nccl where it cannot work (NCCL not built in, or no
 * GPU here) fails the same way on every rank and leaves the group on MPI.
 * (On a machine where it works, it works: the fake-device ops above stay
 * on MPI anyway, their memory is not CUDA memory.) */
static void test_enable_nccl(comm_group *g) {
    ms_status st = comm_group_enable_nccl(g, NULL);
    if (R == 0) printf("comm_group_enable_nccl: %s\n", st == MS_OK ? "enabled" : ms_errmsg());
    if (st != MS_OK) {
        T_EQ_INT(st, MS_ERR_INTERNAL);
        T_OK(!comm_group_has_nccl(g));
    }
    T_OK(!comm_world_broken(comm_group_world(g)));
    int32_t ok = st == MS_OK, all = 0;
    T_EQ_INT(comm_allreduce(g, &ok, &all, 1, COMM_I32, COMM_SUM), MS_OK);
    T_OK(all == 0 || all == comm_group_size(g)); /* the same answer everywhere */
}

/* ---- timeout mode ------------------------------------------------------------ */

static int run_timeout(comm_world *w) {
    comm_group *g = comm_world_group(w);
    comm_world_set_timeout(w, 1.0);
    float *x = fake_dev_alloc(&fd, 64 * 4);
    for (int i = 0; i < 64; i++)
        x[i] = 5;
    counts c0 = snap();
    double t0 = ms_now();
    ms_status st = comm_recv(g, x, 64, COMM_F32, R, 9); /* never sent */
    double el = ms_now() - t0;
    T_EQ_INT(st, MS_ERR_TIMEOUT);
    T_STR_CONTAINS(ms_errmsg(), "recv from rank");
    T_STR_CONTAINS(ms_errmsg(), "timed out");
    T_OK(el < 4.0);
    T_EQ_INT(diff(c0, snap()).td, 0);
    T_EQ_INT(x[0], 5);
    T_OK(comm_world_broken(w));
    c0 = snap();
    T_EQ_INT(comm_allreduce(g, x, x, 64, COMM_F32, COMM_SUM), MS_ERR_TIMEOUT);
    T_STR_CONTAINS(ms_errmsg(), "world broken");
    T_EQ_INT(diff(c0, snap()).th, 0); /* refused before copying */
    T_EQ_INT(comm_world_finalize(w), MS_ERR_TIMEOUT);
    T_EQ_INT(fd.host_allocs - fd.host_frees, 1); /* the recv's buffer stays with MPI */
    T_EQ_INT(fd.wrong_thread, 0);
    T_EQ_INT(fd.bad_copy, 0);
    int rc = ms_test_summary("test_comm_device timeout");
    fflush(stdout);
    fflush(stderr);
    _exit(rc); /* MPI is not finalised */
}

int main(int argc, char **argv) {
    ms_ctx_init();
    comm_world *w = NULL;
    comm_options co = ms_test_comm_options(); /* MS_COMM_TIMEOUT, MS_COMM_NCCL_SYNC */
    if (comm_world_init(&w, &argc, &argv, &co) != MS_OK) {
        fprintf(stderr, "test_comm_device: comm_world_init: %s\n", ms_errmsg());
        return 1;
    }
    R = comm_world_rank(w), N = comm_world_size(w);
    comm_group *g = comm_world_group(w);
    fake_dev_init(&fd, &dev);
    T_EQ_INT(comm_world_set_device(w, &dev), MS_OK);
    const char *s = getenv("MS_TEST_SEED");
    seed = s ? strtoull(s, NULL, 10) : (uint64_t)(ms_wall_now() * 1e6);
    T_EQ_INT(comm_broadcast(g, &seed, 8, COMM_U8, 0), MS_OK);
    if (argc > 1 && !strcmp(argv[1], "timeout")) return run_timeout(w);
    if (R == 0) printf("test_comm_device: %d ranks, seed %llu\n", N, (unsigned long long)seed);
    test_collectives(g);
    for (int m = 0; m < 4; m++)
        test_ring(g, m == 3 ? 100003 : 1000, m & 1, (m >> 1) & 1);
    test_ring(g, 1, 1, 1);
    test_p2p_errors(g);
    test_pool(g);
    test_no_copy_in_test(g);
    test_alloc_failure(g);
    test_host_only(w, g);
    test_enable_nccl(g);
    T_EQ_INT(comm_barrier(g), MS_OK);
    T_EQ_INT(comm_world_finalize(w), MS_OK);
    T_EQ_INT(fd.host_frees, fd.host_allocs); /* finalize freed the pool */
    T_EQ_INT(fd.wrong_thread, 0);
    T_EQ_INT(fd.bad_copy, 0);
    T_EQ_INT(fd.ndev, 0);
    fake_dev_destroy(&fd);
    char name[64];
    snprintf(name, sizeof name, "test_comm_device r%d/%d", R, N);
    return ms_test_summary(name);
}
