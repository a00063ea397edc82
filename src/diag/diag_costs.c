/* diag_costs.c - the cost table of this machine for the planner (`megascale
 * plan measure`): the backend's GEMM speed by size, its operator overhead,
 * element-wise and optimizer throughput, attention speed, memory copy and
 * storage bandwidth (one process), or the communicator's all-reduce latency
 * and bandwidth and group creation time (under mpirun).  Each figure is the
 * median of several timed runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/ctx.h"
#include "base/fileio.h"
#include "base/timeutil.h"
#include "comm/comm.h"
#include "comm/grid.h"
#include "diag/diag.h"

#define REPS 3
/* An op's repetitions are cut to about this long, and an op this long or
 * longer is timed by its one warm-up call. */
#define OP_BUDGET_S 0.05
/* Floats in each of the compute measurement's buffers, at least (16 MB). */
#define BIG_FLOATS ((size_t)1 << 22)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double min_of(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] < m) m = v[i];
    return m;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds of one call of fn(arg), median over REPS runs of `inner` calls. */
typedef void (*timed_fn)(be_backend *be, void *arg);
static double time_op(be_backend *be, timed_fn fn, void *arg, int inner) {
    double t[REPS];
    be->sync(be);
    double w0 = ms_now();
    fn(be, arg); /* warm caches and scratch */
    be->sync(be);
    double warm = ms_now() - w0;
    /* an op this slow (a large attention shape) is its own measurement: caches do not
     * matter at this length, and 3 x inner more calls of every pass would take minutes */
    if (warm >= OP_BUDGET_S) return warm;
    if (warm * inner > OP_BUDGET_S) inner = (int)(OP_BUDGET_S / warm) + 1;
    for (int r = 0; r < REPS; r++) {
        be->sync(be);
        double t0 = ms_now();
        for (int i = 0; i < inner; i++)
            fn(be, arg);
        be->sync(be);
        t[r] = (ms_now() - t0) / inner;
    }
    return median(t, REPS);
}

typedef struct {
    int M, N, K, layout; /* layout: 0 forward (NN), 1 dgrad (NT), 2 wgrad (TN) */
    float *a, *b, *c, *d;
    size_t n, pool; /* pool: floats in each of a, b, c, d */
    unsigned turn;  /* do_gemm's calls so far: which operand slot it takes */
    int B, T, C, NH;
    float *x_in, *x_out; /* the shared-rate exchange's host buffers */
} op_arg;

/* One product, its operands the next slot of the pools.  In a step an operand was last touched
 * an operator or more ago, and a core's own cache (L2) holds about one operator's operands, so
 * a small product timed on the same operands over and over would run from a cache it does not
 * have in a step.  The slots cycle through pools of several L2s each (operand_pool): each
 * call's operands are out of the core's cache, and where the last-level cache is larger, in
 * it, as in a step (docs/planning.md: pools larger than the last-level cache overshot). */
static void do_gemm(be_backend *be, void *p) {
    op_arg *o = p;
    int ta = o->layout == 2, tb = o->layout == 1;
    size_t sa = (size_t)o->M * o->K, sb = (size_t)o->K * o->N, sc = (size_t)o->M * o->N;
    size_t most = sa > sb ? sa : sb, slots = o->pool / (most > sc ? most : sc);
    size_t k = slots > 1 ? o->turn++ % slots : 0;
    be->gemm(be, ta, tb, o->M, o->N, o->K, 1.0f, o->a + k * sa, ta ? o->M : o->K, o->b + k * sb,
             tb ? o->K : o->N, 0.0f, o->c + k * sc, o->N, 0, NULL, BE_EPI_NONE, NULL);
}

/* GFLOP/s of an (M x K)(K x N) product, the mean time over the three layouts a layer's passes
 * use (forward, input gradient, weight gradient). */
