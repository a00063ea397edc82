/* cmd_train.c - `megascale train`: the option table and the call into the
 * trainer. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ctx.h"
#include "cli/commands.h"
#include "base/fileio.h"
#include "ckpt/hf.h"
#include "cli/opts.h"
#include "train/train.h"

/* The trainer's configuration and the --config files it was read from
 * (opts.h: OPTS_CONFIG_FILES), which no output of the run may be. */
typedef struct {
    train_config tc;
    opts_list config;
} train_cli;

/* O: any value of the type; R: a value in `range` (opts.h); OE: set by
 * the environment variable `env` too, in `range` (NULL: any).  RL, OEL:
 * the same, for an option that may differ between the ranks of a job
 * (opts_spec.per_rank: it acts on its rank alone, so the start-up check
 * that the ranks agree leaves it out; docs/user-guide.md, "Layout"). */
#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(train_cli, tc.field), def, help, NULL, NULL, 0, 0 }
#define R(name, type, field, def, range, help)                                                     \
    { name, type, offsetof(train_cli, tc.field), def, help, NULL, range, 0, 0 }
#define OE(name, type, field, def, env, range, help)                                               \
    { name, type, offsetof(train_cli, tc.field), def, help, env, range, 0, 0 }
#define RL(name, type, field, def, range, help)                                                    \
    { name, type, offsetof(train_cli, tc.field), def, help, NULL, range, 1, 0 }
#define OEL(name, type, field, def, env, range, help)                                              \
    { name, type, offsetof(train_cli, tc.field), def, help, env, range, 1, 0 }

