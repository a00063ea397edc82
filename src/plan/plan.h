/* plan.h - the scale planner (`megascale plan`): predicts the step time,
 * MFU and memory per GPU of a GPT model on a cluster with a given 3D
 * layout, without running it, and ranks the layouts that fit.
 *
 * The model (docs/planning.md says what it covers and what not):
 *  - compute from per-operation FLOPs at a GEMM efficiency that depends on
 *    the product's shape (a curve from the cluster file), attention at a
 *    fused-kernel efficiency or by the bytes of its score matrix, element-
 *    wise operators and the optimizer by the bytes they move (a roofline);
 *  - collectives by ring (and tree, for all-reduce) cost models per link
 *    class: inside a node or between nodes, each with bandwidth, latency and
 *    efficiency;
 *  - the pipeline from the trainer's own schedules (parallel/schedule.h),
 *    simulated with the per-stage costs and the p2p transfer time;
 *  - overlap by the trainer's rules (ZeRO buckets reduce-scattered while the
 *    backward goes on, all-gathers waited layer by layer; non-blocking
 *    pipeline transfers; MegaScale's chunked TP overlap);
 *  - memory: what the trainer allocates on the busiest stage, buffer by
 *    buffer (weights, gradients, the ZeRO shard of the optimizer state, the
 *    activation sets its schedule holds, the backward's scratch, pipeline
 *    and ZeRO buffers, the backend's op scratch).
 * Also the scale-out costs: group initialisation, checkpoint stall and
 * restore, and the effective training time ratio (Young/Daly).
 *
 * Who calls it: cli/cmd_plan.c and the tests.  No device is needed.
 * Memory: results are values; plan_result_json returns malloc'd text, a
 * search fills a caller's array.  Thread-safety: pure functions (errors go
 * to the thread-local ms_error).
 */
#ifndef PLAN_PLAN_H
#define PLAN_PLAN_H

#include <stdio.h>

#include "base/status.h"

/* ---- inputs ---------------------------------------------------------- */

typedef struct {
    int layers, dim, heads, vocab, seq;
    int seq_max;        /* the position table's rows (the trainer's --seq-max; 0: seq) */
    int parallel_block; /* 1: y = x + Attn(LN(x)) + MLP(LN(x)) (one LN, one AG/RS per layer) */
    int window;         /* sliding attention window (0: full causal) */
} plan_model;

/* Activation recomputation: Megatron-LM's (selective: no score matrix kept; full: each block's
 * input only, the block rebuilt in the backward), which the trainer does not run, and the
 * trainer's own (--recompute gelu, ln, gelu,ln: model/gpt.h's GPT_RECOMPUTE_* flags). */
typedef enum {
    PLAN_RECOMPUTE_NONE = 0,
    PLAN_RECOMPUTE_SELECTIVE,
    PLAN_RECOMPUTE_FULL,
    PLAN_RECOMPUTE_GELU,   /* the GeLU outputs (N, 4C/t) of every block: one GeLU again a block */
    PLAN_RECOMPUTE_LN,     /* the LayerNorm outputs (N, C), 1-2 a block (the trainer: tp 1 only) */
    PLAN_RECOMPUTE_GELU_LN /* both */
} plan_recompute;

/* The trainer's GPT_RECOMPUTE_* flags (model/gpt.h) of a mode: 0 for none and Megatron-LM's. */
int plan_recompute_flags(plan_recompute rc);
/* The mode of the trainer's flags (gpt_recompute_parse's result). */
plan_recompute plan_recompute_of_flags(int flags);