static double gemm_rate(be_backend *be, op_arg *o, int M, int N, int K) {
    double flops = 2.0 * M * N * K, t = 0;
    int inner = (int)fmin(500, fmax(1, 1e8 / flops)); /* ~2 ms at 50 GFLOP/s */
    o->M = M, o->N = N, o->K = K;
    for (o->layout = 0; o->layout < 3; o->layout++)
        t += time_op(be, do_gemm, o, inner) / 3;
    o->layout = 0;
    return flops / t / 1e9;
}
/* Floats in each GEMM operand pool: 4 L2 caches of this core (2 MB where it does not say), and
 * within the `big` floats each buffer has. */
static size_t operand_pool(size_t big) {
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    size_t n = (l2 > 0 ? (size_t)l2 : 512u << 10) * 4 / sizeof(float);
    if (n < (1u << 16)) n = 1u << 16;
    return n < big ? n : big;
}
static void do_layernorm(be_backend *be, void *p) {
    op_arg *o = p;
    be->layernorm_fwd(be, o->c, o->d, o->d + o->M, o->a, o->b, o->b + o->N, o->M, o->N);
}
/* After do_layernorm (its mean and rstd): dinp into c, dw and db after them in d. */
static void do_layernorm_bwd(be_backend *be, void *p) {
    op_arg *o = p;
    be->layernorm_bwd(be, o->c, o->d + 2 * o->M, o->d + 2 * o->M + o->N, o->a, o->a, o->b, o->d,
                      o->d + o->M, o->M, o->N);
}
static void do_gelu(be_backend *be, void *p) {
    op_arg *o = p;
    be->gelu_fwd(be, o->c, o->a, o->n);
    be->gelu_bwd(be, o->d, o->a, o->b, o->n);
}
static void do_adamw(be_backend *be, void *p) {
    op_arg *o = p;
    void *w_act = be->act_dtype == BE_F32 ? NULL : (void *)(o->d + o->n); /* the act copy */
    be->adamw_step(be, o->a, w_act, o->b, o->c, o->d, o->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1,
                   1.0f);
}
static void do_adamw_1(be_backend *be, void *p) {
    op_arg *o = p;
    size_t n = o->n;
    o->n = 1;
    do_adamw(be, p);
    o->n = n;
}
static void do_attention(be_backend *be, void *p) {
    op_arg *o = p; /* a: qkv (B,T,3C), c: out, d: state, b: dout then dqkv */
    be->attention_fwd(be, o->c, o->d, o->a, o->B, o->T, o->C, o->NH, 0);
    be->attention_bwd(be, o->b, o->c, o->c, o->a, o->d, o->B, o->T, o->C, o->NH, 0);
}
static void do_copy(be_backend *be, void *p) {
    op_arg *o = p;
    be->copy(be, o->c, o->a, o->n * sizeof(float));
}

/* Small values in a device (or host) buffer of n floats, through the host. */
static ms_status fill(be_backend *be, float *dev, size_t n) {
    float *h = malloc(n * sizeof *h);
    if (!h) return ms_error(MS_ERR_NOMEM, "measure: a host buffer of %zu floats", n);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    be->to_device(be, dev, h, n * sizeof *h);
    free(h);
    return MS_OK;
}

static ms_status storage_speed(const char *dir, double *gbps) {
    char path[4096];
    snprintf(path, sizeof path, "%s/megascale-measure-%d.tmp", dir, (int)getpid());
    size_t n = 32u << 20;
    char *buf = malloc(n);
    if (!buf) return ms_error(MS_ERR_NOMEM, "storage check buffer");
    memset(buf, 7, n);
    double t0 = ms_now();
    ms_status st = ms_file_write_atomic(path, buf, n); /* write, fsync, rename */
    double t = ms_now() - t0;
    free(buf);
    unlink(path);
    if (st != MS_OK) return ms_error_wrap(st, "measuring storage in %s", dir);
    *gbps = n / t / 1e9;
    return MS_OK;
}

/* One pass over every compute figure into v[] (PASS_FIGURES entries: the
 * GEMM sizes, launch, LayerNorm, GeLU, AdamW, attention, copy, LayerNorm
 * backward, a one-element AdamW: seconds or rates). */
