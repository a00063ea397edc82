/* test_plan.c - the planner's cost models (src/plan): the pipeline bubble
 * against the schedule simulator, ring / tree collective costs, the
 * activation memory of a known configuration (Korthikanti et al.), the
 * GEMM curve, cluster files (round trip and every kind of bad file, each
 * error naming the file and the key), layout errors naming the option,
 * Young/Daly, that each overlap feature only ever hides time, and that a
 * cluster whose cores copy the bytes (overlap_exposed) hides less, the
 * optimizer's passes, the group-initialisation table's job sizes, ZeRO's
 * all-gather of the updated weights (fp32 in this trainer) and the
 * trainer's --recompute modes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "diag/diag.h"
#include "model/gpt.h"
#include "parallel/schedule.h"
#include "plan/plan.h"
#include "tmpdir.h"

static plan_cluster cluster(void) {
    plan_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "test");
    c.gpus_per_node = 8;
    c.peak_flops = 100e12, c.mem_gb = 80, c.reserved_gb = 2;
    c.hbm_gbps = 2000, c.hbm_eff = 1, c.attn_eff = 0.5, c.launch_us = 0;
    c.n_gemm = 3;
    c.gemm_n[0] = 100, c.gemm_n[1] = 1000, c.gemm_n[2] = 10000;
    c.gemm_eff[0] = 0.2, c.gemm_eff[1] = 0.6, c.gemm_eff[2] = 0.8;
    c.intra = (plan_link){.gbps = 100, .lat_us = 10, .eff = 1};
    c.inter = (plan_link){.gbps = 10, .lat_us = 20, .eff = 0.5};
    c.act_bytes = 2, c.grad_bytes = 4;
    c.pcie_gbps = 20, c.storage_gbps = 2, c.store_op_us = 500, c.comm_init_ms = 100;
    return c;
}

static void test_collectives(void) {
    plan_link l = {.gbps = 100, .lat_us = 10, .eff = 1};
    double S = 1e9;
    /* ring all-reduce over 8: 2 * 7 steps of latency, 2 * 7/8 of the buffer through each link */
    T_NEAR(plan_coll_s(&l, PLAN_ALLREDUCE, 8, S), 2 * 7 * 10e-6 + 2 * 7.0 / 8 * S / 100e9, 1e-12);
    /* a small one takes the tree: 2 log2(8) steps and twice the (tiny) buffer */
    T_NEAR(plan_coll_s(&l, PLAN_ALLREDUCE, 8, 8), 2 * 3 * 10e-6 + 2 * 8 / 100e9, 1e-12);
    T_NEAR(plan_coll_s(&l, PLAN_ALLGATHER, 4, S), 3 * 10e-6 + 0.75 * S / 100e9, 1e-12);
    T_NEAR(plan_coll_s(&l, PLAN_REDUCE_SCATTER, 4, S), 3 * 10e-6 + 0.75 * S / 100e9, 1e-12);
    T_NEAR(plan_coll_s(&l, PLAN_P2P, 2, S), 10e-6 + S / 100e9, 1e-12);
    T_NEAR(plan_coll_s(&l, PLAN_ALLREDUCE, 1, S), 0, 0);
    plan_link half = l;
    half.eff = 0.5; /* efficiency scales the bandwidth term only */
    T_NEAR(plan_coll_s(&half, PLAN_ALLGATHER, 2, S) - 10e-6,
           2 * (plan_coll_s(&l, PLAN_ALLGATHER, 2, S) - 10e-6), 1e-12);
    plan_cluster c = cluster();
    T_OK(plan_link_of(&c, 8, 1, 64) == &c.intra); /* tp 8 in a node of 8 */
    T_OK(plan_link_of(&c, 2, 8, 64) == &c.inter); /* dp peers 8 ranks apart */
    T_OK(plan_link_of(&c, 4, 2, 64) == &c.intra); /* 4 x 2 fit in the node */
    /* groups that straddle nodes although a group is no wider than one: dp 3 (ranks 6, 7, 8),
     * tp 3, the pipeline of tp 4 x pp 4 (the hop from ranks 4-7 to 8-11) */
    T_OK(plan_link_of(&c, 3, 1, 24) == &c.inter);
    T_OK(plan_link_of(&c, 3, 2, 48) == &c.inter);
    T_OK(plan_link_of(&c, 4, 4, 16) == &c.inter);
    T_OK(plan_link_of(&c, 3, 2, 6) == &c.intra);  /* a world of 6 in one node */
    T_OK(plan_link_of(&c, 2, 4, 16) == &c.intra); /* blocks of 8 on nodes of 8 */
    c.gpus_per_node = 1; /* one GPU a node: every group of 2 or more between nodes */
    T_OK(plan_link_of(&c, 2, 1, 2) == &c.inter);
    T_OK(plan_link_of(&c, 1, 1, 2) == &c.intra);
    /* the step: tp 4 x pp 4 on nodes of 8 pays the inter-node link for its pipeline
     * transfers, on nodes of 16 the intra-node one (the same 8 GPUs a node said intra) */
    plan_model pm = {.layers = 8, .dim = 1024, .heads = 16, .vocab = 1000, .seq = 512};
    plan_features pf = {0};
    plan_layout l44 = {.gpus = 16, .tp = 4, .pp = 4, .vpp = 1, .batch = 8, .micro = 1};
    plan_result r8, r16;
    c.gpus_per_node = 8;
    T_OK(plan_predict(&pm, &l44, &pf, &c, &r8) == MS_OK);
    c.gpus_per_node = 16;
    T_OK(plan_predict(&pm, &l44, &pf, &c, &r16) == MS_OK);
    T_OK(r8.pp_s > 2 * r16.pp_s);
    T_NEAR(r8.tp_s, r16.tp_s, 1e-12); /* tp 4 inside a node of either size */
}

