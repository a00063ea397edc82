/* test_comm_nccl.c - the NCCL path (comm_group_enable_nccl) and the MPI
 * staging path on real GPUs, against the MPI path on host copies.  Built
 * only with NCCL (MS_HAVE_NCCL); exits 77 ("SKIP: no GPU (...)") when
 * cudaGetDeviceCount finds none.  Run directly (a world of 1) or under
 * mpirun: rank r uses GPU (local rank % GPUs).
 *  - Enabling NCCL on the world succeeds when every rank has its own GPU,
 *    and otherwise fails on every rank with the "same GPU" error; the tests
 *    then use groups whose members have distinct GPUs (world rank / GPUs).
 *  - On the NCCL group: all-reduce (f32 sum, bf16 sum, f32 max), reduce-
 *    scatter and all-gather (in place and not), broadcast from every root,
 *    and a send/recv ring started back to back, on device buffers, compared
 *    with the same op over MPI on host buffers (f32 sums to 1e-5 relative,
 *    bf16 sums within (n-1) bf16 ulps of sum|x|, the rest bit for bit); none
 *    of them goes through the staging hooks (counted).  The inputs are
 *    written by cudaMemcpyAsync on the compute stream behind a long
 *    cudaMemsetAsync, and the results read back on the compute stream, so a
 *    missing stream dependency shows as wrong values.
 *  - The MPI staging path with real pinned memory (cudaMallocHost) on a
 *    group without NCCL: an all-reduce on device buffers is staged and
 *    right.
 * MS_COMM_NCCL_SYNC=1 runs the same with host-blocking waits.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "base/ctx.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "check.h"
#include "comm/comm.h"
#include "comm/env_options.h"

static uint64_t seed;
static int R, N;
static cudaStream_t cs; /* the compute stream */
static void *delay_buf; /* target of the long memset that delays cs */
static size_t delay_bytes;
static long staged_copies;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- the real device hooks (MPI staging path) ----------------------------- */

static int cu_is_device(void *ctx, const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
static void cu_to_host(void *ctx, void *dst, const void *src, size_t n) {
    staged_copies++;
    CK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}
static void cu_to_device(void *ctx, void *dst, const void *src, size_t n) {
    staged_copies++;
    CK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
}
static void *cu_host_alloc(void *ctx, size_t n) {
    void *p = NULL;
    return cudaMallocHost(&p, n) == cudaSuccess ? p : NULL;
}
static void cu_host_free(void *ctx, void *p) {
    cudaFreeHost(p);
}

/* ---- data ------------------------------------------------------------------- */

static double ulp_bf16(double m) {
    int e;
    if (m <= 0) return 0;
    frexp(m, &e);
    return ldexp(1.0, e - 8);
}
static float gen(int r, int k, size_t i) {
    return ms_rng_normal(seed, (uint64_t)r * 1000 + (uint64_t)k, i) * 3.0f;
}
static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) abort();
    return p;
}

/* Host buffer -> new device buffer, written on the compute stream behind a
 * long memset (so an op that does not wait for cs reads garbage). */
static void *to_dev(const void *h, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    CK(cudaMemset(d, 0xFF, bytes ? bytes : 1));
    CK(cudaDeviceSynchronize());
    CK(cudaMemsetAsync(delay_buf, 0, delay_bytes, cs));
    CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, cs));
    return d;
}
/* Device -> host on the compute stream (after comm_wait). */
static void from_dev(void *h, const void *d, size_t bytes) {
    CK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, cs));
    CK(cudaStreamSynchronize(cs));
}

/* Compare the device result with the MPI one: bit for bit, or for sums the
 * tolerance (f32 1e-5 relative; bf16 (n-1) ulp of sum |x|). */