#define N_GEMM 7
#define PASS_FIGURES (N_GEMM + 8)
static void one_pass(be_backend *be, op_arg *o, const diag_cost_config *cfg, double *v) {
    /* products shaped like a layer's (tokens x 2 width x width: 4n x 2n x n), at the size
     * n_eff = cbrt(M N K) = 2n the planner looks them up by */
    for (int i = 0; i < N_GEMM; i++) {
        int n = 4 << i;
        v[i] = gemm_rate(be, o, 4 * n, 2 * n, n);
    }
    o->M = o->N = o->K = 1, o->layout = 0;
    v[N_GEMM] = time_op(be, do_gemm, o, 2000);
    o->M = 256, o->N = 256, o->n = (size_t)o->M * o->N;
    v[N_GEMM + 1] = time_op(be, do_layernorm, o, 50);
    v[N_GEMM + 6] = time_op(be, do_layernorm_bwd, o, 50);
    v[N_GEMM + 2] = time_op(be, do_gelu, o, 20);
    /* AdamW over 4 x 16 MB of state, more than a last-level cache: a model's optimizer state
     * is, and in a step the forward and backward passes have been through the caches since
     * the optimizer last ran (timed over 1 MB arrays it read 0.4 ns a parameter, and the
     * trainer's AdamW 1.5) */
    o->n = BIG_FLOATS;
    v[N_GEMM + 3] = time_op(be, do_adamw, o, 10) / o->n;
    v[N_GEMM + 7] = time_op(be, do_adamw_1, o, 2000);
    o->B = cfg->attn_b, o->T = cfg->attn_t, o->C = cfg->attn_c, o->NH = cfg->attn_heads;
    v[N_GEMM + 4] = time_op(be, do_attention, o, 20);
    o->n = BIG_FLOATS;
    v[N_GEMM + 5] = time_op(be, do_copy, o, 3);
}

/* The compute figures, each the best of PASSES passes over all of them in
 * turn: on a shared machine the load comes in bursts, and the best pass is
 * the one a burst left alone (the figures describe the machine, not its
 * neighbours; the CPU validation compares them with a run's fast steps). */