static void test_gemm_curve(void) {
    plan_cluster c = cluster();
    T_NEAR(plan_gemm_eff(&c, 1000, 1000, 1000), 0.6, 1e-9);
    T_NEAR(plan_gemm_eff(&c, 1e5, 1e5, 1e5), 0.8, 1e-9); /* flat past the end */
    T_NEAR(plan_gemm_eff(&c, 100 * sqrt(10.0), 100 * sqrt(10.0), 100 * sqrt(10.0)), 0.4,
           1e-9);                                     /* log-mid */
    T_NEAR(plan_gemm_eff(&c, 50, 50, 50), 0.1, 1e-9); /* below: proportional */
    /* a big product runs at the curve; a thin one (K = 1) is memory-bound */
    T_NEAR(plan_gemm_s(&c, 1e4, 1e4, 1e4), 2e12 / (100e12 * 0.8), 1e-12);
    double thin = plan_gemm_s(&c, 1e4, 1e4, 1);
    T_OK(thin > 2e8 / (100e12 * plan_gemm_eff(&c, 1e4, 1e4, 1)) * 0.999);
}

/* The planner's bubble of a model whose ends cost nothing against the
 * simulator's bubble fraction of the same schedule. */
static void test_bubble(void) {
    plan_cluster c = cluster();
    plan_model m = {.layers = 16, .dim = 4096, .heads = 32, .vocab = 2, .seq = 1024};
    plan_features f = {.pp_overlap = 1, .dp_overlap = 1, .fused = 1, .async_data = 1};
    struct {
        int pp, vpp, batch;
    } cases[] = {{4, 1, 8}, {4, 1, 16}, {4, 2, 8}, {2, 4, 8}, {8, 2, 16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan_layout l = {.gpus = cases[i].pp,
                         .tp = 1,
                         .pp = cases[i].pp,
                         .vpp = cases[i].vpp,
                         .batch = cases[i].batch,
                         .micro = 1};
        plan_result r;
        T_EQ_INT(plan_predict(&m, &l, &f, &c, &r), MS_OK);
        double want = 0;
        T_EQ_INT(par_schedule_bubble_fraction(l.vpp > 1 ? PAR_SCHED_INTERLEAVED : PAR_SCHED_1F1B,
                                              l.pp, l.vpp, l.batch, &want),
                 MS_OK);
        /* the simulator's costs are FWD 1 : BWD 2; the planner's backward is about twice its
         * forward too, and the p2p transfers are hidden: within 10% of the fraction */
        double got = r.bubble_fraction;
        if (fabs(got - want) > 0.1 * want)
            fprintf(stderr, "pp %d vpp %d m %d: bubble %.4f, simulator %.4f\n", l.pp, l.vpp,
                    l.batch, got, want);
        T_NEAR(got, want, 0.1 * want);
        T_OK(r.bubble_s > 0);
    }
    /* per-stage costs and a transfer time in the simulator itself: a slower stage and a p2p
     * delay both lengthen the makespan, t_p2p 0 and uniform costs give validate's result */
    par_plan plan;
    T_EQ_INT(par_plan_build(PAR_SCHED_1F1B, 4, 1, 8, &plan), MS_OK);
    double fw[4] = {1, 1, 1, 1}, bw[4] = {2, 2, 2, 2};
    par_sim_costs pc = {.t_fwd = fw, .t_bwd = bw, .t_p2p = 0};
    par_sim_stats a, b, s2, s3;
    T_EQ_INT(par_schedule_simulate(&plan, &pc, &a, NULL), MS_OK);
    T_EQ_INT(par_schedule_validate(&plan, 1, 2, &b, NULL), MS_OK);
    T_NEAR(a.makespan, b.makespan, 1e-12);
    T_NEAR(a.makespan, (8 + 3) * 3.0, 1e-12); /* (m + p - 1)(f + b) */
    fw[2] = 2, bw[2] = 4;
    T_EQ_INT(par_schedule_simulate(&plan, &pc, &s2, NULL), MS_OK);
    /* the slow stage sets the pace: its own work, plus at least the other stages' fill */
    T_OK(s2.makespan >= 8 * 6.0 + 3 * 1.0 && s2.makespan <= 8 * 6.0 + 3 * 3.0);
    fw[2] = 1, bw[2] = 2, pc.t_p2p = 0.25;
    T_EQ_INT(par_schedule_simulate(&plan, &pc, &s3, NULL), MS_OK);
    /* at least fill and drain's 2 (p-1) hops, at most one per FWD and BWD on the path */
    T_OK(s3.makespan >= a.makespan + 2 * 3 * 0.25 && s3.makespan <= a.makespan + 2 * 11 * 0.25);
    par_plan_free(&plan);
}

/* What the trainer saves for one block of GPT-3 175B (s 2048, b 1, h 12288, a 96) at tp 8
 * with 16-bit activations, by hand (gpt_model.c push_layer): over S = s b h elements, the
 * residual input and mid-block residual at S/t each, the two LayerNorm outputs all-gathered
 * (S each), q k v (3 S/t), the attention output (S/t), the MLP's pre-activation and GeLU
 * (4 S/t each), times 2 bytes: 4 S + 28 S/t; the LayerNorms' mean and rstd, 4 x s/t fp32; the
 * attention's state, a/t heads of s fp32 (flash: log-sum-exp) or s x s (the softmax kept). */
static double block_bytes(double S, double t, double s, double a, int flash) {
    return 4 * S + 28 * S / t + 4 * s / t * 4 + a / t * s * (flash ? 1 : s) * 4;
}

static void test_memory(void) {
    plan_model m = {.layers = 96, .dim = 12288, .heads = 96, .vocab = 50257, .seq = 2048};
    double h = 12288, S = 2048.0 * h, sbh = S / 8;
    T_NEAR(plan_layer_act_bytes(&m, 8, 1, PLAN_RECOMPUTE_NONE, 1, 2),
           block_bytes(S, 8, 2048, 96, 1), 0);
    T_NEAR(plan_layer_act_bytes(&m, 8, 1, PLAN_RECOMPUTE_NONE, 0, 2),
           block_bytes(S, 8, 2048, 96, 0), 0);
    /* selective recomputation keeps no score matrix; full keeps the block's input */
    T_NEAR(plan_layer_act_bytes(&m, 8, 1, PLAN_RECOMPUTE_SELECTIVE, 0, 2),
           block_bytes(S, 8, 2048, 96, 1), 0);
    T_NEAR(plan_layer_act_bytes(&m, 8, 1, PLAN_RECOMPUTE_FULL, 0, 2), sbh * 2, 0);
    T_NEAR(plan_layer_act_bytes(&m, 8, 2, PLAN_RECOMPUTE_NONE, 1, 2),
           block_bytes(2 * S, 8, 4096, 96, 1), 0);
    /* a parallel block: no mid-block residual, one LayerNorm */
    plan_model pb = m;
    pb.parallel_block = 1;
    T_NEAR(plan_layer_act_bytes(&pb, 8, 1, PLAN_RECOMPUTE_NONE, 1, 2),
           block_bytes(S, 8, 2048, 96, 1) - 2 * S - 2 * sbh - 2 * 2048.0 / 8 * 4, 0);
    /* a whole configuration by hand: tp 8, pp 8, dp 4, one chunk, 1F1B */
    plan_cluster c = cluster();
    plan_layout l = {.gpus = 256, .tp = 8, .pp = 8, .vpp = 1, .batch = 64, .micro = 1};
    plan_features f = {.recompute = PLAN_RECOMPUTE_NONE};
    plan_result r;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &r), MS_OK);
    /* stage 0: wte (the vocabulary padded to 128 tp = 51200) over tp, wpe, 12 blocks of
     * 12h^2 + 7h split over tp and 6h whole (LayerNorms, the projections' biases) */
    double n = 51200.0 / 8 * h + 2048 * h + 12 * (12 * h * h / 8 + 7 * h / 8 + 6 * h);
    T_NEAR(r.mem_params_gb, n * (4 + 2) / 1e9, 1e-9); /* fp32 masters whole, a bf16 copy */
    T_NEAR(r.mem_grads_gb, n * 4 / 1e9, 1e-9);
    T_NEAR(r.mem_optim_gb, n * 8 / 4 / 1e9, 1e-9); /* m and v, sharded over dp 4 */
    T_EQ_INT(r.in_flight, 8);                      /* 1F1B: stage 0 keeps pp micro-batches */
    /* stage 0, the busiest: 8 sets of 12 blocks and their 8 output gradients (S / t each),
     * and once: ln_f's output, dln, tmp, dfull and the reduce-scatter's buffer (S each);
     * x_final, dresid, datty, dqkv, dfc, dfc_pre (14 S / t); the 3 send buffers a direction
     * (6 S / t); 2 bytes each; the tied wte's fp32 copy; the vocabulary-parallel
     * classifier's chunk (2048 rows of 6400, 2 bytes); within 2 MB (tokens, statistics) */
    double blocks = 8 * 12 * block_bytes(S, 8, 2048, 96, 1), wte = 51200.0 / 8 * h * 4;
    double rest = (5 * S + (8 + 14 + 6) * S / 8) * 2 + wte + 2048 * 6400.0 * 2;
    T_OK(r.mem_act_gb * 1e9 > blocks + rest);
    T_OK(r.mem_act_gb * 1e9 < blocks + rest + 2e6);
    T_NEAR(r.memory_gb, r.mem_params_gb + r.mem_grads_gb + r.mem_optim_gb + r.mem_act_gb + 2, 1e-9);
    T_OK(r.fits == (r.memory_gb <= 80));
    /* full recomputation: each block keeps its input (2 s b h / t), and the block whose
     * backward runs holds its recomputed activations meanwhile, on top of its kept input
     * (which is its resid_in: counted once, not twice) */
    double act_none = r.mem_act_gb;
    f.recompute = PLAN_RECOMPUTE_FULL;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &r), MS_OK);
    T_NEAR(r.mem_act_gb,
           act_none - (8 * 12 - 1) * block_bytes(S, 8, 2048, 96, 1) / 1e9 +
               (8 * 12 - 1) * sbh * 2 / 1e9,
           1e-9);
    /* interleaved, vpp 2: the activation sets are the trainer's (par_schedule_slots: the
     * larger of its two communication modes' lists), not the simulator's pairs in flight */
    plan_layout l2 = l;
    l2.vpp = 2;
    f.recompute = PLAN_RECOMPUTE_NONE;
    T_EQ_INT(plan_predict(&m, &l2, &f, &c, &r), MS_OK);
    int sets = 0;
    for (int comm = PAR_COMM_OVERLAP; comm <= PAR_COMM_BLOCKING; comm++) {
        par_instr *list = NULL;
        int ni = 0, k = 0, slot[32];
        T_EQ_INT(par_schedule_comm(PAR_SCHED_INTERLEAVED, comm, 8, 2, 16, 0, &list, &ni), MS_OK);
        T_EQ_INT(par_schedule_slots(list, ni, 2, 16, slot, &k), MS_OK);
        if (k > sets) sets = k;
        free(list);
    }
    T_EQ_INT(r.in_flight, sets);
    /* one stage on a CPU cluster (cores: the attention keeps its s x s scores, the
     * classifier's fp32 logits chunk is the backend's) */
    plan_model v = {.layers = 8, .dim = 1024, .heads = 16, .vocab = 256, .seq = 4096};
    plan_layout l1 = {.gpus = 1, .tp = 1, .pp = 1, .vpp = 1, .batch = 8, .micro = 1};
    c.cores = 2, c.threads = 1, c.act_bytes = 4;
    T_EQ_INT(plan_predict(&v, &l1, &f, &c, &r), MS_OK);
    T_EQ_INT(r.in_flight, 1);
    /* 4-byte activations: the block's tensors twice, its statistics and scores once */
    double S1 = 4096.0 * 1024,
           layer1 = 2 * block_bytes(S1, 1, 4096, 16, 0) - 16 * 4096 - 16 * 4096.0 * 4096 * 4;
    T_NEAR(plan_layer_act_bytes(&v, 1, 1, PLAN_RECOMPUTE_NONE, 0, 4), layer1, 0);
    T_OK(r.mem_act_gb * 1e9 > 8 * layer1 + 4096.0 * 256 * 4);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static const char *good =
    "{\"format\":\"megascale-cluster\",\"version\":1,\"name\":\"t\",\"gpus_per_node\":8,"
    "\"peak_tflops\":312,\"mem_gb\":80,\"reserved_gb\":5,\"hbm_gbps\":2039,\"hbm_eff\":0.8,"
    "\"attn_eff\":0.5,\"launch_us\":5,\"gemm\":[[256,0.3],[4096,0.8]],"
    "\"links\":{\"intra\":{\"gbps\":300,\"lat_us\":10,\"eff\":0.6},"
    "\"inter\":{\"gbps\":25,\"lat_us\":20,\"eff\":0.5}},\"act_bytes\":2,\"grad_bytes\":4,"
    "\"data_ms\":4,\"step_ms\":300,\"pcie_gbps\":20,\"storage_gbps\":2,\"store_op_us\":590,"
    "\"comm_init_ms\":100}";