static const opts_spec train_opts[] = {
    O("model", OPT_T_STR, model, NULL,
      "model preset: d6 d12 (124M) d24 (355M) d36 d48 (not given: d6, or the --init-from "
      "file's shape)"),
    R("layers", OPT_T_INT, layers, "0", "[0,)", "number of blocks (0: from the preset)"),
    R("dim", OPT_T_INT, dim, "0", "[0,)", "model width C (0: from the preset)"),
    R("heads", OPT_T_INT, heads, "0", "[0,)", "attention heads (0: from the preset)"),
    R("vocab", OPT_T_INT, vocab, "0", "[0,)", "vocabulary size (0: from the preset, 50257)"),
    R("seq-max", OPT_T_INT, seq_max, "0", "[0,10000000]",
      "position-embedding rows (0: from the preset, 1024)"),
    O("block", OPT_T_STR, block, NULL,
      "serial or parallel transformer block (not given: serial, or the --init-from file's)"),
    R("attn-window", OPT_T_INT, attn_window, "0", "[0,)",
      "sliding attention window W (0: full causal)"),
    O("recompute", OPT_T_STR, recompute, "none",
      "activations recomputed in backward to save memory: none, gelu, ln, gelu,ln"),
    O("device", OPT_T_STR, device, "cpu", "compute backend: cpu or cuda"),
    O("comm", OPT_T_STR, comm, "auto",
      "device buffers between ranks (cuda): nccl, mpi (staged through pinned host memory), or "
      "auto (nccl per group where its ranks have distinct GPUs, else mpi)"),
    RL("threads", OPT_T_INT, threads, "0", "[0,1024]",
       "CPU threads per rank (0: the cores / ranks on this node)"),
    OEL("cuda-profile", OPT_T_INT, cuda_profile, "0", "MS_CUDA_PROFILE", "[0,1]",
        "cuda: 1 times every op on the device and prints a table at exit"),
    OEL("cpu-profile", OPT_T_INT, cpu_profile, "0", "MS_CPU_PROFILE", "[0,1]",
        "cpu: 1 times every op and prints a table at exit (GEMMs by shape, with GFLOP/s)"),
    OE("cpu-dtype", OPT_T_STR, cpu_dtype, "fp32", "MS_CPU_DTYPE", "fp32|bf16",
       "cpu: fp32, or bf16 (activations and GEMMs in bf16 with fp32 accumulation, fp32 master "
       "weights; needs AVX512-BF16 or AMX)"),
    OE("cuda-fuse-gelu", OPT_T_INT, cuda_fuse_gelu, "1", "MS_CUDA_FUSE_GELU", "[0,1]",
       "cuda: 1 fuses bias + GeLU into the GEMM epilogue, 0 runs them as a kernel of their own"),
    R("dp", OPT_T_INT, dp, NULL, "[1,65536]",
      "data-parallel ranks (ZeRO-2); world = tp x pp x dp (not given: world / (tp x pp))"),
    R("tp", OPT_T_INT, tp, "1", "[1,65536]",
      "tensor-parallel ranks (Megatron + sequence parallel; divides heads and micro-batch*seq)"),
    R("pp", OPT_T_INT, pp, "1", "[1,65536]",
      "pipeline stages (1F1B; layers divide by pp x vpp; wte tied over first and last stage)"),
    R("vpp", OPT_T_INT, vpp, "1", "[1,65536]",
      "model chunks per pipeline stage (> 1: interleaved 1F1B, micro-batches a multiple of pp)"),
    O("overlap", OPT_T_STR, overlap, "all",
      "communication hidden behind compute: all, none, or a list of dp (ZeRO buckets), tp "
      "(chunked GEMMs), pp (decoupled sends and receives, the tied-embedding sum in the "
      "cool-down); "
      "the same bits either way"),
    O("train-data", OPT_T_STR, train_data, NULL, "glob of training token shards (llm.c format)"),
    O("val-data", OPT_T_STR, val_data, NULL, "glob of validation token shards"),
    O("data-order", OPT_T_STR, data_order, "shuffle", "shuffle or sequential (llm.c's order)"),
    R("batch", OPT_T_INT, batch, "8", "[1,16777216]",
      "sequences per optimiser step (all ranks together)"),
    R("micro-batch", OPT_T_INT, micro_batch, "0", "[0,16777216]",
      "sequences per forward/backward on one rank (0: --batch / --dp)"),
    R("seq", OPT_T_INT, seq, "256", "[1,)", "tokens per sequence T"),
    R("steps", OPT_T_INT, steps, "100", "[1,)", "optimiser steps"),
    O("optimizer", OPT_T_STR, optimizer, "adamw", "adamw or lamb"),
    R("lr", OPT_T_DOUBLE, lr, "6e-4", "(0,)", "peak learning rate"),
    O("lr-schedule", OPT_T_STR, lr_schedule, "cosine", "constant or cosine"),
    R("warmup", OPT_T_INT, warmup, "0", "[0,)", "linear warmup steps"),
    R("lr-floor", OPT_T_DOUBLE, lr_floor, "0.1", "[0,1]", "cosine floor as a fraction of --lr"),
    R("weight-decay", OPT_T_DOUBLE, weight_decay, "0.1", "[0,)",
      "decoupled weight decay (2-D tensors only)"),
    R("beta1", OPT_T_DOUBLE, beta1, "0.9", "[0,1)", "first-moment decay"),
    R("beta2", OPT_T_DOUBLE, beta2, "0.95", "[0,1)", "second-moment decay"),
    R("eps", OPT_T_DOUBLE, eps, "1e-8", "(0,)", "optimiser epsilon"),
    R("grad-clip", OPT_T_DOUBLE, grad_clip, "1.0", "[0,)",
      "clip the global grad norm to X (0: off)"),
    R("max-bad-steps", OPT_T_INT, max_bad_steps, "3", "[0,)",
      "consecutive non-finite steps tolerated (skipped) before the run stops"),
    OE("nonfinite-redo", OPT_T_INT, nonfinite_redo, "1", "MS_NONFINITE_REDO", "[0,)",
       "recomputations of a step whose loss or gradients are NaN/Inf, from the same "
       "micro-batches, before its update is skipped (0: skip at once)"),
    R("seed", OPT_T_U64, seed, "1337", "[0,)", "seed for initialisation and data order"),
    O("init-from", OPT_T_STR, init_from, NULL,
      "initial weights: HF GPT-2 safetensors, or an llm.c model file (.bin)"),
    O("save-weights", OPT_T_STR, save_weights, NULL,
      "write final weights (HF GPT-2 safetensors, and transformers' config.json beside them)"),
    O("save-dtype", OPT_T_STR, save_dtype, "f32", "--save-weights' dtype: f32 or bf16"),
    O("metrics", OPT_T_STR, metrics, NULL, "JSONL file: one object per step"),
    O("out-dir", OPT_T_STR, out_dir, NULL,
      "one directory for the run's outputs, created at start-up: metrics.jsonl, "
      "model.safetensors, ckpt/, trace/, train.log and train.cfg (the effective options, a "
      "--config file); an option naming one of them itself wins"),
    O("log-file", OPT_T_STR, log_file, NULL,
      "append every line the ranks print here too, each after its UTC time (default with "
      "--out-dir: DIR/train.log)"),
    O("ckpt-dir", OPT_T_STR, ckpt_dir, NULL, "checkpoint directory (DIR/step_N, DIR/latest)"),
    R("ckpt-every", OPT_T_INT, ckpt_every, "0", "[0,)",
      "a checkpoint every N steps (0: only at the end)"),
    R("ckpt-every-min", OPT_T_DOUBLE, ckpt_every_min, "0", "[0,)",
      "a checkpoint every M minutes (0: off)"),
    R("ckpt-keep", OPT_T_INT, ckpt_keep, "3", "[1,)", "committed checkpoints kept (the newest K)"),
    O("resume", OPT_T_STR, resume, NULL,
      "auto (newest valid in --ckpt-dir or --ckpt-shm-dir) or a checkpoint path"),
    OPTS_FLAG("new-run", train_cli, tc.new_run,
              "1 (or a bare --new-run): start afresh in a --ckpt-dir that holds another run's "
              "commits, moving them to "
              "DIR/previous-<date>/ (without it, or --resume auto, such a start is refused)"),
    O("restart-job", OPT_T_STR, restart_job, NULL,
      "set by megascale launch on a restart before the job's first commit: the job id its "
      "first start wrote to --ckpt-dir's job file (16 hex digits); the job's own newest state "
      "is resumed, else --resume's PATH, and --new-run's or a rollback's set-up is not redone"),
    OE("ckpt-shm-dir", OPT_T_STR, ckpt_shm_dir, "/dev/shm", "MS_CKPT_SHM_DIR", NULL,
       "directory of the host-memory snapshots (stage 1 of each checkpoint)"),
    R("val-every", OPT_T_INT, val_every, "100", "[0,)",
      "steps between validation passes (0: end only)"),
    R("val-batches", OPT_T_INT, val_batches, "10", "[1,)", "batches per validation pass"),
    RL("peak-flops", OPT_T_DOUBLE, peak_flops, "0", "[0,)",
       "device peak FLOP/s for MFU (0: probe)"),
    RL("peak-cache", OPT_T_STR, peak_cache, NULL, NULL,
       "directory of the peak cache: a probed peak is kept in DIR/peak-HOST.json, and a later "
       "start on this host with the same backend, dtype, threads and binary reads it instead of "
       "probing (megascale launch: its --run-dir; not given or none: off)"),
    RL("log-every", OPT_T_INT, log_every, "1", "[0,)", "steps between progress lines"),
    O("trace-dir", OPT_T_STR, trace_dir, NULL,
      "per-rank event logs and hang dumps (default: DIR/trace next to --metrics; none: off)"),
    R("trace-clock-every", OPT_T_INT, trace_clock_every, "200", "[0,)",
      "steps between clock references for the merged timeline (0: only at start)"),
    R("trace-max-mb", OPT_T_DOUBLE, trace_max_mb, "1024", "[0,)",
      "bound of each rank's event log on disk in MB (fractions allowed): past half of it the "
      "log rotates to events_rNNNNN.jsonl.1 (0: unbounded)"),
    OEL("heartbeat", OPT_T_STR, heartbeat, NULL, "MS_HEARTBEAT", NULL,
        "send heartbeats to the supervisor at HOST:PORT (set by megascale launch)"),
    OEL("heartbeat-token", OPT_T_STR, heartbeat_token, NULL, "MS_HEARTBEAT_TOKEN", NULL,
        "the job's heartbeat token (set by megascale launch; a secret: the metrics say only "
        "that it is set, train.cfg leaves it out)"),
    OEL("heartbeat-attempt", OPT_T_INT, heartbeat_attempt, "0", "MS_HEARTBEAT_ATTEMPT",
        "[0,2147483647]",
        "the attempt of the job these beats belong to (set by megascale launch: the driver "
        "ignores a rank of an earlier attempt; 0: not sent)"),
    OEL("node-map", OPT_T_STR, node_map, NULL, "MS_NODE_MAP", NULL,
        "node names NAME,NAME,... ([A-Za-z0-9._-], up to 4096): world rank r is on node "
        "names[r * n / world] (default: the host name); for :node=NAME faults and the heartbeats"),
    OEL("comm-timeout", OPT_T_DOUBLE, comm_timeout, "300", "MS_COMM_TIMEOUT", "(0,1e6]",
        "seconds a collective may take before it fails, naming the missing ranks (hang dumps)"),
    OEL("comm-nccl-sync", OPT_T_INT, comm_nccl_sync, "0", "MS_COMM_NCCL_SYNC", "[0,1]",
        "1: a wait on an NCCL op blocks the host, so the failing wait reports a missed deadline"),
    O("inject-fault", OPT_T_STR, inject_fault, NULL,
      "faults for tests and chaos runs (docs/operations.md): "
      "KIND[=ARG][@STEP[+]][:RANK | :node=NAME],... with KIND exit, kill, stop, hang, term, "
      "slow=MS, "
      "nan-grad, spike=X or a checkpoint point; random=SEED/N/MAXSTEP/WORLD"),
    OE("ckpt-fault", OPT_T_STR, ckpt_fault, NULL, "MS_CKPT_FAULT", NULL,
       "more faults, same syntax as --inject-fault (the checkpoint's points, for tests)"),
    OPTS_CONFIG_FILES(train_cli, config),
};
#define N_TRAIN_OPTS ((int)(sizeof train_opts / sizeof train_opts[0]))