static int compare(const char *what, comm_dtype dt, const void *got, const void *want, size_t count,
                   int sum, const float *abs_sum, int n) {
    int bad = 0;
    for (size_t i = 0; i < count && bad < 5; i++) {
        double a =
            dt == COMM_BF16 ? ms_bf16_to_f32(((const uint16_t *)got)[i]) : ((const float *)got)[i];
        double b = dt == COMM_BF16 ? ms_bf16_to_f32(((const uint16_t *)want)[i])
                                   : ((const float *)want)[i];
        double tol = !sum              ? 0
                     : dt == COMM_BF16 ? 2.0 * (n - 1) * ulp_bf16(abs_sum[i]) + 1e-30
                                       : 1e-5 * (1 + abs_sum[i]);
        if (!(fabs(a - b) <= tol)) {
            bad++;
            fprintf(stderr, "r%d %s [%zu]: nccl %.9g, mpi %.9g (tol %.3g)\n", R, what, i, a, b,
                    tol);
        }
    }
    return bad;
}

typedef enum { T_AR, T_RS, T_AG, T_BC } tkind;

/* One collective on g: NCCL on device buffers vs MPI on host buffers. */
static void one(comm_group *g, tkind t, comm_dtype dt, comm_redop op, size_t count, int inplace,
                int k) {
    int n = comm_group_size(g), me = comm_group_rank(g), gr = comm_group_global_rank(g, me);
    size_t es = comm_dtype_size(dt), sn = t == T_RS ? count * (size_t)n : count;
    size_t rn = t == T_AG ? count * (size_t)n : count, big = sn > rn ? sn : rn;
    int root = k % n;
    char *hin = xmalloc(big * es), *href = xmalloc(big * es), *hgot = xmalloc(big * es);
    float *abs_sum = xmalloc(count * 4 + 4);
    for (size_t i = 0; i < sn; i++) {
        float x = gen(gr, k, i);
        if (dt == COMM_BF16)
            ((uint16_t *)hin)[i] = ms_f32_to_bf16(x);
        else
            ((float *)hin)[i] = x;
    }
    for (size_t i = 0; i < count; i++) {
        size_t j = t == T_RS ? (size_t)me * count + i : i;
        for (int r = 0; r < n; r++) {
            float x = gen(comm_group_global_rank(g, r), k, j);
            abs_sum[i] += fabsf(dt == COMM_BF16 ? ms_bf16_to_f32(ms_f32_to_bf16(x)) : x);
        }
    }
    /* MPI on host copies (out of place) */
    ms_status st = MS_OK;
    memcpy(href, hin, sn * es);
    if (t == T_AR) st = comm_allreduce(g, hin, href, count, dt, op);
    if (t == T_RS) st = comm_reduce_scatter(g, hin, href, count, dt, op);
    if (t == T_AG) st = comm_allgather(g, hin, href, count, dt);
    if (t == T_BC) st = comm_broadcast(g, href, count, dt, root);
    T_EQ_INT(st, MS_OK);
    /* NCCL on device buffers, laid out as the in-place variants say */
    char *d = NULL, *dout = NULL, *dsend, *drecv;
    if (t == T_AG && inplace) {
        char *h = xmalloc(rn * es);
        memcpy(h + (size_t)me * count * es, hin, count * es);
        d = to_dev(h, rn * es);
        free(h);
        dsend = d + (size_t)me * count * es, drecv = d;
    } else {
        d = to_dev(hin, sn * es);
        dsend = d;
        if (inplace || t == T_BC) {
            drecv = t == T_RS ? d + (size_t)me * count * es : d;
        } else {
            CK(cudaMalloc((void **)&dout, rn * es));
            drecv = dout;
        }
    }
    long c0 = staged_copies;
    comm_req *rq = NULL;
    if (t == T_AR) st = comm_allreduce_start(g, dsend, drecv, count, dt, op, &rq);
    if (t == T_RS) st = comm_reduce_scatter_start(g, dsend, drecv, count, dt, op, &rq);
    if (t == T_AG) st = comm_allgather_start(g, dsend, drecv, count, dt, &rq);
    if (t == T_BC) st = comm_broadcast_start(g, drecv, count, dt, root, &rq);
    T_EQ_INT(st, MS_OK);
    T_EQ_INT(comm_wait(rq), MS_OK);
    T_EQ_INT(staged_copies, c0); /* NCCL, not staged */
    from_dev(hgot, drecv, rn * es);
    char what[96];
    snprintf(what, sizeof what, "kind %d %s op %d count %zu%s", (int)t, comm_dtype_name(dt),
             (int)op, count, inplace ? " in place" : "");
    T_EQ_INT(
        compare(what, dt, hgot, href, rn, (t == T_AR || t == T_RS) && op == COMM_SUM, abs_sum, n),
        0);
    CK(cudaFree(d));
    if (dout) CK(cudaFree(dout));
    free(hin), free(href), free(hgot), free(abs_sum);
}

