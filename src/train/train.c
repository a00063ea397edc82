/* train.c - the step loop. */
#include "train/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ctx.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "ckpt/ckpt.h"
#include "ckpt/hf.h"
#include "comm/comm.h"
#include "comm/grid.h"
#include "data/loader.h"
#include "data/prefetch.h"
#include "data/shm_ring.h"
#include "monitor/monitor.h"
#include "optim/optim.h"
#include "parallel/zero.h"
#include "train/train_internal.h"

/* Per-step profile columns: total, data wait, exposed comm, bubble (s);
 * device fwd+bwd, device optimiser (ms). */
#define PROF_COLS 6

typedef struct {
    const train_config *tc;
    gpt_config mc;
    int micro, accum;
    be_backend *be;
    gpt_model *model;
    opt_state *opt;
    opt_schedule sched;
    data_loader *train, *val;
    data_prefetch *prefetch; /* feeds the training batches */
    data_shm *ring;          /* tp > 1: one reader per tp group shares its batches */
    int ring_leader;
    mon_metrics metrics;
    int32_t *inp, *tgt;
    double peak_flops, flops_per_token;
    train_fault fault;
    /* distribution (NULL alone) */
    comm_world *world;
    comm_grid *grid;
    par_zero *zero;
    train_pipe *pipe;     /* pp > 1: this stage's schedule (NULL: the whole model) */
    int32_t *pinp, *ptgt; /* pp > 1: the step's micro-batches (accum, micro, seq) */
    int pp;
    int dp, dp_rank, rank;
    double *prof; /* per step: total, data, exposed comm seconds (3 x steps) */
    int prof_n;
    ckpt_manager *ckpt; /* --ckpt-dir / --resume (NULL: none) */
    int start, done;    /* first step of this run (after a resume), steps done */
} trainer;

static ms_status open_loaders(trainer *t) {
    const train_config *tc = t->tc;
    data_loader_config dc = {.pattern = tc->train_data,
                             .B = t->micro,
                             .T = tc->seq,
                             .vocab = t->mc.vocab,
                             .seed = tc->seed,
                             .rank = t->dp_rank,
                             .nranks = t->dp};
    MS_TRY(data_order_parse(tc->data_order, &dc.order));
    MS_TRY(data_loader_open(&t->train, &dc));
    ms_info("train data: %s: %d shard(s), %llu tokens, order %s", tc->train_data,
            data_loader_num_shards(t->train),
            (unsigned long long)data_loader_total_tokens(t->train), tc->data_order);
    if (tc->val_data && *tc->val_data) {
        dc.pattern = tc->val_data;
        dc.order = DATA_ORDER_SEQUENTIAL;
        MS_TRY(data_loader_open(&t->val, &dc));
    }
    return MS_OK;
}

/* Start MPI and the rank grid when launched by mpirun or asked for more
 * than one rank; a plain single process never touches MPI. */
static ms_status setup_dist(trainer *t) {
    const train_config *tc = t->tc;
    t->dp = tc->dp > 0 ? tc->dp : 1;
    int tp = tc->tp > 0 ? tc->tp : 1;
    t->pp = tc->pp > 0 ? tc->pp : 1;
    int want = t->dp * tp * t->pp;
    if (tc->vpp > 1 && t->pp < 2)
        return ms_error(MS_ERR_ARG,
                        "--vpp %d: virtual pipeline stages need --pp >= 2 (the interleaved "
                        "schedule)",
                        tc->vpp);
    if (want == 1 && ms_ctx_get()->world == 1) return MS_OK;
    MS_TRY(comm_world_init(&t->world, NULL, NULL, NULL));
    int world = comm_world_size(t->world);
    if (world != want)
        return ms_error(MS_ERR_ARG, "the job has %d ranks but --tp %d x --pp %d x --dp %d = %d",
                        world, tc->tp > 0 ? tc->tp : 1, tc->pp > 0 ? tc->pp : 1, t->dp, want);
    MS_TRY(comm_grid_create(t->world, tp, t->pp, t->dp, &t->grid));
    t->rank = comm_world_rank(t->world);
    t->dp_rank = comm_grid_coord_of(t->grid).dp;
    return MS_OK;
}