/* good with `from` replaced by `to`: loading must fail naming the file and `needle`. */
static void bad_file(const char *dir, const char *from, const char *to, const char *needle) {
    char path[512], text[4096];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    const char *at = strstr(good, from);
    MS_CHECK(at);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, to, at + strlen(from));
    write_file(path, text);
    plan_cluster c;
    ms_status st = plan_cluster_load(path, &c);
    T_EQ_INT(st, MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), path);
    T_STR_CONTAINS(ms_errmsg(), needle);
}

static void test_cluster_files(void) {
    if (!ms_tmpdir_make("plan")) {
        T_OK(0);
        return;
    }
    const char *dir = tmpdir;
    char path[512], out[512];
    snprintf(path, sizeof path, "%s/good.json", dir);
    snprintf(out, sizeof out, "%s/again.json", dir);
    write_file(path, good);
    plan_cluster c, d;
    T_EQ_INT(plan_cluster_load(path, &c), MS_OK);
    T_NEAR(c.peak_flops, 312e12, 1);
    T_NEAR(c.inter.eff, 0.5, 0);
    T_EQ_INT(c.n_gemm, 2);
    T_EQ_INT(plan_cluster_save(&c, out), MS_OK); /* round trip */
    T_EQ_INT(plan_cluster_load(out, &d), MS_OK);
    T_OK(!memcmp(&c.gemm_eff, &d.gemm_eff, sizeof c.gemm_eff) && c.peak_flops == d.peak_flops &&
         c.intra.lat_us == d.intra.lat_us && c.store_op_us == d.store_op_us);
    T_EQ_INT(plan_cluster_find("good", dir, &d), MS_OK); /* NAME: DIR/NAME.json */
    T_EQ_INT(plan_cluster_find("nonesuch", dir, &d), MS_ERR_NOTFOUND);
    T_STR_CONTAINS(ms_errmsg(), "nonesuch");
    bad_file(dir, "\"version\":1", "\"version\":2", "version");
    bad_file(dir, "megascale-cluster", "other", "format");
    bad_file(dir, "\"hbm_eff\":0.8", "\"hbm_eff\":1.8", "hbm_eff");
    bad_file(dir, "\"hbm_eff\":0.8", "\"hbm_eff\":0.8,\"overlap_exposed\":1.5", "overlap_exposed");
    T_NEAR(c.overlap_exposed, 0, 0); /* absent: 0, the bytes move beside the compute */
    bad_file(dir, "\"hbm_eff\":0.8", "\"hbm_eff\":0.8,\"ln_bwd_passes\":-1", "ln_bwd_passes");
    bad_file(dir, "\"mem_gb\":80,", "", "mem_gb");               /* missing */
    bad_file(dir, "\"mem_gb\":80", "\"mem_gbs\":80", "mem_gbs"); /* unknown (a typo) */
    bad_file(dir, "[4096,0.8]", "[128,0.8]", "gemm");            /* not increasing */
    bad_file(dir, "\"eff\":0.5}", "\"eff\":0}", "links.inter.eff");
    bad_file(dir, "\"lat_us\":10,", "\"latency\":10,", "links.intra.latency");
    bad_file(dir, "\"gpus_per_node\":8", "\"gpus_per_node\":8.5", "gpus_per_node");
    /* past an int: its range said, not cast first (undefined: it read "not an integer") */
    bad_file(dir, "\"gpus_per_node\":8", "\"gpus_per_node\":1e10", "is 1e+10, outside [1, 2^20]");
    bad_file(dir, "{\"format\"", "[\"format\"", "JSON");
    snprintf(path, sizeof path, "%s/none.json", dir);
    T_EQ_INT(plan_cluster_load(path, &c) == MS_OK, 0);
    T_STR_CONTAINS(ms_errmsg(), "none.json");
    ms_tmpdir_remove();
}