/* --out-dir DIR: the outputs it implies, for the options left unset. */
static ms_status apply_out_dir(train_config *tc) {
    const char *dir = tc->out_dir;
    if (!dir || !*dir) return MS_OK;
    struct {
        char **field;
        const char *name;
    } outs[] = {{&tc->metrics, "metrics.jsonl"}, {&tc->save_weights, "model.safetensors"},
                {&tc->ckpt_dir, "ckpt"},         {&tc->trace_dir, "trace"},
                {&tc->log_file, "train.log"}};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        if (*outs[i].field && **outs[i].field) continue;
        size_t n = strlen(dir) + strlen(outs[i].name) + 2;
        char *p = malloc(n);
        if (!p) return ms_error(MS_ERR_NOMEM, "--out-dir: out of memory");
        snprintf(p, n, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", outs[i].name);
        free(*outs[i].field);
        *outs[i].field = p;
    }
    return MS_OK;
}

/* Every output of the run, and the launch's events file (events_opt:
 * its option, in words; events NULL: none), against the --config files
 * read: a run would write over the options it was started with (its log
 * appended to them, its metrics or weights written over them), and a
 * restart would read that back.  --out-dir's train.cfg is not one: it is
 * those options, rewritten atomically once set-up passed (`--config
 * DIR/train.cfg --resume auto` continues a run; docs/user-guide.md). */