/* Ring on device buffers: recv then send started back to back, both waited
 * together (they must be launched as one NCCL group). */
static void ring(comm_group *g, size_t count) {
    int n = comm_group_size(g), me = comm_group_rank(g);
    int to = (me + 1) % n, from = (me + n - 1) % n;
    float *h = xmalloc(count * 4), *got = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        h[i] = gen(comm_group_global_rank(g, me), 77, i);
    float *ds = to_dev(h, count * 4), *dr = NULL;
    CK(cudaMalloc((void **)&dr, count * 4));
    comm_req *rq[2] = {NULL, NULL};
    T_EQ_INT(comm_recv_start(g, dr, count, COMM_F32, from, 0, &rq[0]), MS_OK);
    T_EQ_INT(comm_send_start(g, ds, count, COMM_F32, to, 0, &rq[1]), MS_OK);
    T_EQ_INT(comm_wait_all(rq, 2), MS_OK);
    from_dev(got, dr, count * 4);
    int bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += got[i] != gen(comm_group_global_rank(g, from), 77, i);
    T_EQ_INT(bad, 0);
    CK(cudaFree(ds));
    CK(cudaFree(dr));
    free(h), free(got);
}

static void test_nccl_group(comm_group *g) {
    size_t counts[] = {1, 1000, 65537, 1 << 22};
    int k = 1;
    for (int c = 0; c < 4; c++)
        for (int ip = 0; ip < 2; ip++) {
            one(g, T_AR, COMM_F32, COMM_SUM, counts[c], ip, k++);
            one(g, T_AR, COMM_BF16, COMM_SUM, counts[c], ip, k++);
            one(g, T_AR, COMM_F32, COMM_MAX, counts[c], ip, k++);
            one(g, T_RS, COMM_F32, COMM_SUM, counts[c], ip, k++);
            one(g, T_RS, COMM_BF16, COMM_SUM, counts[c], ip, k++);
            one(g, T_AG, COMM_BF16, COMM_SUM, counts[c], ip, k++);
            one(g, T_AG, COMM_F32, COMM_SUM, counts[c], ip, k++);
        }
    for (int root = 0; root < comm_group_size(g); root++)
        one(g, T_BC, COMM_F32, COMM_SUM, 4099, 0, root); /* k % n == root */
    ring(g, 1);
    ring(g, 100003);
    /* several in flight, waited in reverse order */
    float *d[4];
    comm_req *rq[4];
    for (int i = 0; i < 4; i++) {
        CK(cudaMalloc((void **)&d[i], 4096 * 4));
        CK(cudaMemset(d[i], 0, 4096 * 4));
    }
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < 4; i++)
        T_EQ_INT(comm_allreduce_start(g, d[i], d[i], 4096, COMM_F32, COMM_SUM, &rq[i]), MS_OK);
    int done = 0;
    T_EQ_INT(comm_test(rq[3], &done), MS_OK);
    for (int i = 3; i >= 0; i--)
        T_EQ_INT(comm_wait(rq[i]), MS_OK);
    CK(cudaStreamSynchronize(cs));
    for (int i = 0; i < 4; i++)
        CK(cudaFree(d[i]));
}