static void test_layout_errors(void) {
    plan_model m = {.layers = 96, .dim = 12288, .heads = 96, .vocab = 50257, .seq = 2048};
    struct {
        plan_layout l;
        const char *needle;
    } cases[] = {
        {{.gpus = 256, .tp = 5, .pp = 8, .vpp = 1, .batch = 64, .micro = 1}, "--tp 5"},
        {{.gpus = 100, .tp = 8, .pp = 8, .vpp = 1, .batch = 64, .micro = 1}, "--gpus 100"},
        {{.gpus = 256, .tp = 8, .pp = 8, .vpp = 1, .batch = 66, .micro = 1}, "--batch 66"},
        {{.gpus = 256, .tp = 8, .pp = 8, .vpp = 5, .batch = 64, .micro = 1}, "--vpp 5"},
        {{.gpus = 256, .tp = 8, .pp = 8, .vpp = 2, .batch = 36, .micro = 1}, "micro-batches"},
        /* products past int (65536 x 65536 wrapped to 0: a division by zero before) */
        {{.gpus = 256, .tp = 65536, .pp = 65536, .vpp = 1, .batch = 64, .micro = 1}, "--gpus 256"},
        {{.gpus = 65536, .tp = 1, .pp = 65536, .vpp = 65536, .batch = 64, .micro = 1},
         "--vpp 65536"},
    };
    plan_model wide = {.layers = 96, .dim = 65536, .heads = 65536, .vocab = 50257, .seq = 2048};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        T_EQ_INT(plan_check(cases[i].l.tp == 65536 ? &wide : &m, &cases[i].l), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), cases[i].needle);
    }
}

