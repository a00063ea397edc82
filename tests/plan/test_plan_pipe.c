/* test_plan_pipe.c - the planner's pipeline at any batch: the activation sets of a stage in
 * closed form (plan_stage_sets) against the schedule's own count (par_schedule_slots, the
 * larger of its two communication modes) over a grid of (pp, vpp, micro-batches, stage); a
 * pipeline of more (micro-batch, chunk) pairs than PLAN_MAX_PIPE_PAIRS refused by plan_check
 * with a message naming --batch, dp, --micro-batch, the count and the limit (a batch given in
 * tokens made the step build and simulate millions of instructions per stage: minutes and
 * gigabytes), and one at the limit predicted; --search counting the layouts it leaves out for
 * the cap (plan_over_cap); --tp wider than a node refused by plan_predict;
 * a cluster whose reserved_gb is not below mem_gb, or whose act_bytes is not 2 or 4, refused
 * naming the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"
#include "check.h"
#include "parallel/schedule.h"
#include "plan/plan.h"

/* The most sets stage s's lists hold over both communication modes (-1 on an error). */
static int sched_sets(int pp, int vpp, int n_micro, int s) {
    par_sched_kind kind = vpp > 1 ? PAR_SCHED_INTERLEAVED : PAR_SCHED_1F1B;
    int *slot = malloc(sizeof(int) * (size_t)n_micro * (size_t)vpp), most = -1;
    for (int comm = PAR_COMM_OVERLAP; slot && comm <= PAR_COMM_BLOCKING; comm++) {
        par_instr *list = NULL;
        int n = 0, k = -1;
        if (par_schedule_comm(kind, (par_comm)comm, pp, vpp, n_micro, s, &list, &n) == MS_OK &&
            par_schedule_slots(list, n, vpp, n_micro, slot, &k) != MS_OK)
            k = -1;
        if (k > most) most = k;
        free(list);
    }
    free(slot);
    return most;
}

static void test_sets(void) {
    int cases = 0, wrong = 0;
    for (int pp = 2; pp <= 16; pp++)
        for (int vpp = 1; vpp <= 8; vpp++)
            for (int m = vpp > 1 ? pp : 1; m <= 4 * pp + 9; m += vpp > 1 ? pp : 1)
                for (int s = 0; s < pp; s++) {
                    int want = sched_sets(pp, vpp, m, s), got = plan_stage_sets(pp, vpp, m, s);
                    cases++;
                    if (got != want && wrong++ < 10)
                        fprintf(stderr, "pp %d vpp %d m %d stage %d: %d sets, the schedule %d\n",
                                pp, vpp, m, s, got, want);
                }
    T_EQ_INT(wrong, 0);
    T_OK(cases > 10000);
    /* past the warm-up the count no longer grows with the batch */
    T_EQ_INT(plan_stage_sets(8, 1, 3200000, 0), 8);
    T_EQ_INT(plan_stage_sets(8, 1, 3200000, 7), 2);
    T_EQ_INT(plan_stage_sets(2, 2, 33554432, 0), sched_sets(2, 2, 64, 0));
}

static plan_cluster cluster(void) {
    plan_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "test");
    c.gpus_per_node = 8;
    c.peak_flops = 312e12, c.mem_gb = 80, c.reserved_gb = 5;
    c.hbm_gbps = 2000, c.hbm_eff = 0.8, c.attn_eff = 0.5, c.launch_us = 5;
    c.n_gemm = 2;
    c.gemm_n[0] = 1000, c.gemm_n[1] = 10000, c.gemm_eff[0] = 0.5, c.gemm_eff[1] = 0.8;
    c.intra = (plan_link){.gbps = 150, .lat_us = 5, .eff = 0.6};
    c.inter = (plan_link){.gbps = 25, .lat_us = 20, .eff = 0.5};
    c.act_bytes = 2, c.grad_bytes = 4;
    c.pcie_gbps = 20, c.storage_gbps = 2, c.store_op_us = 500, c.comm_init_ms = 100;
    return c;
}