/* Ranks of a tensor-parallel group need identical batches: its rank 0
 * reads them (through the prefetcher) and shares them with the others
 * through a shared-memory ring, instead of every rank reading the shards. */
static ms_status open_ring(trainer *t) {
    if (!t->grid || comm_grid_dim_size(t->grid, COMM_DIM_TP) < 2) return MS_OK;
    comm_group *tp = comm_grid_group(t->grid, COMM_DIM_TP);
    char name[64] = {0};
    t->ring_leader = comm_group_rank(tp) == 0;
    if (t->ring_leader) snprintf(name, sizeof name, "/megascale-%d-batches", (int)getpid());
    MS_TRY(comm_broadcast(tp, name, sizeof name, COMM_U8, 0));
    data_shm_config rc = {name, comm_group_size(tp) - 1, (size_t)t->micro * t->tc->seq, 4,
                          comm_world_timeout(t->world)};
    if (t->ring_leader) {
        MS_TRY(data_shm_open_leader(&t->ring, &rc));
        MS_TRY(comm_barrier(tp)); /* the segment exists before followers look */
        ms_info("data: tp rank 0 reads, the other %d tp rank(s) get its batches through shared "
                "memory (%s)",
                rc.followers, name);
        return MS_OK;
    }
    MS_TRY(comm_barrier(tp));
    data_prefetch_stop(t->prefetch); /* followers do not read the shards */
    t->prefetch = NULL;
    return data_shm_open_follower(&t->ring, &rc);
}

/* The next micro-batch into t->inp / t->tgt; *wait = time waited for it. */
static ms_status next_batch(trainer *t, double *wait) {
    if (t->ring && !t->ring_leader) return data_shm_get(t->ring, t->inp, t->tgt, wait);
    MS_TRY(data_prefetch_next(t->prefetch, t->inp, t->tgt, wait));
    return t->ring ? data_shm_put(t->ring, t->inp, t->tgt) : MS_OK;
}

/* --threads, or the cores shared by the ranks of this node. */
static int threads_per_rank(const train_config *tc) {
    if (tc->threads > 0) return tc->threads;
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int local = ls ? atoi(ls) : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (local <= 1 || cores < 1) return 0;
    return cores / local > 0 ? (int)(cores / local) : 1;
}

/* The trainer's state for a checkpoint after `step` steps. */
static ckpt_train_state ckpt_state(trainer *t, int step) {
    const train_config *tc = t->tc;
    ckpt_train_state s = {.step = step,
                          .opt_steps = opt_steps_done(t->opt),
                          .seed = tc->seed,
                          .sched = t->sched,
                          .batch = tc->batch,
                          .seq = tc->seq};
    s.cursor = t->prefetch ? data_prefetch_cursor(t->prefetch) : data_loader_cursor(t->train);
    return s;
}

/* --ckpt-dir / --resume: the checkpoint manager and the state to continue from. */
static ms_status setup_ckpt(trainer *t) {
    const train_config *tc = t->tc;
    if (!(tc->ckpt_dir && *tc->ckpt_dir) && !(tc->resume && *tc->resume)) return MS_OK;
    ckpt_options o = {tc->ckpt_dir, tc->ckpt_every, tc->ckpt_every_min, tc->ckpt_keep, tc->resume};
    MS_TRY(ckpt_manager_create_world(&t->ckpt, &o, t->model, t->opt, t->zero, t->world));
    ckpt_train_state now = ckpt_state(t, 0), saved;
    int found = 0;
    MS_TRY(ckpt_manager_resume(t->ckpt, &now, &saved, &found));
    if (found) {
        data_loader_seek(t->train, saved.cursor);
        t->start = t->done = saved.step;
    }
    return MS_OK;
}

/* The model: whole, or this rank's pipeline stage, whose activation sets
 * follow from its schedule. */