static void test_scale(void) {
    /* Young/Daly: sqrt(2 x stall x MTBF of the job); the ETTR is highest near it */
    double opt = plan_ckpt_interval_opt(10000, 100, 5);
    T_NEAR(opt, sqrt(2 * 5 * 10000 * 3600 / 100.0), 1e-9);
    double e = plan_ettr(10000, 100, opt, 5, 600);
    T_OK(e > plan_ettr(10000, 100, opt / 4, 5, 600) && e > plan_ettr(10000, 100, opt * 4, 5, 600));
    T_OK(e < 1 && e > 0.9);
    T_OK(plan_ettr(10000, 100, opt, 5, 600) > plan_ettr(5000, 100, opt, 5, 600));
    /* a persist slower than the interval: a checkpoint that finds both host-memory slots
     * busy waits for it (none is skipped), so training pays persist - interval */
    plan_ckpt_cost ck = {.stall_s = 5, .persist_s = 3000};
    T_NEAR(plan_ckpt_stall(&ck, 4000), 5, 0);
    T_NEAR(plan_ckpt_stall(&ck, 1000), 2000, 0);
    T_NEAR(plan_ckpt_interval_best(&ck, 10000, 100), 2995, 1e-9); /* Young/Daly's: 1897 s */
    double best = plan_ckpt_interval_best(&ck, 10000, 100),
           e2 = plan_ettr(10000, 100, best, plan_ckpt_stall(&ck, best), 600);
    T_OK(e2 > plan_ettr(10000, 100, opt, plan_ckpt_stall(&ck, opt), 600) &&
         e2 > plan_ettr(10000, 100, best * 2, plan_ckpt_stall(&ck, best * 2), 600));
    ck.persist_s = 100; /* a fast disk: Young/Daly's */
    T_NEAR(plan_ckpt_interval_best(&ck, 10000, 100), opt, 1e-9);
    plan_cluster c = cluster();
    plan_init_cost a = plan_init_time(&c, 2048, 8, 8), b = plan_init_time(&c, 4096, 8, 8);
    T_OK(a.ours_s < 5 && a.barrier_s > 100 * a.ours_s);
    T_OK(b.barrier_s > 3.5 * a.barrier_s); /* a barrier per group: quadratic in the ranks */
    T_OK(b.ours_s < 2.5 * a.ours_s);       /* ours: linear at most */
    /* the table's job sizes: whole tp x pp replicas near 1k-16k (tp 3 or tp 2 x pp 3 had none:
     * no power of two is their multiple) */
    int ranks[PLAN_INIT_SCALES];
    T_EQ_INT(plan_init_scales(8, 8, ranks), 5);
    T_EQ_INT(ranks[0], 1024);
    T_EQ_INT(ranks[4], 16384);
    T_EQ_INT(plan_init_scales(3, 1, ranks), 5);
    T_EQ_INT(ranks[0], 1023);
    T_EQ_INT(ranks[1], 2049);
    T_EQ_INT(ranks[4], 16383);
    T_EQ_INT(plan_init_scales(2, 3, ranks), 5);
    T_EQ_INT(ranks[0], 1026);
    T_EQ_INT(ranks[3], 8190);
    for (int i = 0; i < 5; i++)
        T_EQ_INT(ranks[i] % 6, 0);
    T_EQ_INT(plan_init_scales(8, 1000, ranks), 2); /* 8,000 for 1k-8k, then 16,000: each once */
    T_EQ_INT(ranks[0], 8000);
    T_EQ_INT(ranks[1], 16000);
    T_EQ_INT(plan_init_scales(8, 5000, ranks), 1);
    T_EQ_INT(ranks[0], 40000);
    plan_init_cost g = plan_init_time(&c, 1026, 2, 3); /* 171 replicas */
    T_EQ_INT(g.groups, 1026 / 2 + 1026 / 3 + 6 + 171 + 1026 / 3);
}