#define PASSES 7
static ms_status compute_costs(be_backend *be, const diag_cost_config *cfg, diag_costs *r) {
    size_t big = BIG_FLOATS;
    /* and what the attention shape needs: a, b qkv (B,T,3C), c out (B,T,C), d its state */
    size_t btc = (size_t)cfg->attn_b * cfg->attn_t * cfg->attn_c;
    size_t state = be->attention_state_bytes(be, cfg->attn_b, cfg->attn_t, cfg->attn_heads);
    size_t need[4] = {3 * btc, 3 * btc, btc, (state + sizeof(float) - 1) / sizeof(float)};
    float *buf[4];
    ms_status st = MS_OK;
    for (int i = 0; i < 4; i++) {
        /* d: AdamW's second moment, then its 16-bit copy of the weights (do_adamw) */
        size_t least = i == 3 ? big + big / 2 : big;
        if (need[i] < least) need[i] = least;
        buf[i] = be->alloc(be, need[i] * sizeof(float));
    }
    for (int i = 0; i < 4 && st == MS_OK; i++)
        st = buf[i] ? fill(be, buf[i], need[i])
                    : ms_error(MS_ERR_NOMEM,
                               "measure: %.1f MB for the attention shape --attn-batch %d "
                               "--attn-seq %d --attn-dim %d (--attn-heads %d)",
                               need[i] * sizeof(float) / 1e6, cfg->attn_b, cfg->attn_t, cfg->attn_c,
                               cfg->attn_heads);
    op_arg o = {.a = buf[0], .b = buf[1], .c = buf[2], .d = buf[3], .pool = operand_pool(big)};
    be_limits lim = {.B = cfg->attn_b,
                     .T = cfg->attn_t,
                     .C = cfg->attn_c > 256 ? cfg->attn_c : 256, /* and LayerNorm's */
                     .NH = cfg->attn_heads,
                     .Vp = 128,
                     .max_n = big};
    if (st == MS_OK) st = be->reserve(be, &lim);
    if (st != MS_OK) goto out;
    double v[PASSES][PASS_FIGURES], med[PASS_FIGURES], col[PASSES];
    for (int p = 0; p < PASSES; p++)
        one_pass(be, &o, cfg, v[p]);
    for (int k = 0; k < PASS_FIGURES; k++) {
        for (int p = 0; p < PASSES; p++)
            col[p] = v[p][k];
        med[k] = min_of(col, PASSES);
    }
    r->n_gemm = N_GEMM;
    for (int i = 0; i < N_GEMM; i++)
        r->gemm_n[i] = 2 * (4 << i), r->gemm_gflops[i] = med[i];
    double bytes = 2.0 * 256 * 256 * sizeof(float); /* read and write */
    r->launch_us = fmax(med[N_GEMM], med[N_GEMM + 7]) * 1e6;
    r->elem_gbps = bytes / med[N_GEMM + 1] / 1e9;
    r->ln_bwd_ratio = med[N_GEMM + 6] / med[N_GEMM + 1];
    r->transc_gbps = 3 * bytes / med[N_GEMM + 2] / 1e9; /* the planner's GeLU: 1 + 2 passes */
    r->opt_ns_per_param = med[N_GEMM + 3] * 1e9;
    r->attn_s = med[N_GEMM + 4];
    r->memcpy_gbps = 2.0 * big * sizeof(float) / med[N_GEMM + 5] / 1e9;
    r->storage_gbps = 0;
    if (cfg->storage_dir && *cfg->storage_dir)
        st = storage_speed(cfg->storage_dir, &r->storage_gbps);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    r->mem_gb = (double)pages * psize / 1e9;
    r->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    r->threads = be->threads;
    snprintf(r->device, sizeof r->device, "%s", be->device_name);
out:
    for (int i = 0; i < 4; i++)
        if (buf[i]) be->free(be, buf[i]);
    return st;
}

/* All-reduce of `n` doubles over g: median seconds of `reps` (slowest rank). */
static ms_status time_allreduce(comm_group *g, double *buf, size_t n, int reps, double *sec) {
    double t[64];
    if (reps > 64) reps = 64; /* a larger median array is not needed */
    MS_TRY(comm_barrier(g));
    for (int r = 0; r < reps; r++) {
        double t0 = ms_now();
        MS_TRY(comm_allreduce(g, buf, buf, n, COMM_F64, COMM_SUM));
        t[r] = ms_now() - t0;
    }
    double m = median(t, reps);
    MS_TRY(comm_allreduce(g, &m, &m, 1, COMM_F64, COMM_MAX));
    *sec = m;
    return MS_OK;
}

/* What one phase of the shared-rate sample runs on every rank, `ROUNDS` times:
 * four layer-shaped GEMMs (gemm), then an all-reduce of one double (coll), and an
 * exchange of `xfloats` floats with the partner rank (rank ^ 1) started before the GEMMs
 * and waited for after them (xchg). */
typedef struct {
    int gemm, coll, xchg;
} phase;

static ms_status exchange_start(comm_group *g, op_arg *o, size_t xfloats, comm_req **req) {
    int me = comm_group_rank(g), peer = me ^ 1;
    req[0] = req[1] = NULL;
    if (peer >= comm_group_size(g)) return MS_OK; /* the odd rank out: no partner */
    MS_TRY(comm_recv_start(g, o->x_in, xfloats, COMM_F32, peer, 11, &req[0]));
    return comm_send_start(g, o->x_out, xfloats, COMM_F32, peer, 11, &req[1]);
}

static ms_status exchange_wait(comm_req **req) {
    ms_status st = req[0] ? comm_wait(req[0]) : MS_OK, s2 = req[1] ? comm_wait(req[1]) : MS_OK;
    return st != MS_OK ? st : s2;
}