static ms_status create_model(trainer *t, comm_group *tpg) {
    const train_config *tc = t->tc;
    size_t align = 16 * (size_t)t->dp;
    if (t->pp == 1) return gpt_create_tp(&t->model, &t->mc, t->be, t->micro, tc->seq, align, tpg);
    int vpp = tc->vpp > 0 ? tc->vpp : 1, stage = comm_grid_coord_of(t->grid).pp;
    gpt_stage st;
    MS_TRY(gpt_stage_init(&st, &t->mc, t->pp, vpp, stage, 1)); /* layers divide? */
    MS_TRY(train_pipe_plan(&t->pipe, t->grid, t->world, vpp, t->accum));
    MS_TRY(gpt_stage_init(&st, &t->mc, t->pp, vpp, stage, train_pipe_slots(t->pipe)));
    MS_TRY(gpt_create_stage(&t->model, &t->mc, t->be, t->micro, tc->seq, align, tpg, &st));
    size_t n = (size_t)t->accum * t->micro * tc->seq;
    t->pinp = malloc(n * sizeof(int32_t));
    t->ptgt = malloc(n * sizeof(int32_t));
    if (!t->pinp || !t->ptgt) return ms_error(MS_ERR_NOMEM, "trainer: out of memory");
    return train_pipe_attach(t->pipe, t->model, t->micro, tc->seq);
}

/* comm_device hooks over the backend's table. */
static int dev_is_device(void *be, const void *p) {
    return ((be_backend *)be)->is_device(be, p);
}
static void dev_to_host(void *be, void *dst, const void *src, size_t n) {
    ((be_backend *)be)->to_host(be, dst, src, n);
}
static void dev_to_device(void *be, void *dst, const void *src, size_t n) {
    ((be_backend *)be)->to_device(be, dst, src, n);
}
static void *dev_host_alloc(void *be, size_t n) {
    return ((be_backend *)be)->host_alloc(be, n);
}
static void dev_host_free(void *be, void *p) {
    ((be_backend *)be)->host_free(be, p);
}

/* With a device backend and several ranks: the communicator learns to stage
 * device buffers through pinned host memory (MPI), and, per --comm, the tp,
 * dp and pp groups get NCCL communicators.  auto: NCCL on every group whose
 * ranks have distinct GPUs, MPI staging on the others (several ranks
 * sharing one GPU, which NCCL cannot do); nccl: NCCL or an error; mpi:
 * staging only. */
static ms_status setup_device_comm(trainer *t) {
    const char *mode = t->tc->comm && *t->tc->comm ? t->tc->comm : "auto";
    if (strcmp(mode, "auto") && strcmp(mode, "nccl") && strcmp(mode, "mpi"))
        return ms_error(MS_ERR_ARG, "--comm %s: expected auto, nccl or mpi", mode);
    if (!t->world || !t->be->stream) return MS_OK; /* one process, or host memory */
    comm_device dev = {t->be,         dev_is_device,  dev_to_host,
                       dev_to_device, dev_host_alloc, dev_host_free};
    MS_TRY(comm_world_set_device(t->world, &dev));
    if (!strcmp(mode, "mpi")) {
        ms_info("comm: device buffers staged through pinned host memory (MPI), as --comm mpi asks");
        return MS_OK;
    }
    static const comm_grid_dim dims[] = {COMM_DIM_TP, COMM_DIM_DP, COMM_DIM_PP};
    static const char *names[] = {"tp", "dp", "pp"};
    for (int i = 0; i < 3; i++) {
        comm_group *g = comm_grid_group(t->grid, dims[i]);
        if (!g || comm_group_size(g) < 2) continue;
        ms_status st = comm_group_enable_nccl(g, t->be->stream);
        if (st == MS_OK) {
            ms_info("comm: %s group (%d ranks) on NCCL", names[i], comm_group_size(g));
        } else if (!strcmp(mode, "nccl") || st == MS_ERR_TIMEOUT) {
            return ms_error_wrap(st, "--comm %s: %s group", mode, names[i]);
        } else {
            ms_info("comm: %s group: device buffers staged through pinned host memory (MPI): %s",
                    names[i], ms_errmsg());
        }
    }
    return MS_OK;
}