/* Each overlap feature, turned on alone over Megatron's baseline, only hides time. */
static void test_features(void) {
    plan_cluster c = cluster();
    plan_model m = {.layers = 32, .dim = 4096, .heads = 32, .vocab = 50257, .seq = 2048};
    plan_layout l = {.gpus = 64, .tp = 4, .pp = 4, .vpp = 2, .batch = 64, .micro = 1};
    plan_features base = {0};
    plan_result r0, r;
    T_EQ_INT(plan_predict(&m, &l, &base, &c, &r0), MS_OK);
    T_OK(r0.tp_s > 0 && r0.pp_s > 0 && r0.dp_s > 0);
    plan_features f = base;
    f.tp_overlap = 1;
    plan_predict(&m, &l, &f, &c, &r);
    T_OK(r.tp_s < r0.tp_s && r.iter_s < r0.iter_s);
    f = base, f.pp_overlap = 1;
    plan_predict(&m, &l, &f, &c, &r);
    T_OK(r.pp_s == 0 && r.iter_s < r0.iter_s);
    f = base, f.dp_overlap = 1;
    plan_predict(&m, &l, &f, &c, &r);
    T_OK(r.dp_s < r0.dp_s && r.iter_s < r0.iter_s);
    T_NEAR(r0.iter_s,
           r0.compute_s + r0.tp_s + r0.pp_s + r0.bubble_s + r0.dp_s + r0.optimizer_s + r0.data_s,
           1e-9);
    /* a measured LayerNorm backward slower than the rule's 2 passes costs more compute, with
     * the fused kernels only (the unfused ones keep their 6 passes) */
    plan_features fu = base;
    fu.fused = 1;
    plan_result r2, r6, rn;
    T_EQ_INT(plan_predict(&m, &l, &fu, &c, &r2), MS_OK);
    c.ln_bwd_passes = 6;
    T_EQ_INT(plan_predict(&m, &l, &fu, &c, &r6), MS_OK);
    T_EQ_INT(plan_predict(&m, &l, &base, &c, &rn), MS_OK);
    T_OK(r6.compute_s > r2.compute_s && rn.compute_s == r0.compute_s);
    c.ln_bwd_passes = 0;
    /* a cluster whose cores copy the bytes (overlap_exposed 1) hides nothing by overlap:
     * every overlap on predicts the blocking step; half of it lands in between */
    plan_features all = base;
    all.tp_overlap = all.pp_overlap = all.dp_overlap = 1;
    plan_result ra, rh, rf;
    T_EQ_INT(plan_predict(&m, &l, &all, &c, &ra), MS_OK);
    c.overlap_exposed = 1;
    T_EQ_INT(plan_predict(&m, &l, &all, &c, &rf), MS_OK);
    T_NEAR(rf.tp_s, r0.tp_s, 1e-12 * r0.tp_s);
    T_NEAR(rf.dp_s, r0.dp_s, 1e-12 * r0.dp_s);
    T_NEAR(rf.pp_s, r0.pp_s, 1e-12 * r0.pp_s);
    T_NEAR(rf.iter_s, r0.iter_s, 1e-9 * r0.iter_s);
    c.overlap_exposed = 0.5;
    T_EQ_INT(plan_predict(&m, &l, &all, &c, &rh), MS_OK);
    T_OK(rh.tp_s > ra.tp_s && rh.tp_s < rf.tp_s && rh.dp_s > ra.dp_s && rh.dp_s < rf.dp_s);
    T_OK(rh.iter_s > ra.iter_s && rh.iter_s < rf.iter_s);
}

/* The optimizer's part by hand: one GPU, AdamW at a measured time per parameter (it
 * leaves the gradients 0 as it reads them), a read pass for the gradient norm's sum of
 * squares (fp32 gradients through hbm_gbps), two operators for each tensor; ZeRO over dp 4
 * divides the update and the norm's pass, and adds a write pass zeroing the other three
 * ranks' shards of the gradients. */