static ms_status check_not_config(const train_cli *c, const char *events_opt, const char *events,
                                  const char *run_dir, const char *const *run_files) {
    static const char *const trace_files[] = {"events_r*.jsonl", "events_r*.jsonl.1",
                                              "hang_r*.json", NULL};
    static const char *const peak_files[] = {"peak-*.json", NULL};
    const train_config *tc = &c->tc;
    char trace[4096], hf[4200] = "";
    train_trace_dir(tc, trace, sizeof trace);
    if (tc->save_weights && *tc->save_weights) ckpt_hf_config_path(tc->save_weights, hf, sizeof hf);
    const struct {
        const char *opt, *path;
        const char *const *names;
    } out[] = {
        {"--save-weights", tc->save_weights, NULL},
        {"--save-weights' config.json", hf, NULL},
        {"--metrics", tc->metrics, NULL},
        {"--log-file", tc->log_file, NULL},
        {"--trace-dir", trace, trace_files},
        {"--peak-cache", tc->peak_cache, peak_files},
        {events_opt, events, NULL},
    };
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
        MS_TRY(
            opts_check_output(train_opts, N_TRAIN_OPTS, c, out[i].opt, out[i].path, out[i].names));
    /* the launch's events file is no output of the run either (even one not written yet):
     * --events w.safetensors beside --save-weights w.safetensors lost every event when the
     * weights were renamed over them, and the next launch appended JSON to the weights */
    char match[64];
    for (size_t i = 0; events && *events && i + 1 < sizeof out / sizeof out[0]; i++) {
        if (!out[i].path || !*out[i].path) continue;
        if (out[i].names &&
            ms_path_named_in_dir(events, out[i].path, out[i].names, match, sizeof match))
            return ms_error(MS_ERR_ARG,
                            "%s %s is named as the %s files the run writes in %s %s: the events "
                            "would be lost or the files corrupted; nothing was written",
                            events_opt, events, match, out[i].opt, out[i].path);
        if (!out[i].names && ms_path_same(events, out[i].path))
            return ms_error(MS_ERR_ARG,
                            "%s %s is %s %s, which the run writes: the events would be lost or "
                            "the file corrupted; nothing was written",
                            events_opt, events, out[i].opt, out[i].path);
    }
    /* nor is a file the launch's driver writes in its --run-dir: --save-weights RUN_DIR/
     * driver.json was saved, then the driver's state written over the weights */
    for (size_t i = 0; run_dir && *run_dir && i + 1 < sizeof out / sizeof out[0]; i++)
        if (out[i].path && *out[i].path && !out[i].names &&
            ms_path_named_in_dir(out[i].path, run_dir, run_files, match, sizeof match) &&
            /* the driver writes RUN_DIR/metrics.jsonl only when the run has no --metrics */
            !(!strcmp(match, "metrics.jsonl") && tc->metrics && *tc->metrics))
            return ms_error(MS_ERR_ARG,
                            "%s %s is named as %s, a file the launch's driver writes in --run-dir "
                            "%s: one would be lost to the other; nothing was written",
                            out[i].opt, out[i].path, match, run_dir);
    return MS_OK;
}