static ms_status setup(trainer *t) {
    const train_config *tc = t->tc;
    MS_TRY(setup_dist(t));
    MS_TRY(train_model_config(tc, &t->mc));
    MS_TRY(train_check(tc, &t->mc, t->dp, &t->micro, &t->accum));
    MS_TRY(train_check_tp(tc, &t->mc, t->micro));
    MS_TRY(train_fault_parse(tc->inject_fault, &t->fault));
    opt_config oc = {OPT_ADAMW,      (float)tc->beta1,        (float)tc->beta2,
                     (float)tc->eps, (float)tc->weight_decay, (float)tc->grad_clip};
    MS_TRY(opt_kind_parse(tc->optimizer, &oc.kind));
    t->sched =
        (opt_schedule){OPT_SCHED_COSINE, (float)tc->lr, tc->warmup, tc->steps, (float)tc->lr_floor};
    MS_TRY(opt_sched_parse(tc->lr_schedule, &t->sched.kind));
    MS_TRY(open_loaders(t)); /* fail fast on bad data, before allocating */
    MS_TRY(be_create(&t->be, tc->device, threads_per_rank(tc)));
    MS_TRY(setup_device_comm(t));
    comm_group *tpg = t->grid && tc->tp > 1 ? comm_grid_group(t->grid, COMM_DIM_TP) : NULL;
    MS_TRY(create_model(t, tpg));
    if (tc->init_from && *tc->init_from) {
        MS_TRY(ckpt_hf_load(t->model, tc->init_from));
        ms_info("weights: loaded %s", tc->init_from);
    } else {
        gpt_init(t->model, tc->seed);
    }
    if (t->dp > 1)
        MS_TRY(par_zero_create(&t->zero, t->model, comm_grid_group(t->grid, COMM_DIM_DP)));
    MS_TRY(opt_create(&t->opt, &oc, t->model, t->zero));
    if (t->pipe) /* the norm sums over the stages, the last stage's wte copy left out */
        opt_set_pipeline(t->opt, comm_grid_group(t->grid, COMM_DIM_PP),
                         train_pipe_last_stage(t->pipe) ? gpt_find(t->model, "wte.weight") : -1);
    MS_TRY(setup_ckpt(t)); /* resumes before the prefetch thread reads the loader */
    MS_TRY(mon_metrics_open(&t->metrics, t->rank == 0 ? tc->metrics : NULL, t->start));
    size_t n = (size_t)t->micro * tc->seq;
    t->inp = malloc(n * sizeof(int32_t));
    t->tgt = malloc(n * sizeof(int32_t));
    t->prof = malloc(sizeof(double) * PROF_COLS * (size_t)tc->steps);
    if (!t->inp || !t->tgt || !t->prof) return ms_error(MS_ERR_NOMEM, "trainer: out of memory");
    t->flops_per_token = gpt_flops_per_token(&t->mc, tc->seq);
    /* the GPU needs a large product to reach its peak (8192^3: 1.1 TFLOP) */
    int probe_n = t->be->act_dtype == BE_BF16 ? 8192 : 2048;
    t->peak_flops = tc->peak_flops > 0 ? tc->peak_flops : mon_probe_peak_flops(t->be, probe_n, 2);
    /* started last, so the probe above runs on idle cores */
    MS_TRY(data_prefetch_start(&t->prefetch, t->train, t->micro, tc->seq, 4));
    MS_TRY(open_ring(t));
    return MS_OK;
}

/* Free everything; finalize MPI only after a run that every rank finished
 * (after a failure on one rank the others may be stuck in a collective: the
 * caller exits non-zero and mpirun ends the job). */