typedef struct {
    int tp_overlap; /* TP all-gather / reduce-scatter chunked under the FFN GEMMs */
    int pp_overlap; /* pipeline sends and receives posted early, waited late */
    int dp_overlap; /* ZeRO reduce-scatter in backward, all-gather prefetched in forward */
    int fused;      /* FlashAttention-2 (else -1), one-kernel LayerNorm and GeLU, fused
                     * cross entropy */
    int async_data; /* data loaded ahead by a loader per node (not on the step) */
    int lamb;       /* optimizer LAMB (else AdamW) */
    /* ZeRO all-gathers the updated fp32 master weights (this trainer, parallel/zero.c), each
     * bucket started as the optimizer finishes this rank's shard of it, and the forward
     * converts them to the 16-bit copy as it reaches each bucket; else the 16-bit parameters
     * (Megatron-LM's and MegaScale's distributed optimizers), started with the forward */
    int fp32_gather;
    plan_recompute recompute;
    /* this trainer's pipeline (--features ours): each message of a step has its own MPI tag,
     * 1 + 2 x pp x vpp x micro-batches of them, at most the 32767 MPI guarantees */
    int pipe_tags;
    int peak_probe; /* the trainer probes the peak (no --peak-flops, not a GPU of its table):
                     * three GEMM matrices on top of everything else it holds */
} plan_features;

typedef struct {
    int gpus;         /* world size */
    int tp, pp, vpp;  /* dp = gpus / (tp * pp) */
    int batch, micro; /* sequences per step (global) and per micro-batch */
} plan_layout;

/* A link class: bandwidth per GPU in one direction (GB/s = 1e9 B/s), the
 * latency of one step of a collective, and the fraction of the bandwidth a
 * collective reaches. */
typedef struct {
    double gbps, lat_us, eff;
} plan_link;

#define PLAN_GEMM_POINTS 16
#define PLAN_NAME_MAX 64

/* A cluster file (docs/formats.md, "Cluster files"). */
typedef struct {
    char name[PLAN_NAME_MAX];
    char source[512];   /* where its numbers come from (free text) */
    int gpus_per_node;  /* ranks per node (a CPU machine: the ranks it runs) */
    double peak_flops;  /* per GPU, the dtype trained in (the MFU denominator) */
    double mem_gb;      /* device memory per GPU */
    double reserved_gb; /* of it, taken by the runtime, workspaces, fragmentation */
    double hbm_gbps, hbm_eff;
    double opt_ns_per_param; /* measured AdamW time per parameter (0: by its bytes) */
    double transc_gbps;      /* element-wise operators with a transcendental function per element
                              * (GeLU's tanh, softmax's exp): bytes per second (0: hbm's) */
    double ln_bwd_passes;    /* the fused LayerNorm backward, in passes of its forward's cost
                              * (0: LN_PASSES_BWD's 2) */
    double attn_eff;         /* fused attention FLOP/s as a fraction of peak */
    double launch_us;        /* fixed cost of one operator (kernel launch, dispatch) */
    int n_gemm;              /* the GEMM curve: efficiency (fraction of peak) at size n */
    double gemm_n[PLAN_GEMM_POINTS], gemm_eff[PLAN_GEMM_POINTS];
    plan_link intra, inter;       /* inside a node; between nodes */
    double act_bytes, grad_bytes; /* bytes per activation / per reduced gradient element */
    double cores;        /* CPU machines: cores per node shared by the ranks (0: a GPU each) */
    double threads;      /* CPU machines: threads per rank the measurement used */
    double data_ms;      /* host time to load one micro-batch when it is on the step */
    double step_ms;      /* fixed host time per step (launching, clipping, logging) */
    double pcie_gbps;    /* device to host copy, per GPU (checkpoint stage 1) */
    double storage_gbps; /* persistent storage, per node, read and write */
    double store_op_us;  /* one operation of the rendezvous store (group init barriers) */
    double comm_init_ms; /* creating one communicator on a rank */
    /* the fraction of an overlapped transfer's time that compute does not hide: 0 where
     * DMA engines or NICs move the bytes (GPUs), near 1 where the cores copy them or the
     * transfer moves only while its rank waits (a CPU machine's shared memory) */
    double overlap_exposed;
} plan_cluster;

/* ---- cluster files (plan_cluster.c) ------------------------------------ */