static void test_cap(void) {
    plan_model m = {.layers = 16, .dim = 1024, .heads = 16, .vocab = 50257, .seq = 1024};
    plan_features f = {.pp_overlap = 1, .dp_overlap = 1, .fused = 1};
    plan_cluster c = cluster();
    plan_result r;
    /* 3,200,000 micro-batches on 8 stages (a batch in tokens): refused at once, naming it */
    plan_layout big = {.gpus = 64, .tp = 8, .pp = 8, .vpp = 1, .batch = 3200000, .micro = 1};
    clock_t t0 = clock();
    T_EQ_INT(plan_check(&m, &big), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "3200000 micro-batches");
    T_STR_CONTAINS(ms_errmsg(), "--batch 3200000");
    T_STR_CONTAINS(ms_errmsg(), "dp 1");
    T_STR_CONTAINS(ms_errmsg(), "--micro-batch 1");
    T_STR_CONTAINS(ms_errmsg(), "at most 65536");
    T_EQ_INT(plan_predict(&m, &big, &f, &c, &r), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "--batch 3200000");
    /* interleaved: the limit counts the chunks */
    plan_layout il = {.gpus = 1024, .tp = 8, .pp = 2, .vpp = 2, .batch = 1 << 30, .micro = 1};
    T_EQ_INT(plan_check(&m, &il), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "16777216 micro-batches");
    T_STR_CONTAINS(ms_errmsg(), "dp 64");
    T_STR_CONTAINS(ms_errmsg(), "at most 131072");
    T_OK((double)(clock() - t0) / CLOCKS_PER_SEC < 1);
    /* one micro-batch more per stage than the limit allows, and the limit itself */
    plan_layout over = {.gpus = 16, .tp = 8, .pp = 2, .vpp = 2, .batch = 131074, .micro = 1};
    T_EQ_INT(plan_check(&m, &over), MS_ERR_ARG);
    plan_layout at = over;
    at.batch = PLAN_MAX_PIPE_PAIRS / 4;
    T_EQ_INT(plan_check(&m, &at), MS_OK);
    T_EQ_INT(plan_predict(&m, &at, &f, &c, &r), MS_OK);
    T_EQ_INT(r.n_micro, PLAN_MAX_PIPE_PAIRS / 4);
    T_EQ_INT(r.in_flight, plan_stage_sets(2, 2, r.n_micro, 0));
    T_OK(r.iter_s > 0 && r.bubble_s >= 0 && r.bubble_fraction < 0.01);
    /* no pipeline: nothing to simulate, any batch */
    plan_layout flat = {.gpus = 8, .tp = 8, .pp = 1, .vpp = 1, .batch = 3200000, .micro = 1};
    T_EQ_INT(plan_predict(&m, &flat, &f, &c, &r), MS_OK);
    T_EQ_INT(r.n_micro, 3200000);
    /* the layouts refused for the cap alone, and no other */
    T_EQ_INT(plan_over_cap(&m, &big), 1);
    T_EQ_INT(plan_over_cap(&m, &il), 1);
    T_EQ_INT(plan_over_cap(&m, &over), 1);
    T_EQ_INT(plan_over_cap(&m, &at), 0);
    T_EQ_INT(plan_over_cap(&m, &flat), 0);
    plan_layout bad = big;
    bad.tp = 3; /* does not divide the heads */
    T_EQ_INT(plan_over_cap(&m, &bad), 0);
    bad = il, bad.batch = 64 * 262145; /* interleaved: 262145 micro-batches, not a multiple of pp */
    T_EQ_INT(plan_over_cap(&m, &bad), 0);
}

/* --search with a batch that puts every pipeline over the cap: the ranking has the layouts
 * without a pipeline and counts the others (it left them out silently), and with --pp fixed
 * it has none and says why (the CLI blamed --batch for not dividing). */
static void test_search_cap(void) {
    plan_model m = {.layers = 16, .dim = 1024, .heads = 16, .vocab = 50257, .seq = 1024};
    plan_features f = {.pp_overlap = 1, .dp_overlap = 1, .fused = 1};
    plan_cluster c = cluster();
    plan_candidate best[64], small;
    plan_search_tally t;
    plan_layout base = {.gpus = 8, .batch = 1 << 24};
    T_EQ_INT(plan_search(&m, &base, &f, &c, 4, 8, best, 64, &t, &small), MS_OK);
    T_OK(t.n > 0 && t.over_cap > 0);
    for (int i = 0; i < t.n; i++)
        T_EQ_INT(best[i].layout.pp, 1);
    int flat = t.tried;
    base.pp = 2;
    T_EQ_INT(plan_search(&m, &base, &f, &c, 4, 8, best, 64, &t, &small), MS_OK);
    T_EQ_INT(t.n, 0);
    T_EQ_INT(t.tried, 0);
    T_OK(t.over_cap > 0);
    /* a batch in sequences: nothing over the cap, the pipelines ranked */
    base.pp = 0, base.batch = 64;
    T_EQ_INT(plan_search(&m, &base, &f, &c, 4, 8, best, 64, &t, &small), MS_OK);
    T_EQ_INT(t.over_cap, 0);
    T_EQ_INT(t.refused, 0);
    T_OK(t.tried > flat);
}

