/* train.c - the step loop. */
#include "train/train.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/ctx.h"
#include "base/events.h"
#include "base/fault.h"
#include "base/cpu_isa.h"
#include "base/fileio.h"
#include "base/shm_sweep.h"
#include "base/log.h"
#include "base/node.h"
#include "base/timeutil.h"
#include "ckpt/ckpt.h"
#include "ckpt/hf.h"
#include "comm/comm.h"
#include "comm/grid.h"
#include "data/loader.h"
#include "data/prefetch.h"
#include "data/shm_ring.h"
#include "monitor/devtime.h"
#include "monitor/evlog.h"
#include "monitor/heartbeat.h"
#include "monitor/monitor.h"
#include "monitor/peakcache.h"
#include "monitor/step.h"
#include "optim/optim.h"
#include "parallel/zero.h"
#include "train/train_internal.h"

#define CLOCK_PINGS 4 /* round trips per rank for the clock reference */

typedef struct {
    const train_config *tc;
    gpt_config mc;
    int micro, accum;
    be_backend *be;
    gpt_model *model;
    opt_state *opt;
    opt_schedule sched;
    data_loader *train;
    train_val *val;          /* --val-data: the fixed validation set */
    data_prefetch *prefetch; /* feeds the training batches */
    data_shm *ring;          /* tp > 1: one reader per host and tp group shares its batches */
    comm_group *ring_group;  /* the ranks of this rank's tp group on its host */
    int ring_leader;
    int ring_wait;     /* the wait for a ring member in progress (comm_world_wait_*; -1) */
    int ring_member;   /* the member its last wait was for (the ring's errors name its state) */
    mon_record *rec;   /* the step record's sinks */
    mon_evlog *evlog;  /* --trace-dir (NULL: tracing off) */
    mon_heartbeat *hb; /* --heartbeat (NULL: not supervised) */
    int hb_held;       /* the beat's phase says val or ckpt: "train" again once done */
    int init_gone;     /* --init-from is gone and the run resumes: its shape from the commit */
    char trace_dir[4096];
    uint16_t ev_data, ev_opt, ev_ckpt, ev_slow, lane_compute;
    mon_devtime *dev;               /* device spans of the step (read late) */
    uint16_t ev_dev_fb, ev_dev_opt; /* their names */
    /* the step's micro-batches (accum, micro, seq): filled by its first
     * computation, replayed by a redo of a non-finite step (replay = 1) */
    int32_t *rinp, *rtgt;
    int replay;
    /* the gradient buffer is all 0: a successful opt_step leaves it so,
     * and the next computation then skips its zeroing pass */
    int grads_zero;
    mon_peak peak;
    double flops_per_token;
    ms_fault_plan fault;         /* --inject-fault and --ckpt-fault: the trainer's kinds */
    char node[MS_NODE_NAME_MAX]; /* this rank's node (--node-map, or the host name) */
    char *fault_spec;            /* both, for the checkpoint manager (its points) */
    /* distribution (NULL alone) */
    comm_world *world;
    comm_grid *grid;
    train_gate *gate; /* errors printed once, by rank 0 (train_gate.c) */
    par_zero *zero;
    train_pipe *pipe; /* pp > 1: this stage's schedule (NULL: the whole model) */
    int pp;
    int dp, dp_rank, rank;
    int overlap;              /* --overlap: TRAIN_OVERLAP_* bits */
    ckpt_manager *ckpt;       /* --ckpt-dir / --resume (NULL: none) */
    int start, done;          /* first step of this run (after a resume), steps done */
    int stopped;              /* the loop ended on a stop request (a signal), not at --steps */
    int last_update;          /* the step whose update was the last applied (start: none yet) */
    int skip_streak;          /* skipped (non-finite) steps in a row up to the last one */
    char skip_why[128];       /* the last one's reason */
    long long tokens0;        /* training tokens consumed by the steps before start */
    ckpt_st_dtype save_dtype; /* --save-dtype */
} trainer;

static ms_status open_loaders(trainer *t) {
    const train_config *tc = t->tc;
    data_loader_config dc = {.pattern = tc->train_data,
                             .B = t->micro,
                             .T = tc->seq,
                             .vocab = t->mc.vocab,
                             .seed = tc->seed,
                             .rank = t->dp_rank,
                             .nranks = t->dp,
                             .accum = t->accum};
    MS_TRY(data_order_parse(tc->data_order, &dc.order));
    ms_status st = data_loader_open(&t->train, &dc);
    if (st != MS_OK) return ms_error_wrap(st, "--train-data"); /* the option, then the file */
    ms_info("train data: %s: %d shard(s), %llu tokens, order %s", tc->train_data,
            data_loader_num_shards(t->train),
            (unsigned long long)data_loader_total_tokens(t->train), tc->data_order);
    if (tc->val_data && *tc->val_data) {
        train_val_config vc = {.pattern = tc->val_data,
                               .batches = tc->val_batches,
                               .batch = tc->batch,
                               .T = tc->seq,
                               .micro = t->micro,
                               .vocab = t->mc.vocab,
                               .world = t->world,
                               .grid = t->grid};
        MS_TRY(train_val_open(&t->val, &vc));
        /* (shards of another tokenizer than the training data's were read: a val_loss of
         * nothing) */
        MS_TRY(data_loader_check_same_kind(t->train, "--train-data", train_val_loader(t->val),
                                           "--val-data"));
    }
    return MS_OK;
}

/* Start MPI and the rank grid when launched by mpirun (train_dist_open: the
 * ranks compare their options before anything that depends on them, the
 * layout's checks and the grid's groups); a plain single process never
 * touches MPI. */
static ms_status setup_dist(trainer *t) {
    t->pp = t->tc->pp > 0 ? t->tc->pp : 1;
    MS_TRY(train_dist_open(t->tc, "train", &t->world, &t->grid, &t->dp, &t->gate));
    if (!t->world) return MS_OK;
    t->rank = comm_world_rank(t->world);
    t->dp_rank = comm_grid_coord_of(t->grid).dp;
    return MS_OK;
}

/* Ranks of a tensor-parallel group need identical batches: on each host
 * the group's lowest rank there reads them (through the prefetcher) and
 * shares them with the group's other ranks of that host through a
 * shared-memory ring, instead of every rank reading the shards.  A group
 * spanning hosts has one reader per host (shared memory does not cross
 * hosts); a rank alone of its group on its host reads for itself. */
/* The batch ring waits for a member: a wait for that rank (data_shm_config.on_wait). */
static void ring_waits(void *ctx, int member) {
    trainer *t = ctx;
    int peer = comm_group_global_rank(t->ring_group, member);
    t->ring_member = member;
    if (t->ring_wait < 0)
        t->ring_wait = comm_world_wait_begin(t->world, "batch_ring", peer);
    else
        comm_world_wait_peer(t->world, t->ring_wait, peer);
}

/* The ring's wait ends once the world broke (data_shm_config.give_up). */
static int ring_gives_up(void *ctx) {
    trainer *t = ctx;
    return comm_world_broken(t->world);
}

/* A ring call's failure st: the world's, the root cause, when it broke first (a collective
 * of the rank waited for timed out: its "not arrived" names it for the supervisor); else the
 * ring's own, which breaks the world as a timeout of a collective does (the gates at the end
 * are refused at once instead of waiting for the same rank again), with the state of the
 * member it waited for as the arrival board sees it (stopped, exited, alive: the supervisor
 * books the hang on it, not on this rank). */
static ms_status ring_failure(trainer *t, ms_status st) {
    if (st == MS_OK || !t->world) return st;
    char ring[1024];
    snprintf(ring, sizeof ring, "%s", ms_errmsg());
    if (comm_world_broken(t->world)) return comm_world_check(t->world, ring);
    int timed_out = strstr(ring, "timed out") != NULL, m = t->ring_member;
    int peer = timed_out && m >= 0 ? comm_group_global_rank(t->ring_group, m) : -1;
    return comm_world_fail_wait(t->world, peer, m, timed_out ? MS_ERR_TIMEOUT : st, ring);
}