/* Read and validate a cluster file.  Errors name the file and the key:
 * MS_ERR_IO (unreadable), MS_ERR_FORMAT (not JSON, wrong "format" or
 * "version", a missing or unknown key, a value out of range, "reserved_gb"
 * not below "mem_gb", "act_bytes" other than 2 or 4). */
ms_status plan_cluster_load(const char *path, plan_cluster *c);
/* FILE, or NAME: DIR/NAME.json (dir: the shipped data/clusters). */
ms_status plan_cluster_find(const char *name_or_file, const char *dir, plan_cluster *c);
/* Check ranges (the same rules as the loader); MS_ERR_FORMAT naming `what`. */
ms_status plan_cluster_check(const plan_cluster *c, const char *what);
/* Write c as a cluster file, atomically.  MS_ERR_IO naming the file. */
ms_status plan_cluster_save(const plan_cluster *c, const char *path);

/* ---- cost models (plan_cost.c) ------------------------------------------ */

/* Efficiency of an (M x K) * (K x N) product: the curve (measured on
 * square products) at n = cbrt(M N K), log-linear between points. */
double plan_gemm_eff(const plan_cluster *c, double M, double N, double K);
/* Seconds of that product plus one launch: 2 M N K flops at that
 * efficiency, or, when slower (a thin product), its three matrices through
 * memory at the same efficiency of the memory bandwidth (a roofline). */
double plan_gemm_s(const plan_cluster *c, double M, double N, double K);
/* Seconds for an element-wise operator moving `bytes` through memory. */
double plan_bytes_s(const plan_cluster *c, double bytes);

typedef enum { PLAN_ALLREDUCE, PLAN_REDUCE_SCATTER, PLAN_ALLGATHER, PLAN_P2P } plan_coll;
/* Seconds of a collective over `ranks` ranks of `bytes` (the whole buffer:
 * the all-reduced one, the gathered output, the scattered input; for P2P
 * the message) on link l: ring (n-1 steps, (n-1)/n of the buffer per rank;
 * all-reduce twice that), or for all-reduce a double binary tree
 * (2 log2 n steps, 2 buffers) when faster.  0 for one rank. */
double plan_coll_s(const plan_link *l, plan_coll kind, int ranks, double bytes);
/* The link of the groups of `ranks` ranks whose members are `stride` ranks
 * apart in a world of `world` ranks (TP 1, DP tp, PP tp*dp; the groups of a
 * dimension tile the world in blocks of ranks x stride): inside a node when
 * every group is in one (the world fits in a node, or a block does and the
 * node size is a multiple of it), else between nodes: a group that
 * straddles two nodes runs at that speed, and the step waits for it (dp 3
 * on nodes of 8: the group of ranks 6, 7, 8; pp 4 x tp 4 on nodes of 8: the
 * hop from rank 7's stage to rank 8's). */
const plan_link *plan_link_of(const plan_cluster *c, int ranks, int stride, int world);

/* ---- the step (plan_step.c) --------------------------------------------- */

typedef struct {
    /* the step, seconds on the slowest stage */
    double iter_s;
    double compute_s; /* forward + backward compute of this stage's micro-batches */
    double tp_s;      /* exposed tensor-parallel communication */
    double pp_s;      /* exposed pipeline transfers */
    double dp_s;      /* exposed data-parallel (ZeRO) communication (and dp_convert_s) */
    double bubble_s;  /* pipeline idle time */
    double optimizer_s;
    double data_s; /* data loading and fixed host time on the step */
    /* of dp_s: the ZeRO all-gather of the updated weights, exposed; what its transfers take,
     * hidden or not; the weights it assembles on a rank a step (GB) and their bytes an
     * element (4: fp32, or act_bytes); and with fp32 gathers of 16-bit activations the
     * conversion of the gathered weights to the 16-bit copy, on the forward's path */
    double dp_gather_s, dp_gather_comm_s, dp_gather_gb, dp_gather_elem_bytes, dp_convert_s;
    /* derived */
    double mfu; /* Megatron's FLOPs (72 l h^2 (1 + s/6h + V/16lh) per token) / peak */
    /* the same with the attention a sliding window computes (s -> min(s, w)
     * in the formula): mfu counts full attention, as the papers do, so with
     * a window much shorter than the sequence it can pass 100% */
    double mfu_window;
    double tokens_per_s;
    double model_flops_per_token;
    double memory_gb; /* per GPU, the busiest stage */
    double mem_params_gb, mem_grads_gb, mem_optim_gb, mem_act_gb, mem_reserved_gb;
    int fits; /* memory_gb <= the cluster's mem_gb */
    /* the layout as resolved */
    int dp, n_micro, in_flight;
    double bubble_fraction; /* bubble_s / (compute and exposed comm of the stage) */
} plan_result;