static void teardown(trainer *t, ms_status st) {
    ckpt_manager_destroy(t->ckpt); /* waits for a persist in flight */
    mon_metrics_close(&t->metrics);
    data_shm_close(t->ring);
    data_prefetch_stop(t->prefetch);
    data_loader_close(t->train);
    data_loader_close(t->val);
    opt_destroy(t->opt);
    par_zero_destroy(t->zero);
    train_pipe_destroy(t->pipe);
    free(t->pinp);
    free(t->ptgt);
    gpt_destroy(t->model);
    if (t->be) be_destroy(t->be);
    free(t->inp);
    free(t->tgt);
    free(t->prof);
    comm_grid_destroy(t->grid);
    if (t->world && st == MS_OK) {
        ms_status fs = comm_world_finalize(t->world);
        if (fs != MS_OK) ms_errorf("%s", ms_errmsg());
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of column k of the profile, skipping the first step (warm-up). */
static double prof_median(const trainer *t, int k) {
    int n = t->prof_n > 1 ? t->prof_n - 1 : t->prof_n;
    if (n < 1) return 0;
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v) return 0;
    for (int i = 0; i < n; i++)
        v[i] = t->prof[PROF_COLS * (t->prof_n - n + i) + k];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double m = v[n / 2];
    free(v);
    return m;
}

/* Every rank: one line with its median step split (for bench/parallel_step). */
static void print_profile(const trainer *t) {
    if (!t->prof || t->prof_n == 0) return;
    double step = prof_median(t, 0), data = prof_median(t, 1), comm = prof_median(t, 2);
    double bubble = prof_median(t, 3); /* waits on pipeline receives */
    fprintf(stderr,
            "[megascale r%d profile] median per step over %d steps: step %.1f ms | compute %.1f "
            "ms | exposed comm %.1f ms | data wait %.2f ms | bubble %.1f ms | device: fwd+bwd "
            "%.1f ms, optimizer %.1f ms\n",
            t->rank, t->prof_n > 1 ? t->prof_n - 1 : t->prof_n, step * 1e3,
            (step - data - comm - bubble) * 1e3, comm * 1e3, data * 1e3, bubble * 1e3,
            prof_median(t, 4), prof_median(t, 5));
}

/* Mean of a per-rank value over the data-parallel ranks. */
static ms_status dp_mean(trainer *t, double *x) {
    if (!t->zero) return MS_OK;
    MS_TRY(comm_allreduce(comm_grid_group(t->grid, COMM_DIM_DP), x, x, 1, COMM_F64, COMM_SUM));
    *x /= t->dp;
    return MS_OK;
}

static void print_layout(const trainer *t) {
    const gpt_config *c = gpt_get_config(t->model); /* vocab padded for tp */
    const train_config *tc = t->tc;
    int tp = gpt_tp_size(t->model);
    if (t->world)
        ms_info("layout: %d ranks = tp %d x pp %d x dp %d (%s%s%s)", comm_world_size(t->world), tp,
                t->pp, t->dp, tp > 1 ? "tensor + sequence parallel over tp" : "",
                tp > 1 && t->dp > 1 ? "; " : "",
                t->dp > 1 || tp == 1 ? "ZeRO-2: optimiser state and updates sharded over dp" : "");
    const gpt_stage *ps = gpt_get_stage(t->model);
    if (ps)
        ms_info("pipeline: %d stages x %d chunks of %d layers, %s schedule, %d micro-batches, "
                "%d activation sets on rank 0's stage; wte tied over the first and last stage",
                ps->pp, ps->vpp, ps->chunk_layers, ps->vpp > 1 ? "interleaved 1F1B" : "1F1B",
                t->accum, ps->slots);
    ms_info(
        "model: %d layers, dim %d, %d heads, vocab %d (padded %d), seq-max %d, %s block%s%.0d%s",
        c->n_layer, c->n_embd, c->n_head, c->vocab, c->vocab_pad, c->seq_max,
        gpt_block_name(c->block), c->attn_window ? ", window " : "", c->attn_window,
        c->recompute == (GPT_RECOMPUTE_GELU | GPT_RECOMPUTE_LN) ? ", recompute gelu+ln"
        : c->recompute == GPT_RECOMPUTE_GELU                    ? ", recompute gelu"
        : c->recompute == GPT_RECOMPUTE_LN                      ? ", recompute ln"
                                                                : "");
    ms_info("params: %.2fM (%.1f MB fp32); activations %.1f MB; flops/token %.3g",
            (double)gpt_config_num_params(c) / 1e6, (double)gpt_num_elements(t->model) * 4 / 1e6,
            (double)gpt_activation_bytes(t->model) / 1e6, t->flops_per_token);
    ms_info("batch %d x seq %d = %d tokens/step (micro-batch %d x %d accumulation), %d steps, "
            "%s, lr %g (%s, warmup %d), device %s (%d threads), peak %.1f GFLOP/s%s",
            tc->batch, tc->seq, tc->batch * tc->seq, t->micro, t->accum, tc->steps, tc->optimizer,
            tc->lr, tc->lr_schedule, tc->warmup, t->be->name, t->be->threads, t->peak_flops / 1e9,
            tc->peak_flops > 0 ? " (given)" : " (probed)");
}

/* A number as JSON: NaN and Inf have no JSON spelling, so they are null. */
static void json_num(char *buf, size_t n, double v) {
    if (isfinite(v))
        snprintf(buf, n, "%.6g", v);
    else
        snprintf(buf, n, "null");
}

/* Mean loss over --val-batches sequential batches of the validation data. */
static ms_status validate(trainer *t, float *loss) {
    data_loader_rewind(t->val);
    double sum = 0;
    int nb = t->tc->val_batches > 0 ? t->tc->val_batches : 1;
    for (int i = 0; i < nb; i++) {
        MS_TRY(data_loader_next(t->val, t->inp, t->tgt));
        if (t->pipe) { /* forward through every stage; the loss comes from the last */
            double l;
            MS_TRY(train_pipe_eval(t->pipe, t->inp, t->tgt, t->micro, t->tc->seq, &l));
            sum += l;
        } else {
            sum += gpt_forward_loss(t->model, t->inp, t->tgt, t->micro, t->tc->seq);
        }
    }
    MS_TRY(gpt_take_error(t->model)); /* a tensor-parallel collective failed */
    sum /= nb;
    MS_TRY(dp_mean(t, &sum));
    *loss = (float)sum;
    return MS_OK;
}

static ms_status log_val(trainer *t, int step) {
    float vl;
    MS_TRY(validate(t, &vl));
    ms_info("step %5d | val loss %.4f", step, vl);
    char line[128], num[32];
    json_num(num, sizeof num, vl);
    snprintf(line, sizeof line, "{\"step\":%d,\"val_loss\":%s}", step, num);
    return mon_metrics_write(&t->metrics, line);
}

typedef struct {
    float loss, lr;
    opt_stats os;
    double sec, data_sec, comm_sec; /* comm: exposed (blocked) communication */
    double bubble_sec;              /* pp > 1: waited on pipeline receives */
    /* backend timers (CUDA events on a GPU) of the PREVIOUS step: forward +
     * backward, and gradient sync + optimiser; read one step late so that
     * reading them never waits (this step's loss read-back came after them) */
    double dev_fb_ms, dev_opt_ms;
    int skipped;
} step_result;

/* pp > 1: the step's micro-batches through this stage's schedule; *loss =
 * the sum of their losses (from the last stage, on every stage). */
static ms_status pipe_micro_batches(trainer *t, float dloss, double *loss, step_result *r) {
    size_t n = (size_t)t->micro * t->tc->seq;
    for (int k = 0; k < t->accum; k++) {
        double wait = 0;
        MS_TRY(next_batch(t, &wait));
        r->data_sec += wait;
        memcpy(t->pinp + (size_t)k * n, t->inp, n * sizeof(int32_t));
        memcpy(t->ptgt + (size_t)k * n, t->tgt, n * sizeof(int32_t));
    }
    if (t->zero) par_zero_arm(t->zero); /* the hooks fire on each chunk's last micro-batch */
    MS_TRY(train_pipe_step(t->pipe, t->pinp, t->ptgt, t->micro, t->tc->seq, dloss, loss));
    r->bubble_sec = train_pipe_bubble(t->pipe);
    return MS_OK;
}

/* One optimiser step over `accum` micro-batches. */
static ms_status train_step(trainer *t, int step, step_result *r) {
    const train_config *tc = t->tc;
    double t0 = ms_now();
    int mk = 3 * (step & 1); /* this step's markers: mk..mk+2; the previous step's: 3 - mk.. */
    t->be->mark(t->be, mk);
    r->data_sec = 0;
    r->skipped = 0;
    gpt_zero_grads(t->model);
    float dloss = 1.0f / ((float)tc->batch * (float)tc->seq);
    double loss = 0;
    r->bubble_sec = 0;
    if (t->pipe) MS_TRY(pipe_micro_batches(t, dloss, &loss, r));
    for (int k = 0; !t->pipe && k < t->accum; k++) {
        double wait = 0;
        MS_TRY(next_batch(t, &wait));
        r->data_sec += wait;
        if (t->zero && k + 1 == t->accum) par_zero_arm(t->zero); /* overlap the reduce-scatter */
        loss += gpt_forward_backward(t->model, t->inp, t->tgt, t->micro, tc->seq, dloss);
    }
    MS_TRY(gpt_take_error(t->model)); /* a tensor-parallel collective failed */
    t->be->mark(t->be, mk + 1);
    if (t->zero) MS_TRY(par_zero_reduce_wait(t->zero));
    loss /= t->accum;
    MS_TRY(dp_mean(t, &loss));
    if (train_fault_hits(&t->fault, step + 1)) { /* injected: one NaN gradient */
        float nan = NAN;
        t->be->to_device(t->be, gpt_grads(t->model), &nan, sizeof nan);
        ms_warn("step %d: injected fault nan-grad", step + 1);
    }
    r->loss = (float)loss;
    r->lr = opt_lr_at(&t->sched, step);
    memset(&r->os, 0, sizeof r->os);
    ms_status st = isfinite(r->loss) ? opt_step(t->opt, r->lr, &r->os)
                                     : ms_error(MS_ERR_NONFINITE, "non-finite loss");
    if (st == MS_ERR_NONFINITE) {
        ms_warn("step %d: %s (loss %g); the update was skipped", step + 1, ms_errmsg(), r->loss);
        r->skipped = 1;
    } else if (st != MS_OK) {
        return st;
    } else if (t->zero) {
        MS_TRY(par_zero_gather_start(t->zero)); /* waited for by the next forward */
    }
    t->be->mark(t->be, mk + 2);
    if (t->world && comm_world_broken(t->world)) {
        /* an NCCL op failed after its comm_wait returned (its group's watchdog
         * broke the world): a new op is refused with the original message */
        comm_req *req = NULL;
        ms_status st = comm_barrier_start(comm_world_group(t->world), &req);
        if (st == MS_OK) st = comm_wait(req);
        return st != MS_OK ? st : ms_error(MS_ERR_TIMEOUT, "comm: the world is broken");
    }
    r->sec = ms_now() - t0;
    r->comm_sec = t->zero ? par_zero_take_wait(t->zero) : 0;
    r->dev_fb_ms = r->dev_opt_ms = 0;
    if (step > t->start) {
        int pm = 3 - mk;
        r->dev_fb_ms = t->be->elapsed_ms(t->be, pm, pm + 1);
        r->dev_opt_ms = t->be->elapsed_ms(t->be, pm + 1, pm + 2);
    }
    return MS_OK;
}

static ms_status report(trainer *t, int step, const step_result *r, double elapsed) {
    const train_config *tc = t->tc;
    double tokens = (double)tc->batch * tc->seq;
    double tok_s = tokens / r->sec;
    double peak = t->peak_flops * (t->world ? comm_world_size(t->world) : 1);
    double mfu = peak > 0 ? t->flops_per_token * tok_s / peak : 0;
    char eta[32];
    ms_fmt_duration(eta, sizeof eta, elapsed / (step + 1 - t->start) * (tc->steps - step - 1));
    if (tc->log_every > 0 &&
        ((step + 1) % tc->log_every == 0 || step == 0 || step + 1 == tc->steps))
        ms_info("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | MFU "
                "%5.1f%% | data %.1f ms | comm %.1f ms | ETA %s%s",
                step + 1, tc->steps, r->loss, r->lr, r->os.grad_norm, r->sec * 1e3, tok_s,
                100 * mfu, r->data_sec * 1e3, r->comm_sec * 1e3, eta,
                r->skipped ? " | SKIPPED" : "");
    char line[512], loss[32], norm[32];
    json_num(loss, sizeof loss, r->loss);
    json_num(norm, sizeof norm, r->os.grad_norm);
    snprintf(line, sizeof line,
             "{\"step\":%d,\"loss\":%s,\"lr\":%.6g,\"grad_norm\":%s,\"ms\":%.3f,"
             "\"tok_s\":%.1f,\"mfu\":%.5f,\"data_ms\":%.3f,\"comm_ms\":%.3f,\"skipped\":%s}",
             step + 1, loss, r->lr, norm, r->sec * 1e3, tok_s, mfu, r->data_sec * 1e3,
             r->comm_sec * 1e3, r->skipped ? "true" : "false");
    return mon_metrics_write(&t->metrics, line);
}

static ms_status loop(trainer *t) {
    const train_config *tc = t->tc;
    double start = ms_now();
    int bad = 0;
    for (int step = t->start; step < tc->steps; step++) {
        if (ms_ctx_get()->stop) {
            ms_warn("interrupted: stopping after step %d of %d", step, tc->steps);
            break;
        }
        if (train_fault_exits(&t->fault, step + 1, t->rank)) { /* injected: a rank dies */
            ms_errorf("step %d: injected fault: rank %d exits", step + 1, t->rank);
            _exit(3);
        }
        step_result r;
        MS_TRY(train_step(t, step, &r));
        MS_TRY(report(t, step, &r, ms_now() - start));
        if (t->prof) {
            double *p = &t->prof[PROF_COLS * t->prof_n++];
            p[0] = r.sec, p[1] = r.data_sec, p[2] = r.comm_sec, p[3] = r.bubble_sec;
            p[4] = r.dev_fb_ms, p[5] = r.dev_opt_ms;
        }
        bad = r.skipped ? bad + 1 : 0;
        if (bad > tc->max_bad_steps)
            return ms_error(MS_ERR_NONFINITE,
                            "%d consecutive steps with non-finite loss or gradients (limit "
                            "--max-bad-steps %d): stopping",
                            bad, tc->max_bad_steps);
        int last = step + 1 == tc->steps;
        if (t->val && ((tc->val_every > 0 && (step + 1) % tc->val_every == 0) || last))
            MS_TRY(log_val(t, step + 1));
        t->done = step + 1;
        if (t->ckpt) { /* may checkpoint, or stop every rank at this step */
            ckpt_train_state cs = ckpt_state(t, t->done);
            MS_TRY(ckpt_manager_step(t->ckpt, &cs));
        }
    }
    return MS_OK;
}

ms_status train_run(const train_config *tc) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.tc = tc;
    ms_status st = setup(&t);
    if (st == MS_OK) {
        print_layout(&t);
        if (t.val) st = log_val(&t, t.start);
    }
    if (st == MS_OK) st = loop(&t);
    if (st == MS_OK) print_profile(&t);
    if (st == MS_OK && t.zero) st = par_zero_gather_wait_all(t.zero);
    if (st == MS_OK && t.ckpt) { /* the final checkpoint (also after SIGTERM / SIGINT) */
        ckpt_train_state cs = ckpt_state(&t, t.done);
        st = ckpt_manager_finish(t.ckpt, &cs);
    }
    /* with tp, the tp group of world rank 0 gathers the shards (rank 0 writes) */
    /* with pp, all stages of that column send their tensors to world rank 0 */
    int saver = st == MS_OK && (gpt_tp_size(t.model) > 1 || t.pipe ? t.dp_rank == 0 : t.rank == 0);
    if (saver && tc->save_weights && *tc->save_weights) {
        st = t.pipe ? ckpt_hf_save_pipeline(t.model, comm_grid_group(t.grid, COMM_DIM_PP),
                                            tc->save_weights)
                    : ckpt_hf_save(t.model, tc->save_weights);
        if (st == MS_OK) ms_info("weights: saved %s", tc->save_weights);
    }
    if (st == MS_OK) ms_info("peak RSS %.1f MB", mon_peak_rss_bytes() / 1e6);
    teardown(&t, st);
    return st;
}