static void test_optimizer(void) {
    plan_cluster c = cluster();
    c.opt_ns_per_param = 2, c.launch_us = 3;
    plan_model m = {.layers = 4, .dim = 256, .heads = 4, .vocab = 1024, .seq = 128};
    plan_layout l = {.gpus = 1, .tp = 1, .pp = 1, .vpp = 1, .batch = 8, .micro = 8};
    plan_features f = {0};
    plan_result r;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &r), MS_OK);
    double layer, embed;
    plan_params(&m, &layer, &embed);
    double n = 4 * layer + embed, bw = 2000e9;
    gpt_config g = {.n_layer = 1, .n_embd = 256, .n_head = 4, .vocab = 1024, .seq_max = 128};
    double tensors = 4.0 * gpt_config_layer_tensors(&g) + GPT_EMBED_TENSORS;
    double pass = n * 4 / bw + 3e-6; /* one pass over fp32 gradients, and its launch */
    T_NEAR(r.optimizer_s, n * 2e-9 + pass + 2 * tensors * 3e-6, 1e-12);
    plan_layout l4 = {.gpus = 4, .tp = 1, .pp = 1, .vpp = 1, .batch = 8, .micro = 2};
    plan_result r4;
    T_EQ_INT(plan_predict(&m, &l4, &f, &c, &r4), MS_OK);
    double norm4 = plan_coll_s(&c.intra, PLAN_ALLREDUCE, 4, 8);
    T_NEAR(r4.optimizer_s - norm4,
           n / 4 * 2e-9 + (n / 4 * 4 / bw + 3e-6) + (n * 3 / 4 * 4 / bw + 3e-6) +
               2 * tensors * 3e-6,
           1e-12);
}

/* ZeRO's all-gather of the updated weights: the trainer's gathers the fp32 masters
 * (parallel/zero.c, COMM_F32), where Megatron-LM's and MegaScale's gather the 16-bit
 * parameters; without overlap every bucket's gather is waited as it starts (exposed whole),
 * with it the trainer's optimizer starts each as it finishes its shard, so that a slower rest of
 * the optimizer hides more.  On 16-bit activations the forward converts the gathered weights to
 * the 16-bit copy (one pass, 4 + 2 bytes a parameter). */
static void test_zero_gather(void) {
    plan_cluster c = cluster();
    plan_model m = {.layers = 4, .dim = 256, .heads = 4, .vocab = 1024, .seq = 128};
    plan_layout l = {.gpus = 4, .tp = 1, .pp = 1, .vpp = 1, .batch = 8, .micro = 2};
    double layer, embed;
    plan_params(&m, &layer, &embed);
    double stage = 4 * layer + embed;
    plan_features f16 = {0}, f32 = {.fp32_gather = 1};
    plan_result r16, r32;
    T_EQ_INT(plan_predict(&m, &l, &f16, &c, &r16), MS_OK);
    T_EQ_INT(plan_predict(&m, &l, &f32, &c, &r32), MS_OK);
    double ag16 = 4 * plan_coll_s(&c.intra, PLAN_ALLGATHER, 4, layer * 2) +
                  plan_coll_s(&c.intra, PLAN_ALLGATHER, 4, embed * 2);
    double ag32 = 4 * plan_coll_s(&c.intra, PLAN_ALLGATHER, 4, layer * 4) +
                  plan_coll_s(&c.intra, PLAN_ALLGATHER, 4, embed * 4);
    T_NEAR(r16.dp_gather_s, ag16, 1e-15);
    T_NEAR(r16.dp_gather_comm_s, ag16, 1e-15);
    T_NEAR(r32.dp_gather_s, ag32, 1e-15);
    T_NEAR(r16.dp_gather_elem_bytes, 2, 0);
    T_NEAR(r32.dp_gather_elem_bytes, 4, 0);
    T_NEAR(r32.dp_gather_gb, stage * 4 / 1e9, 1e-15);
    T_NEAR(r16.dp_convert_s, 0, 0);
    T_NEAR(r32.dp_convert_s, stage * 6 / 2000e9, 1e-15); /* launch_us 0 */
    /* the rest of dp is the same reduce-scatter; the step grows by the difference */
    T_NEAR(r32.dp_s - r32.dp_gather_s - r32.dp_convert_s, r16.dp_s - r16.dp_gather_s, 1e-15);
    T_NEAR(r32.iter_s - r16.iter_s, r32.dp_s - r16.dp_s + r32.optimizer_s - r16.optimizer_s, 1e-12);
    /* the update writes no 16-bit copy (the gathers refresh it): 2 of its 34 bytes */
    T_NEAR(r16.optimizer_s - r32.optimizer_s, stage / 4 * 2 / 2000e9, 1e-15);
    /* fp32 activations: the same bytes either way, and no copy to convert */
    c.act_bytes = 4;
    T_EQ_INT(plan_predict(&m, &l, &f16, &c, &r16), MS_OK);
    T_EQ_INT(plan_predict(&m, &l, &f32, &c, &r32), MS_OK);
    T_NEAR(r32.dp_gather_comm_s, r16.dp_gather_comm_s, 0);
    T_NEAR(r32.dp_convert_s, 0, 0);
    c.act_bytes = 2;
    /* overlapped: exposed no more than the gathers take, less under a slower optimizer (each
     * bucket starts as its shard is updated), all of it where overlap hides nothing */
    f32.dp_overlap = 1;
    plan_result fast, slow, none;
    T_EQ_INT(plan_predict(&m, &l, &f32, &c, &fast), MS_OK);
    T_OK(fast.dp_gather_s > 0 && fast.dp_gather_s <= fast.dp_gather_comm_s);
    c.opt_ns_per_param = 100;
    T_EQ_INT(plan_predict(&m, &l, &f32, &c, &slow), MS_OK);
    T_OK(slow.dp_gather_s < fast.dp_gather_s);
    T_NEAR(slow.dp_gather_comm_s, fast.dp_gather_comm_s, 0);
    c.overlap_exposed = 1;
    T_EQ_INT(plan_predict(&m, &l, &f32, &c, &none), MS_OK);
    T_NEAR(none.dp_gather_s, none.dp_gather_comm_s, 1e-15);
    /* one data-parallel rank: nothing gathered */
    plan_layout one = {.gpus = 1, .tp = 1, .pp = 1, .vpp = 1, .batch = 8, .micro = 2};
    T_EQ_INT(plan_predict(&m, &one, &f32, &c, &r32), MS_OK);
    T_NEAR(r32.dp_gather_s + r32.dp_gather_comm_s + r32.dp_gather_gb + r32.dp_convert_s, 0, 0);
}