/* Seconds of ROUNDS rounds of phase ph. */
static ms_status phase_rounds(comm_group *g, be_backend *be, op_arg *o, size_t xfloats, phase ph,
                              int rounds, double *sec) {
    double x = 1, t0 = ms_now();
    for (int i = 0; i < rounds; i++) {
        comm_req *req[2] = {NULL, NULL};
        if (ph.xchg) MS_TRY(exchange_start(g, o, xfloats, req));
        for (int k = 0; ph.gemm && k < 4; k++)
            do_gemm(be, o);
        be->sync(be);
        if (ph.xchg) MS_TRY(exchange_wait(req));
        if (ph.coll) MS_TRY(comm_allreduce(g, &x, &x, 1, COMM_F64, COMM_SUM));
    }
    *sec = ms_now() - t0;
    return MS_OK;
}

/* One sample of: rank 0's GEMM rounds alone (the others wait in a barrier); every rank's
 * at once; every rank's with an all-reduce after each round; every rank's exchanges alone;
 * and every rank's GEMM rounds with an exchange in flight during each.  The slowest
 * rank's times. */
#define ROUNDS 200 /* ~30 ms a phase: long enough for the scheduler's fair share */
#define SHARED_PHASES 5
static ms_status shared_sample(comm_group *g, be_backend *be, op_arg *o, size_t xfloats,
                               double t[SHARED_PHASES]) {
    static const phase ph[SHARED_PHASES] = {{1, 0, 0}, {1, 0, 0}, {1, 1, 0}, {0, 0, 1}, {1, 0, 1}};
    MS_TRY(comm_barrier(g));
    t[0] = 0;
    if (comm_group_rank(g) == 0) MS_TRY(phase_rounds(g, be, o, xfloats, ph[0], ROUNDS, &t[0]));
    for (int k = 1; k < SHARED_PHASES; k++) {
        MS_TRY(comm_barrier(g));
        MS_TRY(phase_rounds(g, be, o, xfloats, ph[k], ROUNDS, &t[k]));
    }
    return comm_allreduce(g, t, t, SHARED_PHASES, COMM_F64, COMM_MAX);
}

/* How many cores the ranks really have (n x alone / together); the latency of a small
 * all-reduce between compute phases, as in a step (a peer sharing a core may not be
 * running when its partner arrives); and how much of a transfer compute hides (an
 * exchange of about one GEMM round's time in flight during the round: hidden =
 * GEMMs + exchanges - both, over the smaller of the two).  From the best of 9 samples of
 * each phase, each taken within a fraction of a second (the least disturbed by the
 * machine's other load). */
static ms_status shared_rate(comm_world *w, const diag_cost_config *cfg, diag_costs *r) {
    be_options bo = be_options_default();
    bo.threads = cfg->threads;
    be_backend *be = NULL;
    MS_TRY(be_create(&be, cfg->device, &bo));
    size_t n = 1u << 16, xfloats = 1u << 15; /* 128 KB each way */
    float *buf[3];
    for (int i = 0; i < 3; i++)
        buf[i] = be->alloc(be, n * sizeof(float));
    float *xb = calloc(2 * xfloats, sizeof(float)); /* host buffers: the links' own path */
    ms_status st = MS_OK;
    if (!buf[0] || !buf[1] || !buf[2] || !xb) st = ms_error(MS_ERR_NOMEM, "measure buffers");
    for (int i = 0; st == MS_OK && i < 3; i++)
        st = fill(be, buf[i], n);
    enum { SAMPLES = 9 };
    double v[SHARED_PHASES][SAMPLES];
    op_arg o = {.a = buf[0], .b = buf[1], .c = buf[2], .M = 256, .N = 128, .K = 64};
    o.x_in = xb, o.x_out = xb ? xb + xfloats : NULL;
    comm_group *g = comm_world_group(w);
    for (int k = 0; st == MS_OK && k < SAMPLES; k++) {
        double t[SHARED_PHASES];
        st = shared_sample(g, be, &o, xfloats, t);
        for (int j = 0; j < SHARED_PHASES; j++)
            v[j][k] = t[j];
    }
    if (st == MS_OK) {
        double alone = min_of(v[0], SAMPLES), both = min_of(v[1], SAMPLES);
        double mixed = min_of(v[2], SAMPLES), steps = 2 * ceil(log2(comm_world_size(w)));
        double xchg = min_of(v[3], SAMPLES), over = min_of(v[4], SAMPLES);
        r->shared_cores = comm_world_size(w) * alone / both;
        r->busy_lat_us = fmax(0, mixed - both) / ROUNDS / steps * 1e6;
        double hidden = both + xchg - over, most = fmin(both, xchg);
        r->overlap_eff = most > 0 ? fmin(1, fmax(0, hidden / most)) : 1;
    }
    free(xb);
    for (int i = 0; i < 3; i++)
        if (buf[i]) be->free(be, buf[i]);
    be->destroy(be);
    return st;
}