/* The most (micro-batch, chunk) pairs of a pipeline the step simulates (pp x vpp x the
 * micro-batches of a step): the simulation takes time and memory in proportion to them
 * (about 1 s and 130 MB at this limit). */
#define PLAN_MAX_PIPE_PAIRS (1 << 19)
/* The message tags of one step this trainer's pipeline may use: the smallest MPI_TAG_UB MPI
 * guarantees (train_pipe_plan). */
#define PLAN_PIPE_TAGS 32767

/* The features against the layout: MS_ERR_ARG for --recompute ln with tp > 1 (the trainer
 * refuses it: the LayerNorm outputs are all-gathered over tp), naming both; with pipe_tags, a
 * pipeline whose step needs more message tags than MPI guarantees (the trainer refuses it).
 * l must have passed plan_check. */
ms_status plan_check_features(const plan_features *f, const plan_layout *l);
/* Check the inputs: MS_ERR_ARG naming the option (--tp 3 does not divide
 * --heads 16, --gpus 100 is not a multiple of --tp x --pp, --batch not a
 * multiple of dp x --micro-batch, layers not divisible by pp x vpp, an
 * interleaved schedule whose micro-batch count is not a multiple of pp, a
 * pipeline of more than PLAN_MAX_PIPE_PAIRS pairs: too many micro-batches,
 * naming --batch, dp and --micro-batch).  The layout against the cluster
 * (--tp more than a node's GPUs) is plan_predict's check. */
ms_status plan_check(const plan_model *m, const plan_layout *l);
/* 1 if plan_check refuses l only for PLAN_MAX_PIPE_PAIRS: a valid pipeline layout whose step
 * has more (micro-batch, chunk) pairs than the planner simulates; else 0. */
int plan_over_cap(const plan_model *m, const plan_layout *l);
/* The position table's rows: seq_max, or seq where it is 0. */
int plan_seq_max(const plan_model *m);
/* Predict one configuration: plan_check, plan_check_features, the cluster's ranges, and tensor
 * parallelism inside a node (MS_ERR_ARG naming --tp and the node's GPUs: the
 * trainer places a tp group on one host). */
ms_status plan_predict(const plan_model *m, const plan_layout *l, const plan_features *f,
                       const plan_cluster *c, plan_result *r);
/* Megatron's model FLOPs per token (the MFU convention). */
double plan_megatron_flops_per_token(const plan_model *m);
/* The same, the attention term counted over the keys a query of a sliding
 * window attends (min(s, w) for s); without a window, the same value. */
double plan_window_flops_per_token(const plan_model *m);
/* The model's own counts (model/gpt.h: gpt_config_num_params and
 * gpt_flops_per_token, 6N + 12 L T_eff C, what the trainer's MFU uses):
 * parameters of one layer and of the rest (wte, wpe up to seq-max, ln_f). */
void plan_params(const plan_model *m, double *layer, double *embed);
double plan_flops_per_token_6n(const plan_model *m);