/* Left out of train.cfg: set by `megascale launch` for one job (its
 * driver's address and token), or a test's faults. */
static const char *const not_in_cfg[] = {
    "heartbeat",    "heartbeat-token", "heartbeat-attempt", "node-map",
    "inject-fault", "ckpt-fault",      "restart-job",       NULL};
/* Written as "(secret)" in the metrics' first line (a file others may
 * read): the token lets whoever holds it send the job's driver beats. */
static const char *const secrets[] = {"heartbeat-token", NULL};

int cmd_train_has_option(const char *name, size_t len) {
    for (int i = 0; i < N_TRAIN_OPTS; i++)
        if (strlen(train_opts[i].name) == len && !strncmp(train_opts[i].name, name, len)) return 1;
    return 0;
}

int cmd_train_check(int argc, char **argv, const char *events_opt, const char *events,
                    const char *run_dir, const char *const *run_files, cli_train_view *v) {
    train_cli c = {0};
    train_config *tc = &c.tc;
    char *pos[1];
    int npos, help, rc = 0;
    memset(v, 0, sizeof *v);
    ms_status st = opts_parse(train_opts, N_TRAIN_OPTS, &c, argc, argv, pos, 0, &npos, &help);
    if (st == MS_OK) st = apply_out_dir(tc);
    if (st == MS_OK) st = train_check_outputs(tc);
    if (st == MS_OK) st = train_check_hparams(tc);
    if (st == MS_OK) st = train_check_not_input(tc, events_opt, events);
    if (st == MS_OK) st = check_not_config(&c, events_opt, events, run_dir, run_files);
    if (st != MS_OK) {
        fprintf(stderr, "megascale launch: error: the train options: %s\n", ms_errmsg());
        rc = 2; /* usage, whatever the parser's class: the job never starts */
    } else if (help) {
        fprintf(stderr, "megascale launch: error: --help among the train options: see "
                        "`megascale train --help`\n");
        rc = 2;
    } else {
        snprintf(v->ckpt_dir, sizeof v->ckpt_dir, "%s", tc->ckpt_dir ? tc->ckpt_dir : "");
        snprintf(v->resume, sizeof v->resume, "%s", tc->resume ? tc->resume : "");
        snprintf(v->metrics, sizeof v->metrics, "%s", tc->metrics ? tc->metrics : "");
        snprintf(v->trace_dir, sizeof v->trace_dir, "%s", tc->trace_dir ? tc->trace_dir : "");
        snprintf(v->device, sizeof v->device, "%s", tc->device ? tc->device : "");
        v->steps = tc->steps;
        v->ckpt_every = tc->ckpt_every;
        v->ckpt_every_min = tc->ckpt_every_min;
        v->new_run = tc->new_run;
        v->peak_cache_given = tc->peak_cache != NULL;
        if ((!tc->model || !*tc->model) && !(tc->init_from && *tc->init_from)) {
            free(tc->model); /* the default preset, as the run has it (cmd_train) */
            tc->model = strdup("d6");
        }
        v->effective = opts_to_json_shared(train_opts, N_TRAIN_OPTS, &c);
    }
    opts_free(train_opts, N_TRAIN_OPTS, &c);
    return rc;
}