/* --search on one node tries every tp dividing --heads and --gpus (6 GPUs: tp 3 and 6), across
 * nodes only the node's divisors; a search whose batch-valid layouts are all refused for another
 * reason counts them and keeps the first reason (the CLI blamed --batch). */
static void test_search_tp_refused(void) {
    plan_model m = {.layers = 12, .dim = 768, .heads = 12, .vocab = 50257, .seq = 1020};
    plan_features f = {.pp_overlap = 1, .dp_overlap = 1, .fused = 1};
    plan_cluster c = cluster();
    plan_candidate best[256], small;
    plan_search_tally t;
    plan_layout base = {.gpus = 6, .batch = 12};
    T_EQ_INT(plan_search(&m, &base, &f, &c, 2, 4, best, 256, &t, &small), MS_OK);
    int tp3 = 0, tp6 = 0;
    for (int i = 0; i < t.n; i++)
        tp3 |= best[i].layout.tp == 3, tp6 |= best[i].layout.tp == 6;
    T_OK(tp3 && tp6);
    base.gpus = 24, base.batch = 48; /* three nodes of 8: tp 3 and 6 would straddle hosts */
    T_EQ_INT(plan_search(&m, &base, &f, &c, 2, 4, best, 256, &t, &small), MS_OK);
    T_OK(t.n > 0);
    for (int i = 0; i < t.n; i++)
        T_OK(c.gpus_per_node % best[i].layout.tp == 0);
    /* one layer, 1001 rows: tp 1 needs a batch of 2, tp 2 cannot split the rows */
    plan_model odd = {.layers = 1, .dim = 1024, .heads = 16, .vocab = 50257, .seq = 1001};
    plan_layout one = {.gpus = 2, .batch = 1};
    T_EQ_INT(plan_search(&odd, &one, &f, &c, 2, 4, best, 256, &t, &small), MS_OK);
    T_EQ_INT(t.tried, 0);
    T_OK(t.refused > 0);
    T_OK(strstr(t.refused_why, "sequence parallelism") != NULL);
    odd.heads = 1, one.batch = 3; /* tp 1 only, dp 2: nothing refused, the batch is to blame */
    T_EQ_INT(plan_search(&odd, &one, &f, &c, 2, 4, best, 256, &t, &small), MS_OK);
    T_EQ_INT(t.tried + t.refused, 0);
}

static void test_tp_node(void) {
    plan_model m = {.layers = 16, .dim = 1024, .heads = 16, .vocab = 50257, .seq = 1024};
    plan_features f = {0};
    plan_cluster c = cluster();
    plan_result r;
    plan_layout l = {.gpus = 32, .tp = 16, .pp = 2, .vpp = 1, .batch = 32, .micro = 1};
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &r), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "--tp 16");
    T_STR_CONTAINS(ms_errmsg(), "8 GPUs a node of test");
    c.gpus_per_node = 16;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &r), MS_OK);
    l.tp = 8, c.gpus_per_node = 8;
    T_EQ_INT(plan_predict(&m, &l, &f, &c, &r), MS_OK);
}

static void test_cluster_ranges(void) {
    plan_cluster c = cluster();
    T_EQ_INT(plan_cluster_check(&c, "a.json"), MS_OK);
    c.reserved_gb = 80;
    T_EQ_INT(plan_cluster_check(&c, "a.json"), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "a.json: \"reserved_gb\" is 80, not below \"mem_gb\" 80");
    c.reserved_gb = 90;
    T_EQ_INT(plan_cluster_check(&c, "a.json"), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "reserved_gb");
    c = cluster();
    for (int i = 0; i < 4; i++) {
        double bad[] = {1, 3, 2.5, 8};
        c.act_bytes = bad[i];
        T_EQ_INT(plan_cluster_check(&c, "b.json"), MS_ERR_FORMAT);
        T_STR_CONTAINS(ms_errmsg(), "b.json: \"act_bytes\"");
        T_STR_CONTAINS(ms_errmsg(), "2 (bf16) or 4 (fp32)");
    }
    c.act_bytes = 4;
    T_EQ_INT(plan_cluster_check(&c, "b.json"), MS_OK);
}

int main(void) {
    test_sets();
    test_cap();
    test_search_cap();
    test_search_tp_refused();
    test_tp_node();
    test_cluster_ranges();
    return ms_test_summary("test_plan_pipe");
}