/* Activation bytes the trainer saves for one block and one micro-batch of
 * `micro` sequences on a rank of tp (gpt_model.c push_layer): the residual
 * input (and mid-block residual) and LayerNorm statistics over N/tp rows
 * (sequence parallelism), the LayerNorm outputs all-gathered (N rows),
 * q k v, the attention output, the MLP's pre-activation and GeLU over C/tp
 * or 4C/tp columns, each at act_bytes, and the attention's state: its
 * (B, heads/tp, T, T) fp32 softmax output where the backend keeps it
 * (flash 0, the CPU backend), else its (B, heads/tp, T) log-sum-exp (a
 * flash kernel, or selective recomputation).  Full recomputation keeps the
 * block's input only; the trainer's gelu and ln keep no GeLU or LayerNorm outputs (the shared
 * buffer the backward recomputes them into is the arena's, once: plan_memory). */
double plan_layer_act_bytes(const plan_model *m, int tp, int micro, plan_recompute rc, int flash,
                            double act_bytes);
/* The memory parts of r (params, grads, optimizer, activations, and
 * in_flight: the busiest stage's activation sets) for the stage that holds
 * the most (plan_memory.c): what the trainer allocates there, buffer by
 * buffer: fp32 master weights (plus their 16-bit copy), fp32 gradients,
 * the ZeRO shard of m and v; the activation arena (the blocks of as many
 * (micro-batch, chunk) sets as the stage's schedule holds at once, the
 * output stage, one copy of the backward's scratch), the pipeline's send
 * buffers and tied-embedding copy, ZeRO's exchange buffers, the
 * backend's op scratch and, with f->peak_probe, the peak probe's three GEMM
 * matrices.  Never fails (MS_OK). */
ms_status plan_memory(const plan_model *m, const plan_layout *l, const plan_features *f,
                      const plan_cluster *c, plan_result *r);
/* Activation sets of pipeline stage s (pp >= 2; vpp > 1: interleaved, with n_micro a multiple
 * of pp): the most (micro-batch, chunk) pairs the stage's schedule holds at once, the larger
 * of its two communication modes (the trainer's train_pipe_plan and par_schedule_slots), in
 * closed form: the warm-up's forwards and the steady phase's first (w + 1,
 * par_schedule_warmup), plus with decoupled communication the receive posted one compute
 * ahead into a set of its own on every stage that receives activations (all but stage 0 of
 * 1F1B); at most the stage's n_micro x vpp pairs.  (The blocking mode posts a receive at the
 * boundary after the BWD that frees a set: w + 1.)  tests/plan/test_plan_pipe.c checks it
 * against par_schedule_slots. */
int plan_stage_sets(int pp, int vpp, int n_micro, int s);

/* ---- search (plan_search.c) ---------------------------------------------- */

typedef struct {
    plan_layout layout;
    plan_result result;
} plan_candidate;

/* What one search saw: the layouts it ranked, evaluated, found fitting, left over the
 * simulation's cap, and refused for a reason other than the batch (the first one's message:
 * what to say when none was valid). */
typedef struct {
    int n;        /* ranked into out */
    int tried;    /* evaluated (memory, and the step where it fits) */
    int fit;      /* of those, fitting in memory */
    int over_cap; /* valid, over PLAN_MAX_PIPE_PAIRS: not evaluated */
    int refused;  /* dp x micro-batch divides --batch, refused all the same (sequence-parallel
                   * rows, the pipeline's micro-batches or message tags, --recompute ln) */
    char refused_why[512];
} plan_search_tally;

/* Every (tp, pp, vpp, micro) with tp a divisor of heads (and of the node's GPUs where the job
 * spans nodes: a tp group on one host), pp a divisor of layers, vpp up to max_vpp, micro a
 * power of two up to max_micro, that is valid and fits in memory, ranked by iteration time
 * (base's tp, pp, vpp, micro: 0 searched, else fixed to that value); the best `max` into out,
 * the counts into *t.  smallest (NULL: not wanted): of the evaluated layouts, fitting or not,
 * the one that needs the least memory per GPU (what to report when none fits); untouched when
 * none was evaluated.  The step (a pipeline simulation) is predicted only for the layouts that
 * fit and the smallest.  A layout over PLAN_MAX_PIPE_PAIRS is not evaluated (plan_check):
 * t->over_cap counts them, so that a caller can say the ranking leaves them out.  --recompute
 * ln tries tp 1 only (plan_check_features). */