static ms_status open_ring(trainer *t) {
    if (!t->grid || comm_grid_dim_size(t->grid, COMM_DIM_TP) < 2) return MS_OK;
    comm_group *tp = comm_grid_group(t->grid, COMM_DIM_TP);
    MS_TRY(comm_group_create_split(tp, comm_world_host_index(t->world, t->rank),
                                   comm_group_rank(tp), "ring", &t->ring_group));
    comm_group *g = t->ring_group;
    if (comm_group_size(g) < 2) {
        ms_info("data: every rank reads its own batches (its tensor-parallel group has no other "
                "rank on its host)");
        return MS_OK;
    }
    char name[160] = {0};
    t->ring_leader = comm_group_rank(g) == 0;
    if (t->ring_leader) { /* the pid alone repeats across pid namespaces sharing /dev/shm: two
                           * jobs' rings, one unlinking the other's, or mapping it */
        uint64_t salt = 0;
        if (getrandom(&salt, sizeof salt, GRND_NONBLOCK) != (ssize_t)sizeof salt)
            salt = (uint64_t)(ms_now() * 1e9) ^ ((uint64_t)getpid() << 32);
        char host[64], prefix[96];
        ms_shm_host_name(host, sizeof host);
        /* the rings of this host's killed jobs (a leader killed before it
         * unlinked its ring) that no live process maps: removed */
        snprintf(prefix, sizeof prefix, "megascale-batches-%s-", host);
        ms_sweep_result sw;
        if (ms_sweep_unused("/dev/shm", prefix, 2.0, 1, &sw) == MS_OK && sw.removed)
            ms_info("data: removed %d batch ring(s) of killed jobs from /dev/shm (%.1f MB)",
                    sw.removed, (double)sw.bytes / 1e6);
        snprintf(name, sizeof name, "/%s%d-%016llx", prefix, (int)getpid(),
                 (unsigned long long)salt);
    }
    MS_TRY(comm_broadcast(g, name, sizeof name, COMM_U8, 0));
    int ranks[64]; /* the members' global ranks, for the ring's errors (beyond 64: none) */
    int named = comm_group_size(g) <= (int)(sizeof ranks / sizeof *ranks);
    for (int i = 0; named && i < comm_group_size(g); i++)
        ranks[i] = comm_group_global_rank(g, i);
    data_shm_config rc = {.name = name,
                          .followers = comm_group_size(g) - 1,
                          .batch_ints = (size_t)t->micro * t->tc->seq,
                          .depth = 4,
                          .timeout_s = comm_world_timeout(t->world),
                          .member = comm_group_rank(g),
                          .ranks = named ? ranks : NULL,
                          .on_wait = ring_waits,
                          .give_up = ring_gives_up,
                          .wait_ctx = t};
    t->ring_wait = -1;
    t->ring_member = -1;
    if (t->ring_leader) {
        MS_TRY(data_shm_open_leader(&t->ring, &rc));
        MS_TRY(comm_barrier(g));  /* the segment exists before followers look */
        MS_TRY(comm_barrier(g));  /* ... and every follower has mapped it */
        data_shm_unlink(t->ring); /* a killed job leaves nothing in /dev/shm */
        ms_info("data: one reader per host and tp group: rank %d reads, the other %d tp rank(s) "
                "of host %s get its batches through shared memory (%s)%s",
                t->rank, rc.followers, comm_world_host(t->world, t->rank), name,
                comm_group_size(g) < comm_group_size(tp) ? " (the tp group spans hosts: one "
                                                           "reader on each)"
                                                         : "");
        return MS_OK;
    }
    MS_TRY(comm_barrier(g));
    data_prefetch_stop(t->prefetch); /* followers do not read the shards */
    t->prefetch = NULL;
    ms_status st = data_shm_open_follower(&t->ring, &rc);
    ms_status bst = comm_barrier(g); /* even after a failure: the leader waits here */
    return st != MS_OK ? st : bst;
}

/* Micro-batch k of the step: *inp, *tgt (micro, seq) point at slot k of
 * the replay buffer; *wait = time waited for it.  The step's first
 * computation fetches it (prefetcher, or the tp leader's shared-memory
 * ring) into the slot; a redo (t->replay) serves the slot as it is, so
 * every rank recomputes the same step from its own copy and the data
 * cursor does not move. */
static ms_status next_batch(trainer *t, int k, const int32_t **inp, const int32_t **tgt,
                            double *wait) {
    size_t n = (size_t)t->micro * t->tc->seq;
    int32_t *bi = t->rinp + (size_t)k * n, *bt = t->rtgt + (size_t)k * n;
    *inp = bi, *tgt = bt, *wait = 0;
    if (t->replay) return MS_OK;
    int64_t t0 = ms_ev_now();
    /* in the ring, a wait for the leader, or for a follower to free the
     * oldest slot, is a wait for a rank (ring_waits): the heartbeats and
     * the hang dumps say so */
    if (t->ring && !t->ring_leader) {
        ms_status st = ring_failure(t, data_shm_get(t->ring, bi, bt, wait));
        comm_world_wait_end(t->world, t->ring_wait); /* after the failure's report: its
                                                      * settle is still a wait for the rank */
        t->ring_wait = -1;
        MS_TRY(st);
    } else {
        MS_TRY(data_prefetch_next(t->prefetch, bi, bt, wait));
        if (t->ring) {
            double put_wait = 0;
            ms_status st = ring_failure(t, data_shm_put(t->ring, bi, bt, &put_wait));
            comm_world_wait_end(t->world, t->ring_wait);
            t->ring_wait = -1;
            MS_TRY(st);
            *wait += put_wait; /* not the leader's compute (the straggler scores) */
        }
    }
    if (*wait > 0) { /* the part of the call spent blocked */
        int64_t t1 = ms_ev_now(), w = (int64_t)(*wait * 1e9);
        ms_ev_span(t->ev_data, 0, t1 - w > t0 ? t1 - w : t0, t1, NULL);
    }
    return MS_OK;
}

/* The CPUs this process may run on (its affinity: mpirun's binding, taskset, a cpuset), or 0
 * when it cannot be told. */