/* The trainer's --recompute modes (model/gpt_model.c, gpt_pass.c): gelu keeps no GeLU output
 * and runs the GeLU forward again in every block's backward; ln keeps no LayerNorm output and
 * runs the LayerNorm forwards again (two a serial block); both, both; the outputs share one
 * buffer of the arena, counted once. */
static void test_recompute(void) {
    plan_cluster c = cluster();
    plan_model m = {.layers = 4, .dim = 256, .heads = 4, .vocab = 1024, .seq = 128};
    plan_layout l = {.gpus = 1, .tp = 1, .pp = 1, .vpp = 1, .batch = 8, .micro = 2};
    double N = 256, C = 256, bw = 2000e9;
    double none_b = plan_layer_act_bytes(&m, 1, 2, PLAN_RECOMPUTE_NONE, 1, 2);
    T_NEAR(plan_layer_act_bytes(&m, 1, 2, PLAN_RECOMPUTE_GELU, 1, 2), none_b - N * 4 * C * 2, 0);
    T_NEAR(plan_layer_act_bytes(&m, 1, 2, PLAN_RECOMPUTE_LN, 1, 2), none_b - 2 * N * C * 2, 0);
    T_NEAR(plan_layer_act_bytes(&m, 1, 2, PLAN_RECOMPUTE_GELU_LN, 1, 2),
           none_b - N * 4 * C * 2 - 2 * N * C * 2, 0);
    plan_features f = {.fused = 1};
    plan_result r0, rg, rl, rb;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &r0), MS_OK);
    f.recompute = PLAN_RECOMPUTE_GELU;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &rg), MS_OK);
    f.recompute = PLAN_RECOMPUTE_LN;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &rl), MS_OK);
    f.recompute = PLAN_RECOMPUTE_GELU_LN;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &rb), MS_OK);
    /* 4 blocks, one shared buffer: (4 - 1) outputs a block less */
    T_NEAR(r0.mem_act_gb - rg.mem_act_gb, 3 * N * 4 * C * 2 / 1e9, 1e-15);
    T_NEAR(r0.mem_act_gb - rl.mem_act_gb, (4 * 2 - 1) * N * C * 2 / 1e9, 1e-15);
    /* 4 micro-batches x 4 blocks: one fused GeLU forward (in and out, 2 bytes) / two LayerNorm
     * forwards a block again (launch_us 0) */
    T_NEAR(rg.compute_s - r0.compute_s, 16 * N * 4 * C * 2 * 2 / bw, 1e-15);
    T_NEAR(rl.compute_s - r0.compute_s, 16 * 2 * N * C * 2 * 2 / bw, 1e-15);
    T_NEAR(rb.compute_s - r0.compute_s,
           (rg.compute_s - r0.compute_s) + (rl.compute_s - r0.compute_s), 1e-15);
    /* Megatron-LM's modes map to no trainer flags; the trainer's round-trip */
    T_EQ_INT(plan_recompute_flags(PLAN_RECOMPUTE_FULL), 0);
    for (int fl = 0; fl <= (GPT_RECOMPUTE_GELU | GPT_RECOMPUTE_LN); fl++)
        T_EQ_INT(plan_recompute_flags(plan_recompute_of_flags(fl)), fl);
    /* ln with tensor parallelism: refused, as the trainer refuses it */
    plan_layout tp2 = {.gpus = 2, .tp = 2, .pp = 1, .vpp = 1, .batch = 8, .micro = 2};
    f.recompute = PLAN_RECOMPUTE_LN;
    T_EQ_INT(plan_predict(&m, &tp2, &f, &c, &r0), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "--recompute ln");
    T_STR_CONTAINS(ms_errmsg(), "--tp 2");
    f.recompute = PLAN_RECOMPUTE_GELU;
    T_EQ_INT(plan_predict(&m, &tp2, &f, &c, &r0), MS_OK);
}

/* plan measure's link bandwidth: bytes over the big all-reduce's time less
 * the small one's, and where noise leaves that difference near 0 or below
 * (a small all-reduce timed on a busy moment), a quarter of the big time:
 * a rate a cluster file accepts, not 4.2e6 GB/s. */
static void test_link_gbps(void) {
    double bytes = 4e6;
    T_NEAR(diag_link_gbps(bytes, 10e-6, 1010e-6), 4.0, 1e-9);
    T_NEAR(diag_link_gbps(bytes, 2e-3, 1e-3), 16.0, 1e-9);
    T_NEAR(diag_link_gbps(bytes, 1e-3 - 1e-12, 1e-3), 16.0, 1e-9);
    T_NEAR(diag_link_gbps(bytes, 1e-3, 1e-3), 16.0, 1e-9);
    double g = diag_link_gbps(4194304, 5e-4, 4e-4);
    T_OK(isfinite(g) && g > 0 && g <= 1e6);
}

int main(void) {
    test_link_gbps();
    test_collectives();
    test_gemm_curve();
    test_bubble();
    test_memory();
    test_cluster_files();
    test_layout_errors();
    test_scale();
    test_features();
    test_optimizer();
    test_zero_gather();
    test_recompute();
    return ms_test_summary("test_plan");
}