ms_status plan_search(const plan_model *m, const plan_layout *base, const plan_features *f,
                      const plan_cluster *c, int max_vpp, int max_micro, plan_candidate *out,
                      int max, plan_search_tally *t, plan_candidate *smallest);

/* ---- scale-out costs (plan_scale.c) --------------------------------------- */

typedef struct {
    int ranks;
    int groups;       /* communication groups the layout needs */
    double ours_s;    /* one split per dimension (comm/grid.h): 3 collectives */
    double barrier_s; /* a global barrier over the store after every group */
} plan_init_cost;

/* Group initialisation at `ranks` ranks with the layout's tp and pp. */
plan_init_cost plan_init_time(const plan_cluster *c, int ranks, int tp, int pp);
/* The job sizes of the group-initialisation table: for each power of two from 1,024 to 16,384,
 * the multiple of tp x pp nearest to it (at least tp x pp: a job is whole model replicas),
 * each once, ascending, into ranks[PLAN_INIT_SCALES]; returns how many (1 to 5). */
#define PLAN_INIT_SCALES 5
int plan_init_scales(int tp, int pp, int *ranks);

typedef struct {
    double state_gb_per_gpu; /* what a rank snapshots: fp32 weights + optimizer shard */
    double stall_s;          /* stage 1: device to host memory, on the step */
    double persist_s;        /* stage 2: host memory to storage, in the background */
    double restore_s;        /* one reader per shard from storage, broadcast over DP */
    double restore_all_s;    /* every rank reading its own copy */
} plan_ckpt_cost;

plan_ckpt_cost plan_ckpt_time(const plan_model *m, const plan_layout *l, const plan_cluster *c);

/* Effective training time ratio of a job of `nodes` nodes with a mean time
 * between failures of one node mtbf_h hours, checkpointing every
 * interval_s (stall_s each), restarting in restart_s plus the lost work
 * (half an interval on average):
 *   ETTR = interval / (interval + stall) * (1 - (restart + interval/2) / MTBF_job),
 * MTBF_job = MTBF_node / nodes (0 when that is negative). */
double plan_ettr(double mtbf_node_h, int nodes, double interval_s, double stall_s,
                 double restart_s);
/* Young/Daly's optimal interval sqrt(2 stall MTBF_job), seconds. */
double plan_ckpt_interval_opt(double mtbf_node_h, int nodes, double stall_s);
/* What a checkpoint every interval_s costs training: its stage 1, or, when
 * stage 2 is slower than the interval, the persist less the interval (a
 * checkpoint that finds both host-memory slots busy waits for the persist
 * before it: training runs at the disk's pace), whichever is longer. */
double plan_ckpt_stall(const plan_ckpt_cost *c, double interval_s);
/* The interval to choose: Young/Daly's for the stall, but no shorter than
 * the persist less the stall (a shorter one only makes training wait). */
double plan_ckpt_interval_best(const plan_ckpt_cost *c, double mtbf_node_h, int nodes);

/* ---- output (plan_report.c) ---------------------------------------------- */

void plan_result_print(FILE *f, const plan_model *m, const plan_layout *l, const plan_cluster *c,
                       const plan_result *r);
/* {"mfu","iter_s","tokens_per_s","memory_gb_per_gpu","fits","layout":{...},
 *  "parts":{"compute","tp","pp","dp","bubble","optimizer","data"},
 *  "dp_allgather":{"exposed_s","comm_s","gb","elem_bytes","convert_s"} (of parts.dp),
 *  "memory":{...}}
 * malloc'd, one line; NULL on OOM. */
char *plan_result_json(const plan_model *m, const plan_layout *l, const plan_cluster *c,
                       const plan_result *r);

#endif