static int affinity_cpus(void) {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

/* --threads, or the cores shared by the ranks of this node, at most the CPUs this rank may
 * run on (mpirun binds each rank of a job of 1 or 2 to one core by default: 32 threads of a
 * 64-core host's 2 ranks took turns on one core each).  Alone: 0, OpenMP's default (which
 * counts the CPUs of the affinity). */
static int threads_per_rank(const train_config *tc) {
    if (tc->threads > 0) return tc->threads;
    int local = ms_ctx_get()->local_size;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (local <= 1 || cores < 1) return 0;
    int per = cores / local > 0 ? (int)(cores / local) : 1;
    int mine = affinity_cpus();
    return mine > 0 && mine < per ? mine : per;
}

/* Training tokens consumed after `steps` steps (those before the resume
 * with their own --batch and --seq, in tokens0). */
static long long tokens_after(const trainer *t, int steps) {
    return t->tokens0 + (long long)(steps - t->start) * t->tc->batch * t->tc->seq;
}

/* The trainer's state for a checkpoint after `step` steps. */
static ckpt_train_state ckpt_state(trainer *t, int step) {
    const train_config *tc = t->tc;
    ckpt_train_state s = {.step = step,
                          .opt_steps = opt_steps_done(t->opt),
                          .seed = tc->seed,
                          .sched = t->sched,
                          .batch = tc->batch,
                          .seq = tc->seq,
                          .tokens = (uint64_t)tokens_after(t, step)};
    s.cursor = t->prefetch ? data_prefetch_cursor(t->prefetch) : data_loader_cursor(t->train);
    snprintf(s.optimizer, sizeof s.optimizer, "%s", tc->optimizer ? tc->optimizer : "");
    s.beta1 = tc->beta1;
    s.beta2 = tc->beta2;
    s.eps = tc->eps;
    s.weight_decay = tc->weight_decay;
    s.grad_clip = tc->grad_clip;
    snprintf(s.train_data, sizeof s.train_data, "%s", tc->train_data ? tc->train_data : "");
    snprintf(s.val_data, sizeof s.val_data, "%s", tc->val_data ? tc->val_data : "");
    snprintf(s.data_order, sizeof s.data_order, "%s", tc->data_order ? tc->data_order : "");
    s.data_shards = (uint64_t)data_loader_num_shards(t->train);
    s.data_tokens = data_loader_total_tokens(t->train);
    s.val_batches = tc->val_data && *tc->val_data ? tc->val_batches : 0;
    return s;
}

/* The checkpoint manager waits for stage 2 (a slow disk, the final
 * checkpoint): the driver is told no step comes for a while (the beat's
 * phase; the next step's beat says "train" again). */
static void ckpt_waiting(void *ctx) {
    trainer *t = ctx;
    mon_heartbeat_phase(t->hb, "ckpt");
    t->hb_held = 1;
}

/* A validation or a checkpoint's wait is over: the beat says "train" at
 * once, not with the next step's beat, so the driver's limit for a step
 * (not ten times it) applies from here: a rank that hangs right after
 * such a wait (an injected hang fires at the start of the next step) was
 * found only after 10x the no-progress limit.  The driver times the next
 * step from this beat (sup_watch.c). */
static void hb_release(trainer *t) {
    if (!t->hb_held) return;
    t->hb_held = 0;
    mon_heartbeat_phase(t->hb, "train");
}

/* --ckpt-dir / --resume: the checkpoint manager and the state to continue from. */
static ms_status setup_ckpt(trainer *t) {
    const train_config *tc = t->tc;
    if (!(tc->ckpt_dir && *tc->ckpt_dir) && !(tc->resume && *tc->resume)) return MS_OK;
    ckpt_options o = {tc->ckpt_dir,  tc->ckpt_every, tc->ckpt_every_min,
                      tc->ckpt_keep, tc->resume,     tc->ckpt_shm_dir,
                      t->fault_spec, tc->new_run,    0};
    MS_TRY(train_restart_job(tc, &o.restart_job));
    if (tc->ckpt_dir && *tc->ckpt_dir) /* one directory for every host? */
        MS_TRY(ckpt_dir_probe(tc->ckpt_dir, t->world));
    MS_TRY(ckpt_manager_create_world(&t->ckpt, &o, t->model, t->opt, t->zero, t->world));
    ckpt_manager_set_node(t->ckpt, t->node);
    ckpt_manager_set_wait_hook(t->ckpt, ckpt_waiting, t);
    ckpt_train_state now = ckpt_state(t, 0), saved;
    int found = 0;
    MS_TRY(ckpt_manager_resume(t->ckpt, &now, &saved, &found));
    if (found) {
        if (data_loader_seek(t->train, saved.cursor) != MS_OK) /* the log names the commit */
            return ms_error_wrap(MS_ERR_RANGE, "resume at step %d (--data-order sequential)",
                                 saved.step);
        t->start = t->done = saved.step;
        /* the tokens so far, whatever --batch and --seq the earlier runs had
         * (a commit without the count: its own batch x seq for every step) */
        int b = saved.batch > 0 ? saved.batch : tc->batch, s = saved.seq > 0 ? saved.seq : tc->seq;
        t->tokens0 = saved.tokens ? (long long)saved.tokens : (long long)saved.step * b * s;
    }
    ckpt_manager_accepted(t->ckpt); /* a refused start (above) leaves the directory as it was */
    return MS_OK;
}

void train_trace_dir(const train_config *tc, char *out, size_t cap) {
    const char *d = tc->trace_dir ? tc->trace_dir : "";
    out[0] = 0;
    if (!strcmp(d, "none") || !strcmp(d, "off")) return;
    if (*d) {
        snprintf(out, cap, "%s", d);
    } else if (tc->metrics && *tc->metrics) {
        const char *slash = strrchr(tc->metrics, '/');
        int n = slash ? (int)(slash - tc->metrics) : 0;
        snprintf(out, cap, "%.*s%strace", n, tc->metrics, slash ? "/" : "");
    }
}

static void resolve_trace_dir(trainer *t) {
    train_trace_dir(t->tc, t->trace_dir, sizeof t->trace_dir);
}

/* An output file that is one of the run's inputs (--save-weights over the
 * training shard, --log-file appended to --init-from's weights) would
 * destroy what the run reads: refused, naming both options. */
ms_status train_check_not_input(const train_config *tc, const char *opt, const char *path) {
    const struct {
        const char *opt, *in;
    } in[] = {{"--train-data", tc->train_data},
              {"--val-data", tc->val_data},
              {"--init-from", tc->init_from}};
    char match[4096];
    if (ckpt_is_part(path, match, sizeof match))
        return ms_error(MS_ERR_ARG,
                        "%s %s is %s: an output never replaces a checkpoint's file; nothing was "
                        "written",
                        opt, path, match);
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        if (ms_path_is_input(path, in[i].in, match, sizeof match))
            return ms_error(MS_ERR_ARG,
                            "%s %s is an input, %s (%s %s): an output never replaces an input; "
                            "nothing was written",
                            opt, path, match, in[i].opt, in[i].in);
    return MS_OK;
}

ms_status train_check_hparams(const train_config *tc) {
    /* the optimiser computes in float: a value that is 0 or not finite
     * there is refused, not trained with (--eps 1e-46 became 0, and an
     * element without a gradient 0 / (0 + 0) = NaN in the weights) */
    const struct {
        const char *opt;
        double v;
        int zero_ok;
    } v[] = {{"--lr", tc->lr, 0},
             {"--eps", tc->eps, 0},
             {"--grad-clip", tc->grad_clip, 1},
             {"--weight-decay", tc->weight_decay, 1}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        float f = (float)v[i].v;
        if (v[i].zero_ok && v[i].v == 0) continue;
        if (!isfinite(f) || fabsf(f) < FLT_MIN)
            return ms_error(MS_ERR_ARG,
                            "%s %g is %s in float, the precision the optimiser uses: give one in "
                            "[%g, %g]%s",
                            v[i].opt, v[i].v,
                            isfinite(f) ? "too small (0 or subnormal)" : "infinite",
                            (double)FLT_MIN, (double)FLT_MAX, v[i].zero_ok ? ", or 0: none" : "");
    }
    /* a decay just below 1 rounds to 1 in float: the bias correction 1 - beta^t is then 0,
     * and every weight NaN after the first update (--beta2 0.99999999) */
    const struct {
        const char *opt;
        double v;
    } b[] = {{"--beta1", tc->beta1}, {"--beta2", tc->beta2}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if ((float)b[i].v >= 1.0f)
            return ms_error(MS_ERR_ARG,
                            "%s %.10g is 1 in float, the precision the optimiser uses (its bias "
                            "correction 1 - beta^t would be 0): give one at most %.9g",
                            b[i].opt, b[i].v, (double)nextafterf(1.0f, 0.0f));
    return MS_OK;
}

ms_status train_restart_job(const train_config *tc, uint64_t *job) {
    const char *s = tc->restart_job;
    *job = 0;
    if (!s || !*s) return MS_OK;
    size_t n = strspn(s, "0123456789abcdefABCDEF");
    if (n == 16 && !s[16]) *job = strtoull(s, NULL, 16);
    if (!*job)
        return ms_error(MS_ERR_ARG,
                        "--restart-job '%s': not a job id (16 hex digits, not all 0, as "
                        "--ckpt-dir's job file holds)",
                        s);
    if (!(tc->ckpt_dir && *tc->ckpt_dir))
        return ms_error(MS_ERR_ARG, "--restart-job needs --ckpt-dir (the job's directory)");
    return MS_OK;
}

ms_status train_check_outputs(const train_config *tc) {
    uint64_t job;
    MS_TRY(train_restart_job(tc, &job));
    if (tc->new_run && tc->resume && !strcmp(tc->resume, "auto"))
        return ms_error(MS_ERR_ARG, "--resume auto continues the run in --ckpt-dir and --new-run "
                                    "starts a new one there (its commits moved aside): pass one "
                                    "of them");
    const struct {
        const char *opt, *path;
    } files[] = {{"--save-weights", tc->save_weights},
                 {"--metrics", tc->metrics},
                 {"--log-file", tc->log_file}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        MS_TRY(train_check_not_input(tc, files[i].opt, files[i].path));
    return MS_OK;
}

/* Every output path, before anything is read, allocated or trained: a bad
 * one would otherwise fail only when first written (--save-weights: after
 * the whole run, losing the trained weights).  Rank 0 writes the weights
 * and the metrics; every rank writes its trace and checkpoint shards. */
static ms_status check_outputs(trainer *t) {
    const train_config *tc = t->tc;
    MS_TRY(train_check_outputs(tc));
    if (tc->out_dir && *tc->out_dir) { /* every rank: the hosts may not share a file system */
        if (ms_path_check_writable(tc->out_dir, 1) != MS_OK || ms_mkdirs(tc->out_dir) != MS_OK)
            return ms_error_wrap(MS_ERR_ARG, "--out-dir");
    }
    if (tc->log_file && *tc->log_file) {
        if (ms_path_check_writable(tc->log_file, 0) != MS_OK)
            return ms_error_wrap(MS_ERR_ARG, "--log-file");
        MS_TRY(ms_log_open_file(tc->log_file));
    }
    resolve_trace_dir(t);
    const struct {
        const char *opt, *path;
        int is_dir, here;
    } out[] = {
        {"--save-weights", tc->save_weights, 0, t->rank == 0},
        {"--metrics", tc->metrics, 0, t->rank == 0},
        {"--ckpt-dir", tc->ckpt_dir, 1, 1},
        {"--trace-dir", t->trace_dir, 1, 1},
    };
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
        if (out[i].here && out[i].path && *out[i].path &&
            (i == 0 ? ms_path_check_replaceable(out[i].path) /* the weights: renamed into place */
                    : ms_path_check_writable(out[i].path, out[i].is_dir)) != MS_OK)
            return ms_error_wrap(MS_ERR_ARG, "%s", out[i].opt);
    MS_TRY(ckpt_hf_dtype_parse(tc->save_dtype, &t->save_dtype));
    if (t->rank == 0 && !(tc->save_weights && *tc->save_weights) &&
        !(tc->ckpt_dir && *tc->ckpt_dir))
        ms_warn("this run saves no model: neither --save-weights nor --ckpt-dir is given, so "
                "the trained weights are lost when it ends");
    return MS_OK;
}

/* The always-on timers: this rank's event log, its hang-dump path, and the
 * first clock reference.  Every rank opens its log (collective: the clock). */
static ms_status setup_trace(trainer *t) {
    t->ev_data = ms_ev_intern("data_wait");
    t->ev_slow = ms_ev_intern("fault_slow");
    t->ev_opt = ms_ev_intern("optimizer");
    t->ev_ckpt = ms_ev_intern("ckpt_stall");
    t->lane_compute = ms_ev_intern("compute");
    ms_ev_thread_init(t->lane_compute);
    resolve_trace_dir(t);
    if (!t->trace_dir[0]) return MS_OK;
    mon_identity id = {.rank = t->rank, .world = t->world ? comm_world_size(t->world) : 1};
    if (t->grid) {
        comm_grid_coord c = comm_grid_coord_of(t->grid);
        comm_grid_shape sh = comm_grid_shape_of(t->grid);
        id.has_grid = 1;
        id.dp = c.dp, id.pp = c.pp, id.tp = c.tp, id.DP = sh.dp, id.PP = sh.pp, id.TP = sh.tp;
    }
    /* this start's id, rank 0's on every rank: the trace tools keep one run's logs */
    int64_t run = 0;
    if (t->rank == 0 && getrandom(&run, sizeof run, GRND_NONBLOCK) != (ssize_t)sizeof run)
        run = (int64_t)(ms_wall_now() * 1e6) ^ ((int64_t)getpid() << 32);
    if (t->world) MS_TRY(comm_broadcast(comm_world_group(t->world), &run, 1, COMM_I64, 0));
    id.run = (unsigned long long)run;
    double max_bytes = t->tc->trace_max_mb * 1048576.0; /* huge: as good as unbounded */
    MS_TRY(mon_evlog_open(&t->evlog, t->trace_dir, &id, 0,
                          max_bytes < 9e18 ? (long long)max_bytes : 0));
    if (!t->world) return MS_OK;
    char dump[4200];
    snprintf(dump, sizeof dump, "%s/hang_r%05d.json", t->trace_dir, t->rank);
    MS_TRY(comm_world_set_dump_path(t->world, dump));
    long long err_max = 0;
    MS_TRY(mon_clock_sync(t->world, CLOCK_PINGS, NULL, NULL, &err_max));
    ms_info("trace: per-rank event logs in %s (clocks aligned to rank 0 within %.1f us)",
            t->trace_dir, err_max / 1e3);
    return MS_OK;
}

static long long hb_comm_bytes(void *w) {
    return comm_world_bytes(w);
}

static double hb_comm_blocked_s(void *w) {
    return comm_world_blocked_s(w);
}

static int hb_comm_dumps(void *w) {
    return comm_world_dumps(w);
}

/* --heartbeat: beats to the supervisor (megascale launch). */
static ms_status setup_heartbeat(trainer *t) {
    const train_config *tc = t->tc;
    if (!tc->heartbeat || !*tc->heartbeat) return MS_OK;
    mon_heartbeat_config c = {.addr = tc->heartbeat,
                              .token = tc->heartbeat_token,
                              .node = t->node,
                              .rank = t->rank,
                              .world = t->world ? comm_world_size(t->world) : 1,
                              .has_stage = t->grid != NULL,
                              .stage = t->grid ? comm_grid_coord_of(t->grid).pp : 0,
                              .comm_bytes = t->world ? hb_comm_bytes : NULL,
                              .comm_blocked_s = t->world ? hb_comm_blocked_s : NULL,
                              .comm_dumps = t->world && t->trace_dir[0] ? hb_comm_dumps : NULL,
                              .comm_ctx = t->world,
                              .attempt = tc->heartbeat_attempt};
    return mon_heartbeat_open(&t->hb, &c);
}

/* The effective configuration for the metrics' first line: the options as
 * given (tc->config_json), the layout, the device and the peak. */
static char *config_json(const trainer *t) {
    cJSON *o = cJSON_CreateObject();
    cJSON *opts = t->tc->config_json ? cJSON_Parse(t->tc->config_json) : NULL;
    if (opts) cJSON_AddItemToObject(o, "options", opts);
    cJSON *lay = cJSON_AddObjectToObject(o, "layout");
    cJSON_AddNumberToObject(lay, "world", t->world ? comm_world_size(t->world) : 1);
    cJSON_AddNumberToObject(lay, "dp", t->dp);
    cJSON_AddNumberToObject(lay, "tp", t->tc->tp > 0 ? t->tc->tp : 1);
    cJSON_AddNumberToObject(lay, "pp", t->pp);
    cJSON_AddNumberToObject(lay, "vpp", t->tc->vpp > 0 ? t->tc->vpp : 1);
    cJSON_AddNumberToObject(lay, "micro_batch", t->micro);
    cJSON_AddNumberToObject(lay, "accumulation", t->accum);
    cJSON_AddNumberToObject(o, "params", (double)gpt_config_num_params(gpt_get_config(t->model)));
    cJSON_AddNumberToObject(o, "flops_per_token", t->flops_per_token);
    cJSON_AddStringToObject(o, "device", t->be->device_name);
    cJSON_AddStringToObject(o, "cpu_isa", ms_cpu_isa_built()); /* what the binary needs */
    if (!strcmp(t->be->name, "cpu")) {
        char blas[320];
        cJSON_AddStringToObject(o, "cpu_blas", be_cpu_blas_describe(blas, sizeof blas));
        cJSON_AddStringToObject(o, "cpu_gemm",
                                t->be->act_dtype == BE_BF16
                                    ? "onednn-bf16"
                                    : be_cpu_gemm_value(be_cpu_gemm_own(t->be)));
    }
    cJSON_AddNumberToObject(o, "peak_flops", t->peak.flops);
    cJSON_AddStringToObject(o, "peak_source", t->peak.source);
    if (t->trace_dir[0]) cJSON_AddStringToObject(o, "trace_dir", t->trace_dir);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* Rank 0, a new run (--new-run) in a directory whose earlier run's commits
 * it moved aside: that run's record at path (its metrics, train.cfg) goes
 * with them instead of being replaced.  Where it cannot be moved (another
 * file system), a warning says it is replaced. */
static void keep_previous(const trainer *t, const char *path) {
    const char *prev = t->rank == 0 ? ckpt_manager_previous(t->ckpt) : "";
    struct stat sb;
    if (!prev[0] || !path || !*path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return;
    char to[4600];
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(to, sizeof to, "%s/%s", prev, base);
    if (rename(path, to) == 0)
        ms_info("--new-run: the earlier run's %s is now %s", path, to);
    else
        ms_warn("--new-run: could not move the earlier run's %s to %s (%s): this run replaces it",
                path, to, strerror(errno));
}

/* The step record: progress line, metrics (rank 0), event log, summary. */
static ms_status setup_record(trainer *t) {
    keep_previous(t, t->tc->metrics); /* also when --new-run resumes another directory's */
    MS_TRY(mon_record_create(&t->rec));
    MS_TRY(mon_record_add(t->rec, mon_sink_progress(t->tc->log_every)));
    mon_sink m;
    char *cfg = config_json(t);
    ms_status st = mon_sink_metrics(&m, t->rank == 0 ? t->tc->metrics : NULL, t->start, cfg);
    free(cfg);
    MS_TRY(st);
    if (m.on_step) MS_TRY(mon_record_add(t->rec, m));
    if (t->evlog) MS_TRY(mon_record_add(t->rec, mon_sink_events()));
    if (t->hb) MS_TRY(mon_record_add(t->rec, mon_sink_heartbeat(t->hb)));
    return mon_record_add(t->rec, mon_sink_summary(t->rank));
}

/* --cpu-dtype bf16 pays only where the CPU's bf16 products outrun its fp32
 * ones: AMD's Zen 5 runs them at twice the rate, an Intel Xeon without AMX
 * at half (docs/perf.md).  With the peak probed in bf16, probe fp32 too
 * (~0.1 s; a cached peak brings its fp32 rate) and say so when fp32 would
 * be faster. */
static void check_cpu_bf16(trainer *t) {
    if (strcmp(t->be->name, "cpu") || t->be->act_dtype != BE_BF16 || !t->peak.from_probe) return;
    double f32 = t->peak.fp32_flops;
    be_backend *f = NULL;
    if (!(f32 > 0) && be_cpu_create(&f, t->be->threads) == MS_OK) {
        f32 = t->peak.fp32_flops = mon_probe_peak_flops(f, 2048, 1);
        be_destroy(f);
    }
    if (f32 > t->peak.flops)
        ms_warn("--cpu-dtype bf16: this CPU's bf16 GEMMs ran at %.1f GFLOP/s, its fp32 ones at "
                "%.1f: --cpu-dtype fp32 would likely be faster here",
                t->peak.flops / 1e9, f32 / 1e9);
}

/* --inject-fault / --ckpt-fault entries this run can never meet: a rank it does not have, or
 * step 0, is refused (a test that tests nothing; `launch --faults` and `diag --inject-fault`
 * refuse theirs too; before, `exit@3:5` in a run of one process trained and exited 0); a
 * trainer's fault past --steps is said (the checkpoint's points past it are the tests' way to
 * arm the serial persist without firing, src/ckpt/ckpt_fault.c).  A node target that no rank
 * has never fires, as documented. */
static ms_status check_faults(const trainer *t, const train_config *tc) {
    int world = t->world ? comm_world_size(t->world) : 1;
    for (int i = 0; i < t->fault.n; i++) {
        const ms_fault *f = &t->fault.f[i];
        char at[256];
        ms_fault_entry_format(f, at, sizeof at);
        if (f->rank >= world)
            return ms_error(MS_ERR_ARG,
                            "--inject-fault / --ckpt-fault: %s: rank %d is not one of this "
                            "run's %d process(es); it would never fire",
                            at, f->rank, world);
        if (f->step == 0)
            return ms_error(MS_ERR_ARG,
                            "--inject-fault / --ckpt-fault: %s: step 0: steps count from 1", at);
        if (t->rank == 0 && f->step > tc->steps && !ms_fault_is_ckpt(f->kind))
            ms_warn("--inject-fault: %s is past --steps %d: it never fires in this run", at,
                    tc->steps);
    }
    return MS_OK;
}

/* The model's shape: the preset's, or --init-from's.  --init-from is the
 * first start's only: a run that resumes takes its commit's weights.  When
 * the file is gone (cleaned up while a job ran: a restart under the
 * supervisor would fail) and --resume finds a commit, the shape comes from
 * the commit and the file is not read (t->init_gone). */
static ms_status model_config(trainer *t) {
    const train_config *tc = t->tc;
    struct stat sb;
    const char *where = tc->resume && strcmp(tc->resume, "auto") ? tc->resume : tc->ckpt_dir;
    char commit[4300];
    ckpt_manifest mf;
    if (!tc->init_from || !*tc->init_from || stat(tc->init_from, &sb) == 0 || errno != ENOENT ||
        !tc->resume || !*tc->resume || !where || !*where ||
        ckpt_find_commit(where, commit, sizeof commit) != MS_OK ||
        ckpt_validate(commit, 0, &mf) != MS_OK)
        return train_model_config(tc, "--init-from", &t->mc);
    ms_status st = train_model_config_of(tc, &mf.model, commit, &t->mc);
    ckpt_manifest_free(&mf);
    if (st == MS_OK && t->rank == 0)
        ms_warn("--init-from %s is gone: this run resumes (%s), whose weights replace it; the "
                "model's shape comes from %s",
                tc->init_from, tc->resume, commit);
    t->init_gone = st == MS_OK;
    return st;
}

static ms_status setup(trainer *t) {
    const train_config *tc = t->tc;
    MS_TRY(setup_dist(t));
    /* rank 0 checks its outputs alone: every rank learns of a refusal before
     * the first collective (rank 1 went on into one, then timed out) */
    MS_TRY(train_gate_pass(t->gate, check_outputs(t)));
    MS_TRY(ms_node_of(tc->node_map, t->rank, t->world ? comm_world_size(t->world) : 1, t->node,
                      "--node-map (MS_NODE_MAP)"));
    MS_TRY(setup_trace(t));
    MS_TRY(setup_heartbeat(t));
    MS_TRY(model_config(t));
    MS_TRY(train_check(tc, &t->mc, t->dp, &t->micro, &t->accum));
    MS_TRY(train_check_tp(tc, &t->mc, t->micro));
    MS_TRY(train_overlap_parse(tc->overlap, &t->overlap));
    if (t->rank == 0) train_warn_pipeline(tc, t->mc.n_layer, t->dp, t->pp, t->accum);
    /* whole: the driver hands plans of up to MS_FAULT_SPEC_MAX bytes (a copy
     * cut at 8 KiB failed to parse, or moved a fault: "exit@12345" as @12) */
    const char *inj = tc->inject_fault ? tc->inject_fault : "",
               *ckf = tc->ckpt_fault ? tc->ckpt_fault : "";
    size_t spec_n = strlen(inj) + strlen(ckf) + 2;
    t->fault_spec = malloc(spec_n);
    if (!t->fault_spec) return ms_error(MS_ERR_NOMEM, "--inject-fault: out of memory");
    snprintf(t->fault_spec, spec_n, "%s%s%s", inj, *inj && *ckf ? "," : "", ckf);
    MS_TRY(
        ms_fault_parse(&t->fault, t->fault_spec, "--inject-fault / --ckpt-fault (MS_CKPT_FAULT)"));
    ms_fault_plan_set_node(&t->fault, t->node); /* ":node=NAME" entries fire on this node only */
    MS_TRY(check_faults(t, tc));
    MS_TRY(train_check_hparams(tc));
    opt_config oc = {OPT_ADAMW,      (float)tc->beta1,        (float)tc->beta2,
                     (float)tc->eps, (float)tc->weight_decay, (float)tc->grad_clip};
    MS_TRY(opt_kind_parse(tc->optimizer, &oc.kind));
    t->sched =
        (opt_schedule){OPT_SCHED_COSINE, (float)tc->lr, tc->warmup, tc->steps, (float)tc->lr_floor};
    MS_TRY(opt_sched_parse(tc->lr_schedule, &t->sched.kind));
    if (t->rank == 0 && tc->warmup > 0 && tc->warmup >= tc->steps) /* legal, rarely meant */
        ms_warn("--warmup %d is not shorter than --steps %d: the lr rises for the whole run, "
                "ends at %.3g (%.0f%% of --lr %g) and never %s",
                tc->warmup, tc->steps, (double)opt_lr_at(&t->sched, tc->steps - 1),
                100.0 * opt_lr_at(&t->sched, tc->steps - 1) / tc->lr, tc->lr,
                t->sched.kind == OPT_SCHED_COSINE ? "decays (to --lr-floor)" : "holds --lr");
    /* fail fast on bad data, before allocating; a host without the files
     * says so to every rank before the collectives of the model's creation */
    MS_TRY(train_gate_pass(t->gate, open_loaders(t)));
    be_options bo = be_options_default();
    bo.threads = threads_per_rank(tc);
    bo.cuda_profile = tc->cuda_profile;
    bo.cpu_profile = tc->cpu_profile;
    bo.cuda_fuse_gelu = tc->cuda_fuse_gelu;
    if (t->rank == 0) be_warn_ignored(tc->device, &bo);
    /* cuBLASLt's fused GeLU is of the fp32 product, the backward's recompute
     * can only start from the bf16 pre-activation the forward kept: with
     * --recompute gelu the forward takes the unfused path too, so that the
     * backward's activations are the forward's bits (they differed) */
    bo.cuda_fuse_gelu = tc->cuda_fuse_gelu && !(t->mc.recompute & GPT_RECOMPUTE_GELU);
    MS_TRY(be_dtype_parse(tc->cpu_dtype, tc->device, &bo.cpu_dtype));
    MS_TRY(be_create(&t->be, tc->device, &bo));
    /* device spans on the trace's device lane (a CPU's would repeat the host ones) */
    MS_TRY(mon_devtime_create(&t->dev, t->be, t->be->stream != NULL && t->evlog != NULL));
    t->ev_dev_fb = ms_ev_intern("dev_fwd_bwd");
    t->ev_dev_opt = ms_ev_intern("dev_optimizer");
    MS_TRY(train_dist_device(tc, t->world, t->grid, t->be));
    MS_TRY(train_model_create(tc, &t->mc, t->be, t->world, t->grid, t->micro, t->accum,
                              16 * (size_t)t->dp, &t->model, &t->pipe));
    gpt_set_tp_overlap(t->model, (t->overlap & TRAIN_OVERLAP_TP) != 0);
    if (t->pipe) train_pipe_set_overlap(t->pipe, (t->overlap & TRAIN_OVERLAP_PP) != 0);
    if (tc->init_from && *tc->init_from && !t->init_gone) {
        ms_status st = ckpt_hf_load(t->model, tc->init_from);
        if (st != MS_OK) return ms_error_wrap(st, "--init-from");
        ms_info("weights: loaded %s", tc->init_from);
    } else {
        gpt_init(t->model, tc->seed);
    }
    if (t->dp > 1)
        MS_TRY(par_zero_create(&t->zero, t->model, comm_grid_group(t->grid, COMM_DIM_DP)));
    if (t->zero) par_zero_set_overlap(t->zero, (t->overlap & TRAIN_OVERLAP_DP) != 0);
    MS_TRY(opt_create(&t->opt, &oc, t->model, t->zero));
    if (t->pipe) /* the norm sums over the stages, the last stage's wte copy left out */
        opt_set_pipeline(t->opt, comm_grid_group(t->grid, COMM_DIM_PP),
                         train_pipe_last_stage(t->pipe) ? gpt_find(t->model, "wte.weight") : -1);
    MS_TRY(setup_ckpt(t)); /* resumes before the prefetch thread reads the loader */
    size_t n = (size_t)t->micro * tc->seq;
    t->rinp = malloc((size_t)t->accum * n * sizeof(int32_t));
    t->rtgt = malloc((size_t)t->accum * n * sizeof(int32_t));
    if (!t->rinp || !t->rtgt) return ms_error(MS_ERR_NOMEM, "trainer: out of memory");
    t->flops_per_token = gpt_flops_per_token(&t->mc, tc->seq);
    mon_peak_init(&t->peak, t->be, tc->peak_flops, tc->peak_cache);
    check_cpu_bf16(t);
    mon_peak_cache_save(&t->peak, t->be); /* a probed peak, for the next start on this host */
    MS_TRY(setup_record(t));
    /* started last, so the probe above runs on idle cores */
    MS_TRY(data_prefetch_start(&t->prefetch, t->train, t->micro, tc->seq, 4));
    MS_TRY(open_ring(t));
    return MS_OK;
}

/* Rank 0: the checkpoints committed since the last call, oldest first, one
 * mon_ckpt each to the step record (the metrics' "ckpt" lines); the first
 * sink failure is returned. */
static ms_status report_commits(trainer *t) {
    ckpt_commit_record c[16];
    ms_status first = MS_OK;
    for (int n; t->rec && (n = ckpt_manager_take_commits(t->ckpt, c, 16)) > 0;)
        for (int i = 0; i < n; i++) {
            mon_ckpt m = {.step = c[i].step,
                          .bytes = (int64_t)c[i].bytes,
                          .stall_ms = c[i].stall_ms,
                          .persist_ms = c[i].persist_ms,
                          .wall_s = c[i].wall_s};
            ms_status st = mon_record_ckpt(t->rec, &m);
            if (st != MS_OK && first == MS_OK) first = st;
        }
    return first;
}

/* Rank 0, which commits: the commits that stood with a warning (the directory's fsync or
 * DIR/latest failed: the disk) into the heartbeat, for the supervisor's event log. */
static void hb_ckpt_warnings(trainer *t) {
    if (!t->hb || !t->ckpt) return;
    int warned, step;
    char msg[512];
    ckpt_manager_commit_warnings(t->ckpt, &warned, &step, msg, sizeof msg);
    mon_heartbeat_ckpt_warned(t->hb, warned, step, msg);
}

/* Free everything; finalize MPI only after a run that every rank finished
 * (after a failure on one rank the others may be stuck in a collective: the
 * caller exits non-zero and mpirun ends the job). */
static void teardown(trainer *t, ms_status st) {
    char why[2048]; /* the failure's message: the heartbeat's last word, and kept for main */
    snprintf(why, sizeof why, "%s", st == MS_OK ? "" : ms_errmsg());
    int reported = st != MS_OK && ms_error_reported(); /* every rank knows it */
    if (t->ckpt && st != MS_OK) { /* a failed run: the commits of the persist in flight too */
        (void)ckpt_manager_wait(t->ckpt); /* as long as destroy would wait for it */
        (void)report_commits(t);
    }
    hb_ckpt_warnings(t); /* the last beat says a warned commit, the final one's, a failed run's */
    ckpt_manager_destroy(t->ckpt); /* waits for a persist in flight */
    mon_record_destroy(t->rec);
    data_shm_close(t->ring);
    data_prefetch_stop(t->prefetch);
    data_loader_close(t->train);
    train_val_close(t->val);
    opt_destroy(t->opt);
    par_zero_destroy(t->zero);
    train_pipe_destroy(t->pipe);
    gpt_destroy(t->model);
    mon_devtime_destroy(t->dev);
    if (t->be) be_destroy(t->be);
    free(t->rinp);
    free(t->rtgt);
    free(t->fault_spec);
    if (t->world && st == MS_ERR_TIMEOUT) { /* let the host's other ranks write their dumps */
        int missing = comm_world_dump_grace(t->world, 3.0);
        if (missing) ms_warn("hang dumps: %d rank(s) of this host did not answer", missing);
    }
    mon_evlog_close(t->evlog); /* after every thread that records has stopped */
    if (st != MS_OK)
        mon_heartbeat_error(t->hb, why, st == MS_ERR_ARG);
    else if (t->done >= t->tc->steps)
        mon_heartbeat_phase(t->hb, "done");
    else /* interrupted (SIGTERM/SIGINT) before --steps: not done, the driver restarts it */
        mon_heartbeat_stopped(t->hb, ms_ctx_get()->stop_here);
    mon_heartbeat_close(t->hb);
    comm_group_destroy(t->ring_group);
    comm_grid_destroy(t->grid);
    if (st != MS_OK) { /* what main reports */
        ms_error(st, "%s", why);
        ms_error_set_reported(reported);
    }
    if (train_gate_end(t->gate, t->world, st) != MS_OK && st == MS_OK) ms_errorf("%s", ms_errmsg());
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
    train_dist_log_hosts(t->world, t->grid);
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
    char blas[320], gemm[256], both[600];
    const char *kernels = NULL;
    if (!strcmp(t->be->name, "cpu")) {
        kernels = be_cpu_blas_describe(blas, sizeof blas);
        if (t->be->act_dtype == BE_F32) { /* the bf16 mode's GEMMs are oneDNN's */
            snprintf(both, sizeof both, "%s; %s", be_cpu_gemm_describe(gemm, sizeof gemm), blas);
            kernels = both;
        }
    }
    const char *gm = ms_ctx_get()->cpu_gemm; /* the fp32 GEMM's choice: none in bf16 */
    const char *bf16 = !kernels || t->be->act_dtype != BE_BF16 ? ""
                       : *gm && strcmp(gm, "auto")
                           ? ", bf16 (--cpu-dtype bf16: oneDNN's bf16 GEMMs; MS_CPU_GEMM, which "
                             "picks the fp32 GEMM, does not apply)"
                           : ", bf16 (--cpu-dtype bf16: oneDNN's bf16 GEMMs)";
    ms_info("batch %d x seq %d = %lld tokens/step (micro-batch %d x %d accumulation), %d steps, "
            "%s, lr %g (%s, warmup %d), device %s (%d thread%s%s; compiled for %s%s%s)",
            tc->batch, tc->seq, (long long)tc->batch * tc->seq, t->micro, t->accum, tc->steps,
            tc->optimizer, tc->lr, tc->lr_schedule, tc->warmup, t->be->name, t->be->threads,
            t->be->threads == 1 ? "" : "s", bf16, ms_cpu_isa_built(), kernels ? "; " : "",
            kernels ? kernels : "");
    double gf = t->peak.flops / 1e9; /* a small --peak-flops (1e6) read "0.0 GFLOP/s" */
    ms_info("MFU against a peak of %.*f GFLOP/s per rank: %s",
            gf >= 10     ? 1
            : gf >= 0.01 ? 3
                         : 6,
            gf, t->peak.source);
    /* threads that take turns on the cores: more than this rank may run on (mpirun binds
     * each rank to one core by default; taskset; a cgroup's cpuset), or than the host has
     * for all of its ranks */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int local = ms_ctx_get()->local_size > 0 ? ms_ctx_get()->local_size : 1, mine = affinity_cpus();
    if (kernels && mine > 0 && t->be->threads > mine && ms_ctx_get()->local_rank == 0)
        ms_warn("%d thread(s) on a rank that may run on %d CPU(s) (its affinity: mpirun binds "
                "each rank to a core unless --bind-to none; taskset; a cpuset): they take turns "
                "and every step is slower (--threads %d)",
                t->be->threads, mine, mine);
    else if (kernels && cpus > 0 && (long)t->be->threads * local > cpus &&
             ms_ctx_get()->local_rank == 0)
        ms_warn("%d thread(s) on each of %d rank(s) of this host are more than its %ld CPU(s): "
                "they take turns on the cores and every step is slower (--threads %ld)",
                t->be->threads, local, cpus, cpus / local > 0 ? cpus / local : 1);
    if (t->val) train_val_log(t->val);
}

/* The loss over the fixed validation set (train_val). */
static ms_status validate(trainer *t, float *loss) {
    double l = 0;
    MS_TRY(train_val_run(t->val, t->model, t->pipe, &l));
    *loss = (float)l;
    return MS_OK;
}

static ms_status log_val(trainer *t, int step) {
    double t0 = ms_now();
    mon_heartbeat_phase(t->hb, "val");
    t->hb_held = 1;
    mon_val v = {.step = step, .t0_ns = ms_ev_now()};
    MS_TRY(validate(t, &v.val_loss));
    v.t1_ns = ms_ev_now();
    v.sec = ms_now() - t0;
    v.wall_s = ms_wall_now();
    return mon_record_val(t->rec, &v);
}

typedef struct {
    float loss, lr;
    opt_stats os;
    double sec, data_sec, comm_sec; /* comm: exposed (blocked) ZeRO communication */
    double wait_sec;                /* this thread blocked in comm_wait (comm_thread_wait_ns) */
    double bubble_sec;              /* pp > 1: waited on pipeline receives */
    double dim_sec[3];              /* blocked on the tp, dp, pp groups (exposed, per dimension) */
    /* device timers (CUDA events on a GPU): forward + backward, and gradient
     * sync + optimiser, of the last step the device has finished (read late,
     * so that reading them never waits: usually the previous step's) */
    double dev_fb_ms, dev_opt_ms;
    int64_t t0_ns, t1_ns;
    int skipped, redone;
    char why[512]; /* the non-finite result of the last computation ("" if finite) */
    int nan_ranks[MON_NAN_RANKS], n_nan_ranks; /* its sources (nan_sources) */
} step_result;

/* pp > 1: the step's micro-batches through this stage's schedule; *loss =
 * the sum of their losses (from the last stage, on every stage). */
static ms_status pipe_micro_batches(trainer *t, float dloss, double *loss, step_result *r) {
    for (int k = 0; k < t->accum; k++) {
        const int32_t *inp, *tgt;
        double wait = 0;
        MS_TRY(next_batch(t, k, &inp, &tgt, &wait)); /* into the replay buffer's slot k */
        r->data_sec += wait;
    }
    if (t->zero) par_zero_arm(t->zero); /* the hooks fire on each chunk's last micro-batch */
    MS_TRY(train_pipe_step(t->pipe, t->rinp, t->rtgt, t->micro, t->tc->seq, dloss, loss));
    r->bubble_sec += train_pipe_bubble(t->pipe);
    return MS_OK;
}

/* Injected nan-grad: a NaN where this rank's optimiser reads it, at the
 * start of each of its ZeRO shards (or of each tensor), so that the
 * non-finite check sees it whichever rank it is injected on. */
static void poison_grads(trainer *t) {
    float nan = NAN, *g = gpt_grads(t->model);
    int n = t->zero ? par_zero_num_shards(t->zero) : gpt_num_tensors(t->model);
    for (int i = 0; i < n; i++) {
        size_t b, e;
        if (t->zero) {
            par_zero_shard(t->zero, i, &b, &e);
        } else {
            b = gpt_tensor(t->model, i)->offset;
            e = b + gpt_tensor(t->model, i)->numel;
        }
        if (e > b) t->be->to_device(t->be, g + b, &nan, sizeof nan);
    }
}

/* A non-finite gradient norm: which ranks' own gradients were not finite
 * (opt_stats.own_nonfinite, before the sums over ranks), gathered on every
 * rank (all of them are here: the norm is the same everywhere), into r and
 * appended to r->why.  With ZeRO a rank's own gradients are the shards it
 * updates, after the reduce-scatter summed the data-parallel group's. */
static ms_status nan_sources(trainer *t, step_result *r) {
    int n = t->world ? comm_world_size(t->world) : 1;
    int32_t mine = r->os.own_nonfinite != 0, *all = &mine;
    if (n > 1) {
        all = malloc(sizeof(int32_t) * (size_t)n);
        if (!all) return ms_error(MS_ERR_NOMEM, "non-finite check: out of memory");
        ms_status st = comm_allgather(comm_world_group(t->world), &mine, all, 1, COMM_I32);
        if (st != MS_OK) {
            free(all);
            return st;
        }
    }
    r->n_nan_ranks = 0;
    char list[160] = "";
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (!all[i]) continue;
        int rank = n > 1 ? i : t->rank;
        if (r->n_nan_ranks < MON_NAN_RANKS) { /* the first few, by name */
            r->nan_ranks[r->n_nan_ranks] = rank;
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "", rank);
        } else if (r->n_nan_ranks == MON_NAN_RANKS) {
            len += (size_t)snprintf(list + len, sizeof list - len, ", ...");
        }
        r->n_nan_ranks++;
    }
    if (all != &mine) free(all);
    size_t w = strlen(r->why);
    if (r->n_nan_ranks == 0)
        snprintf(r->why + w, sizeof r->why - w, "; no rank's own gradients were non-finite");
    else
        snprintf(r->why + w, sizeof r->why - w, "; non-finite in the gradients of %s %s%s%s",
                 r->n_nan_ranks == 1 ? "rank" : "ranks", list,
                 r->n_nan_ranks == n && n > 1 ? " (every rank)" : "",
                 t->zero ? " (the shards they update, summed over their data-parallel group)" : "");
    return MS_OK;
}

/* One computation of the step (attempt 0: the first; later ones: redos
 * from the replay buffer), then the optimiser at r->lr.  r->why is set
 * when the loss or a gradient is not finite (nothing was updated); other
 * failures are returned. */
static ms_status compute_update(trainer *t, int step, int attempt, step_result *r) {
    const train_config *tc = t->tc;
    int h_start = mon_devtime_mark(t->dev);
    r->why[0] = 0;
    if (!t->grads_zero) gpt_zero_grads(t->model); /* the first step, or after a failed update */
    t->grads_zero = 0;
    float dloss = 1.0f / ((float)tc->batch * (float)tc->seq);
    double loss = 0;
    if (t->pipe) MS_TRY(pipe_micro_batches(t, dloss, &loss, r));
    for (int k = 0; !t->pipe && k < t->accum; k++) {
        const int32_t *inp, *tgt;
        double wait = 0;
        MS_TRY(next_batch(t, k, &inp, &tgt, &wait));
        r->data_sec += wait;
        if (t->zero && k + 1 == t->accum) par_zero_arm(t->zero); /* overlap the reduce-scatter */
        loss += gpt_forward_backward(t->model, inp, tgt, t->micro, tc->seq, dloss);
    }
    MS_TRY(gpt_take_error(t->model)); /* a tensor-parallel collective failed */
    int h_fb = mon_devtime_mark(t->dev), h_opt0 = mon_devtime_mark(t->dev);
    mon_devtime_poll(t->dev); /* after the loss read-back: the stream is idle (anchor) */
    if (t->zero) MS_TRY(par_zero_reduce_wait(t->zero));
    loss /= t->accum;
    MS_TRY(dp_mean(t, &loss));
    const ms_fault *nan_f = ms_fault_find(&t->fault, "nan-grad", step + 1, t->rank);
    if (nan_f && (attempt == 0 || nan_f->from)) { /* injected: @S the first computation only */
        poison_grads(t);
        ms_warn("step %d: injected fault nan-grad", step + 1);
    }
    r->loss = (float)loss;
    memset(&r->os, 0, sizeof r->os);
    /* no norm is computed for a step whose loss is not finite: NaN (null in
     * the metrics), not a norm of 0 that reads as a healthy zero gradient */
    if (!isfinite(r->loss)) r->os.grad_norm = NAN;
    int64_t t_opt = ms_ev_now();
    ms_status st = isfinite(r->loss) ? opt_step(t->opt, r->lr, &r->os)
                                     : ms_error(MS_ERR_NONFINITE, "non-finite loss");
    ms_ev_span(t->ev_opt, 0, t_opt, ms_ev_now(), NULL);
    t->grads_zero = st == MS_OK;
    /* with ZeRO-2 the optimiser started each shard's all-gather as it updated
     * it; the next forward waits for each where it reads it */
    if (st == MS_ERR_NONFINITE) {
        snprintf(r->why, sizeof r->why, "%s", ms_errmsg());
        if (isfinite(r->loss)) MS_TRY(nan_sources(t, r)); /* the norm: the same on every rank */
    } else if (st != MS_OK) {
        return st;
    }
    int h_opt = mon_devtime_mark(t->dev);
    mon_devtime_span(t->dev, t->ev_dev_fb, h_start, h_fb, NULL);
    mon_devtime_span(t->dev, t->ev_dev_opt, h_opt0, h_opt, NULL);
    return MS_OK;
}

/* MS_ERR_NONFINITE, naming `when`, if a weight of any rank is NaN or Inf: an update made
 * it so (a learning rate or a --beta/--eps out of scale), and no redo of a step nor skipped
 * update can mend it.  Every rank calls it (a sum over the world). */
static ms_status check_weights(trainer *t, const char *when) {
    be_backend *be = gpt_backend(t->model);
    double bad = 0; /* tensor by tensor: the padding between them is never written */
    for (int i = 0; !bad && i < gpt_num_tensors(t->model); i++) {
        const gpt_param *p = gpt_tensor(t->model, i);
        bad = be->has_nonfinite(be, gpt_params(t->model) + p->offset, p->numel);
    }
    if (t->world && comm_world_size(t->world) > 1)
        MS_TRY(comm_allreduce(comm_world_group(t->world), &bad, &bad, 1, COMM_F64, COMM_SUM));
    if (bad == 0) return MS_OK;
    char upd[64] = "before any update of this run";
    if (t->last_update > t->start)
        snprintf(upd, sizeof upd, "the update of step %d", t->last_update);
    return ms_error(MS_ERR_NONFINITE,
                    "%s: the weights hold NaN or Inf (on %.0f rank(s)), after %s: an update made "
                    "them so (the learning rate, --weight-decay, --beta1/--beta2 or --eps out of "
                    "scale?), and no redo or skipped update can mend them; no checkpoint holds "
                    "them (one of such weights is not committed)",
                    when, bad, upd);
}

/* The step's computations: the first, and while the result is not finite
 * up to --nonfinite-redo redos of the same micro-batches; when they are
 * all non-finite the update is skipped (r->skipped).  A non-finite first
 * computation whose weights are themselves not finite is an error: redos
 * and skips are for faults of one computation. */
static ms_status compute_step(trainer *t, int step, step_result *r) {
    int redo = t->tc->nonfinite_redo > 0 ? t->tc->nonfinite_redo : 0;
    r->n_nan_ranks = 0;
    memset(r->nan_ranks, 0, sizeof r->nan_ranks);
    for (int attempt = 0;; attempt++) {
        t->replay = attempt > 0;
        ms_status st = compute_update(t, step, attempt, r);
        t->replay = 0;
        MS_TRY(st);
        if (!r->why[0]) return MS_OK;
        if (attempt == 0) {
            char when[160];
            snprintf(when, sizeof when, "step %d: %s (loss %g)", step + 1, r->why, r->loss);
            MS_TRY(check_weights(t, when));
        }
        if (attempt == redo) break;
        if (t->rank == 0) /* every rank has the same result (the loss and norm are global) */
            ms_warn("step %d: %s (loss %g); redoing the step (%d of %d)", step + 1, r->why, r->loss,
                    attempt + 1, redo);
        r->redone++;
    }
    if (t->rank == 0)
        ms_warn("step %d: %s (loss %g); the update was skipped%s", step + 1, r->why, r->loss,
                redo ? " (the redos were non-finite too)" : "");
    r->skipped = 1;
    return MS_OK;
}

/* Nanoseconds blocked so far on the tp, dp and pp groups (the pipeline's
 * embedding group with pp): the exposed communication of each dimension. */
static void dim_wait_ns(const trainer *t, long long ns[3]) {
    ns[0] = t->grid ? comm_group_wait_ns(comm_grid_group(t->grid, COMM_DIM_TP)) : 0;
    ns[1] = t->grid ? comm_group_wait_ns(comm_grid_group(t->grid, COMM_DIM_DP)) : 0;
    ns[2] = t->pipe ? train_pipe_wait_ns(t->pipe) : 0;
}

/* Whether every rank stops before this step.  A signal (the driver's or a
 * scheduler's SIGTERM) reaches the ranks at different moments: one rank
 * that left the loop on its own flag would leave the others in the step's
 * collectives, and the final checkpoint would never commit.  With
 * checkpoints the agreement rides on the checkpoint hook's all-reduce at the
 * end of the step before (none before the first step: a signal during
 * set-up stops after it); without, one small all-reduce here.  Alone, the
 * process's own flag. */
static ms_status stop_agreed(trainer *t, int *stop) {
    if (!t->world || comm_world_size(t->world) == 1) { /* alone: nobody to agree with */
        *stop = ms_ctx_get()->stop != 0;
        return MS_OK;
    }
    if (t->ckpt) {
        *stop = ckpt_manager_stop_agreed(t->ckpt);
        return MS_OK;
    }
    int32_t f = ms_ctx_get()->stop != 0;
    MS_TRY(comm_allreduce(comm_world_group(t->world), &f, &f, 1, COMM_I32, COMM_MAX));
    if (f && !ms_ctx_get()->stop) ms_ctx_mut()->stop = 1; /* another rank was signalled */
    *stop = f != 0;
    return MS_OK;
}

/* One optimiser step over `accum` micro-batches, unless every rank agreed
 * to stop before it (*stop = 1: nothing done).  The agreement is timed with
 * the step: its all-reduce is where a stalled link or a late peer shows
 * first. */
static ms_status train_step(trainer *t, int step, step_result *r, int *stop) {
    ms_ev_set_step(step + 1); /* every span recorded from here on belongs to this step */
    r->t0_ns = ms_ev_now();
    double t0 = ms_now();
    /* this thread's waits: a checkpoint thread persisting meanwhile waits
     * on its own collectives, and those are not the step's communication */
    long long wait0 = comm_thread_wait_ns(), dim0[3];
    dim_wait_ns(t, dim0);
    MS_TRY(stop_agreed(t, stop));
    if (*stop) {
        ms_ev_set_step(step); /* no step happened */
        return MS_OK;
    }
    int64_t t_slow = ms_ev_now(); /* injected: a straggler's compute (trace stragglers too) */
    if (ms_fault_fire_slow(&t->fault, step + 1, t->rank))
        ms_ev_span(t->ev_slow, 0, t_slow, ms_ev_now(), NULL);
    r->data_sec = r->bubble_sec = 0;
    r->skipped = r->redone = 0;
    r->lr = opt_lr_at(&t->sched, step);
    const ms_fault *spike = ms_fault_find(&t->fault, "spike", step + 1, t->rank);
    if (spike) { /* injected: every rank, so the replicas stay equal */
        r->lr *= (float)spike->arg;
        ms_warn("step %d: injected fault spike: lr x %g = %g", step + 1, spike->arg, r->lr);
    }
    MS_TRY(compute_step(t, step, r));
    if (t->world && comm_world_broken(t->world)) {
        /* an NCCL op failed after its comm_wait returned (its group's watchdog
         * broke the world): a new op is refused with the original message */
        comm_req *req = NULL;
        ms_status st = comm_barrier_start(comm_world_group(t->world), &req);
        if (st == MS_OK) st = comm_wait(req);
        return st != MS_OK ? st : ms_error(MS_ERR_TIMEOUT, "comm: the world is broken");
    }
    r->sec = ms_now() - t0;
    r->t1_ns = ms_ev_now();
    r->comm_sec = t->zero ? par_zero_take_wait(t->zero) : 0;
    r->wait_sec = (double)(comm_thread_wait_ns() - wait0) / 1e9;
    long long dim1[3];
    dim_wait_ns(t, dim1);
    for (int d = 0; d < 3; d++)
        r->dim_sec[d] = (double)(dim1[d] - dim0[d]) / 1e9;
    mon_devtime_poll(t->dev);
    r->dev_fb_ms = mon_devtime_last_ms(t->dev, t->ev_dev_fb);
    r->dev_opt_ms = mon_devtime_last_ms(t->dev, t->ev_dev_opt);
    return MS_OK;
}

/* The step record of step `step` (0-based) from its result, to every sink. */
static ms_status report(trainer *t, int step, const step_result *r, double elapsed) {
    const train_config *tc = t->tc;
    int world = t->world ? comm_world_size(t->world) : 1;
    double tokens = (double)tc->batch * tc->seq;
    mon_step s = {.step = step + 1,
                  .steps = tc->steps,
                  .start = t->start,
                  .loss = r->loss,
                  .lr = r->lr,
                  .grad_norm = r->os.grad_norm,
                  .sec = r->sec,
                  .tok_s = tokens / r->sec,
                  .data_ms = r->data_sec * 1e3,
                  .comm_ms = r->comm_sec * 1e3,
                  .wait_ms = r->wait_sec * 1e3,
                  .bubble_ms = r->bubble_sec * 1e3,
                  .tp_ms = r->dim_sec[0] * 1e3,
                  .dp_ms = r->dim_sec[1] * 1e3,
                  .pp_ms = r->dim_sec[2] * 1e3,
                  .dev_fb_ms = r->dev_fb_ms,
                  .dev_opt_ms = r->dev_opt_ms,
                  .tokens = tokens_after(t, step + 1),
                  .wall_s = ms_wall_now(),
                  .elapsed_s = elapsed,
                  .peak_rss_bytes = mon_peak_rss_bytes(),
                  .peak_dev_bytes = t->be->mem_peak(t->be),
                  .t0_ns = r->t0_ns,
                  .t1_ns = r->t1_ns,
                  .skipped = r->skipped,
                  .redone = r->redone,
                  .n_nan_ranks = r->n_nan_ranks};
    memcpy(s.nan_ranks, r->nan_ranks, sizeof s.nan_ranks);
    s.compute_ms = s.sec * 1e3 - s.wait_ms - s.data_ms;
    if (s.compute_ms < 0) s.compute_ms = 0;
    s.mfu = mon_peak_mfu(&t->peak, t->flops_per_token * s.tok_s / world);
    return mon_record_step(t->rec, &s);
}

/* Another peak probe during warm-up (steps 2 and 3 of a long enough run on
 * a probed peak), so a busy moment at start-up does not lower it; the best
 * of the three goes into the peak cache.  A peak read from the cache with
 * its three probes is not probed again (mon_peak_reprobe). */
static void warmup_probe(trainer *t, int step) {
    if (t->tc->steps - t->start >= 50 && (step == t->start + 1 || step == t->start + 2)) {
        mon_peak_reprobe(&t->peak, t->be);
        if (step == t->start + 2) mon_peak_cache_save(&t->peak, t->be);
    }
}

/* The checkpoint hook of the step; its stall (snapshot, or a stop) as a span. */
static ms_status ckpt_hook(trainer *t) {
    if (!t->ckpt) return MS_OK;
    ckpt_train_state cs = ckpt_state(t, t->done);
    int64_t t0 = ms_ev_now();
    ms_status st = ckpt_manager_step(t->ckpt, &cs);
    int64_t t1 = ms_ev_now();
    if (t1 - t0 > 100000) ms_ev_span(t->ev_ckpt, 0, t0, t1, NULL); /* > 0.1 ms: it did work */
    return st;
}

static ms_status loop(trainer *t) {
    const train_config *tc = t->tc;
    double start = ms_now();
    int bad = 0;
    for (int step = t->start; step < tc->steps; step++) {
        /* the beat of the steps done goes out first: a fault that ends the
         * process would lose it, and the driver, lagging a step, would hand
         * this fault to the next start again (it fires once) */
        if (t->fault.n && t->hb) mon_heartbeat_flush(t->hb, 1.0);
        ms_fault_fire_process(&t->fault, step + 1, t->rank); /* injected: exit, kill, hang... */
        step_result r;
        int stop;
        MS_TRY(train_step(t, step, &r, &stop));
        if (stop) {
            ms_warn("interrupted: stopping after step %d of %d", step, tc->steps);
            t->stopped = 1;
            break;
        }
        MS_TRY(report(t, step, &r, ms_now() - start));
        warmup_probe(t, step);
        bad = r.skipped ? bad + 1 : 0;
        if (!r.skipped) t->last_update = step + 1;
        t->skip_streak = bad;
        if (bad) snprintf(t->skip_why, sizeof t->skip_why, "%s", r.why);
        if (bad > tc->max_bad_steps)
            return ms_error(MS_ERR_NONFINITE,
                            "%d consecutive steps with non-finite loss or gradients (limit "
                            "--max-bad-steps %d): stopping; the last: %s",
                            bad, tc->max_bad_steps, r.why);
        if (t->ckpt) ckpt_manager_hold(t->ckpt, bad > 0); /* no checkpoint holds a skipped step */
        int last = step + 1 == tc->steps;
        if (t->val && ((tc->val_every > 0 && (step + 1) % tc->val_every == 0) || last))
            MS_TRY(log_val(t, step + 1));
        t->done = step + 1;
        MS_TRY(ckpt_hook(t)); /* may checkpoint, or stop every rank at this step */
        if (!last) hb_release(t); /* after the last step the beat says done */
        MS_TRY(report_commits(t));
        if (t->hb && t->ckpt) { /* a checkpoint that did not commit: the driver decides */
            int last = -1, failed = 0;
            char msg[512];
            ckpt_manager_commit_status(t->ckpt, &last, &failed, msg, sizeof msg);
            mon_heartbeat_ckpt(t->hb, last, failed, msg);
            hb_ckpt_warnings(t);
        }
        if (t->evlog && t->world && tc->trace_clock_every > 0 &&
            t->done % tc->trace_clock_every == 0) /* the clocks drift: a new reference */
            MS_TRY(mon_clock_sync(t->world, CLOCK_PINGS, NULL, NULL, NULL));
    }
    return MS_OK;
}

/* --out-dir: the effective options as DIR/train.cfg, once set-up passed
 * (a run refused at start-up leaves the last run's file alone). */
static ms_status write_config(const trainer *t) {
    const train_config *tc = t->tc;
    if (!tc->out_dir || !*tc->out_dir || !tc->config_text) return MS_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/train.cfg", tc->out_dir);
    keep_previous(t, path);
    MS_TRY(ms_file_write_atomic(path, tc->config_text, strlen(tc->config_text)));
    ms_info("out-dir %s: metrics, weights, checkpoints, traces and train.log; options in %s",
            tc->out_dir, path);
    return MS_OK;
}

ms_status train_run(const train_config *tc) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.tc = tc;
    ms_status st = train_gate_pass(t.gate, setup(&t));
    if (st == MS_OK && t.rank == 0) st = write_config(&t);
    if (st == MS_OK) {
        print_layout(&t);
        if (t.start >= tc->steps && t.rank == 0) /* a finished run started again */
            ms_warn("resume: the checkpoint is at step %d and --steps is %d: nothing to train "
                    "(raise --steps to go on with this run)",
                    t.start, tc->steps);
        if (t.val) st = log_val(&t, t.start);
    }
    /* the driver times the first step from here; a set-up that failed trains nothing (its
     * beat said "train" before the error, and the driver booked the steps since the commit
     * it should have resumed from as redone: 1200 for 3 starts that found no valid one) */
    if (st == MS_OK) mon_heartbeat_train(t.hb, t.start);
    t.last_update = t.start;
    if (st == MS_OK) st = loop(&t);
    if (st == MS_OK && t.zero) st = par_zero_gather_wait_all(t.zero);
    /* the last update's weights, before the final checkpoint and --save-weights keep them:
     * no later step's loss tells of them (a run whose last update made NaN weights exited 0
     * and saved them) */
    if (st == MS_OK && t.last_update > t.start) st = check_weights(&t, "after the last step");
    /* a run that ends in skipped steps keeps the weights of its last update applied, which
     * gave a non-finite loss or gradients twice (the redo) on the last batches: said, as
     * the final checkpoint's refusal is (a transient fault on the last step of a long run
     * is no reason to lose the run; weights that are themselves NaN are, above) */
    if (st == MS_OK && t.skip_streak && t.rank == 0)
        ms_warn("the run ended in %d skipped step(s) (the last: %s; --max-bad-steps %d stops a "
                "longer streak): its weights are those of %s%d, which gave them",
                t.skip_streak, t.skip_why, tc->max_bad_steps,
                t.last_update > t.start ? "the update of step " : "this run's start, step ",
                t.last_update);
    if (st == MS_OK && t.ckpt) { /* the final checkpoint (also after SIGTERM / SIGINT) */
        ckpt_train_state cs = ckpt_state(&t, t.done);
        st = ckpt_manager_finish(t.ckpt, &cs);
        ms_status rs = report_commits(&t); /* also after a failed last persist: the earlier ones */
        if (st == MS_OK) st = rs;
        /* a clean stop short of --steps: said in DIR/stopped, so that a driver
         * that takes the job over tells it from a crash */
        if (st == MS_OK && t.stopped && t.rank == 0) ckpt_manager_mark_stopped(t.ckpt, t.done);
    }
    /* with tp, the tp group of world rank 0 gathers the shards (rank 0 writes) */
    /* with pp, all stages of that column send their tensors to world rank 0 */
    int saver = st == MS_OK && (gpt_tp_size(t.model) > 1 || t.pipe ? t.dp_rank == 0 : t.rank == 0);
    if (saver && tc->save_weights && *tc->save_weights) {
        st = t.pipe ? ckpt_hf_save_pipeline(t.model, comm_grid_group(t.grid, COMM_DIM_PP),
                                            tc->save_weights, t.save_dtype)
                    : ckpt_hf_save(t.model, tc->save_weights, t.save_dtype);
        if (st == MS_OK) ms_info("weights: saved %s", tc->save_weights);
    }
    st = train_gate_pass(t.gate, st);
    if (st == MS_OK) ms_info("peak RSS %.1f MB", mon_peak_rss_bytes() / 1e6);
    teardown(&t, st);
    return st;
}