double diag_link_gbps(double bytes, double small_s, double big_s) {
    double transfer = fmax(big_s - small_s, big_s / 4);
    return bytes / fmax(transfer, 1e-9) / 1e9;
}

static ms_status comm_costs(comm_world *w, diag_costs *r) {
    comm_group *g = comm_world_group(w);
    int n = comm_world_size(w);
    size_t big = 1u << 19; /* 4 MB of doubles */
    double *buf = calloc(big, sizeof *buf);
    if (!buf) return ms_error(MS_ERR_NOMEM, "measure: all-reduce buffer");
    double small_s = 0, big_s = 0;
    ms_status st = time_allreduce(g, buf, 1, 41, &small_s);
    if (st == MS_OK) st = time_allreduce(g, buf, big, 9, &big_s);
    free(buf);
    MS_TRY(st);
    r->ranks = n;
    /* a small all-reduce takes the planner's tree: 2 ceil(log2 n) steps (plan_coll_s) */
    r->lat_us = small_s / (2.0 * ceil(log2(n))) * 1e6;
    double bytes = 2.0 * (n - 1) / n * big * sizeof(double);
    r->link_gbps = diag_link_gbps(bytes, small_s, big_s);
    double t0 = ms_now();
    comm_grid *grid = NULL;
    MS_TRY(comm_grid_create(w, n, 1, 1, &grid)); /* three groups */
    double init = ms_now() - t0;
    comm_grid_destroy(grid);
    MS_TRY(comm_allreduce(g, &init, &init, 1, COMM_F64, COMM_MAX));
    r->group_init_ms = init / 3 * 1e3;
    return MS_OK;
}

ms_status diag_measure_costs(const diag_cost_config *cfg, diag_costs *r) {
    memset(r, 0, sizeof *r);
    if (!cfg->comm_only) {
        be_options bo = be_options_default();
        bo.threads = cfg->threads;
        be_backend *be = NULL;
        MS_TRY(be_create(&be, cfg->device, &bo));
        ms_status st = compute_costs(be, cfg, r);
        be->destroy(be);
        return st;
    }
    if (ms_ctx_get()->world < 2) /* said before MPI starts (it would keep memory until exit) */
        return ms_error(MS_ERR_ARG, "measuring the links needs at least 2 ranks: run it under "
                                    "mpirun -np N (N: the ranks a job runs)");
    comm_options co = comm_options_default();
    comm_world *w = NULL;
    MS_TRY(comm_world_init(&w, NULL, NULL, &co));
    ms_status st = comm_world_size(w) < 2
                       ? ms_error(MS_ERR_ARG, "measuring the links needs at least 2 ranks: run "
                                              "it under mpirun -np N (N: the ranks a job runs)")
                       : comm_costs(w, r);
    if (st == MS_OK) st = shared_rate(w, cfg, r);
    r->rank = comm_world_rank(w);
    ms_status fs = comm_world_finalize(w);
    return st != MS_OK ? st : fs;
}