/* MPI staging with real pinned memory, on a group without NCCL. */
static void test_staged(comm_group *g) {
    size_t count = 100000;
    int n = comm_group_size(g);
    float *h = xmalloc(count * 4), *got = xmalloc(count * 4), *d = NULL;
    for (size_t i = 0; i < count; i++)
        h[i] = gen(R, 99, i);
    CK(cudaMalloc((void **)&d, count * 4));
    CK(cudaMemcpy(d, h, count * 4, cudaMemcpyHostToDevice));
    long c0 = staged_copies;
    T_EQ_INT(comm_allreduce(g, d, d, count, COMM_F32, COMM_SUM), MS_OK);
    T_EQ_INT(staged_copies - c0, 2);
    CK(cudaMemcpy(got, d, count * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        double s = 0;
        for (int r = 0; r < n; r++)
            s += gen(comm_group_global_rank(g, r), 99, i);
        bad += fabs(got[i] - s) > 1e-5 * (1 + fabs(s));
    }
    T_EQ_INT(bad, 0);
    CK(cudaFree(d));
    free(h), free(got);
}

int main(int argc, char **argv) {
    int ngpu = 0;
    cudaError_t e = cudaGetDeviceCount(&ngpu);
    if (e != cudaSuccess || ngpu == 0) {
        printf("SKIP: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    int local = lr ? atoi(lr) : 0;
    CK(cudaSetDevice(local % ngpu));
    ms_ctx_init();
    comm_world *w = NULL;
    comm_options co = ms_test_comm_options(); /* MS_COMM_TIMEOUT, MS_COMM_NCCL_SYNC */
    if (comm_world_init(&w, &argc, &argv, &co) != MS_OK) {
        fprintf(stderr, "test_comm_nccl: comm_world_init: %s\n", ms_errmsg());
        return 1;
    }
    R = comm_world_rank(w), N = comm_world_size(w);
    comm_group *world = comm_world_group(w);
    comm_device dev = {NULL, cu_is_device, cu_to_host, cu_to_device, cu_host_alloc, cu_host_free};
    T_EQ_INT(comm_world_set_device(w, &dev), MS_OK);
    seed = (uint64_t)(ms_wall_now() * 1e6);
    T_EQ_INT(comm_broadcast(world, &seed, 8, COMM_U8, 0), MS_OK);
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    delay_bytes = (size_t)1 << 30;
    CK(cudaMalloc(&delay_buf, delay_bytes));
    if (R == 0) printf("test_comm_nccl: %d ranks, %d GPUs\n", N, ngpu);

    /* The world: NCCL if every rank has its own GPU (one host assumed). */
    int shared = N > ngpu;
    ms_status st = comm_group_enable_nccl(world, cs);
    if (shared) {
        T_EQ_INT(st, MS_ERR_INTERNAL);
        T_STR_CONTAINS(ms_errmsg(), "use the same GPU");
        T_OK(!comm_group_has_nccl(world));
        test_staged(world); /* still usable over MPI, staged */
    } else {
        T_EQ_INT(st, MS_OK);
        if (st != MS_OK) fprintf(stderr, "enable on world: %s\n", ms_errmsg());
        T_EQ_INT(comm_group_enable_nccl(world, cs), MS_ERR_ARG); /* twice */
    }
    comm_group *g = world, *sub = NULL;
    if (shared) {
        T_EQ_INT(comm_group_create_split(world, R / ngpu, R, "distinct-gpus", &sub), MS_OK);
        g = sub;
        st = comm_group_enable_nccl(g, cs);
        T_EQ_INT(st, MS_OK);
        if (st != MS_OK) fprintf(stderr, "enable on split: %s\n", ms_errmsg());
    }
    if (g && comm_group_has_nccl(g)) test_nccl_group(g);
    comm_group_destroy(sub);
    T_EQ_INT(comm_barrier(world), MS_OK);
    T_EQ_INT(comm_world_finalize(w), MS_OK);
    CK(cudaFree(delay_buf));
    CK(cudaStreamDestroy(cs));
    char name[64];
    snprintf(name, sizeof name, "test_comm_nccl r%d/%d", R, N);
    return ms_test_summary(name);
}