int cmd_train(int argc, char **argv) {
    train_cli c = {0};
    train_config *tc = &c.tc;
    char *pos[1];
    int npos, help, rc = 0;
    ms_status st = opts_parse(train_opts, N_TRAIN_OPTS, &c, argc, argv, pos, 0, &npos, &help);
    if (help) {
        opts_print_help(train_opts, N_TRAIN_OPTS,
                        "usage: megascale train --train-data 'DIR/train_*.bin' [options]");
    } else if (st != MS_OK) {
        rc = cli_fail("train", train_gate_early("train", st));
    } else {
        ms_ctx_catch_signals();
        st = apply_out_dir(tc);
        if (st == MS_OK)
            st = train_gate_early("train", check_not_config(&c, NULL, NULL, NULL, NULL));
        if (st == MS_OK && (!tc->model || !*tc->model) && !(tc->init_from && *tc->init_from)) {
            free(tc->model); /* the default preset, said in the metrics and train.cfg */
            tc->model = strdup("d6");
            if (!tc->model) st = ms_error(MS_ERR_NOMEM, "out of memory");
        }
        tc->config_json = opts_to_json(train_opts, N_TRAIN_OPTS, &c, secrets);
        tc->shared_json = opts_to_json_shared(train_opts, N_TRAIN_OPTS, &c);
        tc->config_text = opts_to_config(
            train_opts, N_TRAIN_OPTS, &c, not_in_cfg,
            "# megascale train: the effective options of this run (megascale train --config "
            "FILE runs it again)\n");
        if (st == MS_OK)
            st = tc->config_json && tc->shared_json && tc->config_text
                     ? train_run(tc)
                     : ms_error(MS_ERR_NOMEM, "train: out of memory");
        free(tc->config_json);
        free(tc->shared_json);
        free(tc->config_text);
        if (st != MS_OK) rc = cli_fail("train", st);
    }
    opts_free(train_opts, N_TRAIN_OPTS, &c);
    return rc;
}
