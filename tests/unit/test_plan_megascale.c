/* test_plan_megascale.c - the planner against MegaScale's published runs
 * (NSDI'24, Table 2 and the Table 3 ablation), with the one shipped A100
 * cluster file (data/clusters/a100-megascale.json) and no per-row
 * constants: prints every row's predicted and published MFU and checks the
 * mean and worst error (targets: mean <= 3, worst <= 5 MFU points on
 * Table 2; ablation: worst <= 5).  Usage: test_plan_megascale CLUSTER.json */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "plan/plan.h"

static const plan_model gpt175 = {
    .layers = 96, .dim = 12288, .heads = 128, .vocab = 64000, .seq = 2048};

/* Megatron-LM as MegaScale ran it: serial block, full attention, blocking
 * TP / PP / DP communication, unfused operators, data on the step, AdamW,
 * selective recomputation. */
static plan_features megatron(void) {
    return (plan_features){.recompute = PLAN_RECOMPUTE_SELECTIVE};
}

/* The ablation's cumulative steps (Table 3), 0: Megatron ... 8: + LAMB. */
static void ablation_step(int k, plan_model *m, plan_features *f) {
    *m = gpt175;
    *f = megatron();
    if (k >= 1) m->parallel_block = 1;
    if (k >= 2) m->window = 512;
    if (k >= 3) f->tp_overlap = 1;
    if (k >= 4) f->pp_overlap = 1;
    if (k >= 5) f->dp_overlap = 1;
    if (k >= 6) f->fused = 1;
    if (k >= 7) f->async_data = 1;
    if (k >= 8) f->lamb = 1;
}

typedef struct {
    const char *system;
    int batch, gpus;
    double iter_s, mfu; /* published */
} row;

static const row table2[] = {
    {"Megatron-LM", 768, 256, 40.0, 53.0},    {"Megatron-LM", 768, 512, 21.2, 49.9},
    {"Megatron-LM", 768, 768, 15.2, 46.7},    {"Megatron-LM", 768, 1024, 11.9, 44.7},
    {"Megatron-LM", 6144, 3072, 29.02, 48.7}, {"Megatron-LM", 6144, 6144, 14.78, 47.8},
    {"Megatron-LM", 6144, 8192, 12.24, 43.3}, {"Megatron-LM", 6144, 12288, 8.57, 41.2},
    {"MegaScale", 768, 256, 32.0, 65.3},      {"MegaScale", 6144, 12288, 6.34, 55.2},
};

static double predict(const plan_cluster *c, const plan_model *m, const plan_features *f, int gpus,
                      int batch, plan_result *r) {
    plan_layout l = {.gpus = gpus, .tp = 8, .pp = 8, .vpp = 6, .batch = batch, .micro = 1};
    ms_status st = plan_predict(m, &l, f, c, r);
    if (st != MS_OK) {
        fprintf(stderr, "FAIL: plan_predict: %s\n", ms_errmsg());
        T_OK(0);
        return 0;
    }
    return 100 * r->mfu;
}

static void print_parts(const plan_result *r) {
    printf("   compute %.2f tp %.2f pp %.2f bubble %.2f dp %.2f opt %.3f data %.2f | mem %.1f GB\n",
           r->compute_s, r->tp_s, r->pp_s, r->bubble_s, r->dp_s, r->optimizer_s, r->data_s,
           r->memory_gb);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_plan_megascale CLUSTER.json\n");
        return 2;
    }
    plan_cluster c;
    if (plan_cluster_load(argv[1], &c) != MS_OK) {
        fprintf(stderr, "FAIL: %s\n", ms_errmsg());
        return 1;
    }
    int verbose = argc > 2 && !strcmp(argv[2], "-v");
    double sum = 0, worst = 0;
    int n = (int)(sizeof table2 / sizeof table2[0]);
    printf("MegaScale Table 2 (175B, tp 8, pp 8, vpp 6, micro-batch 1)\n");
    printf("%-12s %6s %6s | %9s %9s | %7s %7s | %6s\n", "system", "batch", "GPUs", "iter pub",
           "iter pred", "MFU pub", "pred", "error");
    for (int i = 0; i < n; i++) {
        const row *w = &table2[i];
        plan_model m;
        plan_features f;
        ablation_step(strcmp(w->system, "MegaScale") ? 0 : 8, &m, &f);
        plan_result r;
        double mfu = predict(&c, &m, &f, w->gpus, w->batch, &r);
        double e = mfu - w->mfu;
        sum += fabs(e);
        if (fabs(e) > worst) worst = fabs(e);
        printf("%-12s %6d %6d | %9.2f %9.2f | %6.1f%% %6.1f%% | %+6.1f\n", w->system, w->batch,
               w->gpus, w->iter_s, r.iter_s, w->mfu, mfu, e);
        if (verbose) print_parts(&r);
        T_OK(r.fits);
    }
    double mean = sum / n;
    printf("Table 2: mean error %.2f, worst %.2f MFU points (targets 3 and 5)\n", mean, worst);
    T_OK(mean <= 3.0);
    T_OK(worst <= 5.0);

    static const char *steps[] = {"Megatron-LM",     "+ parallel block", "+ sliding window",
                                  "+ TP overlap",    "+ PP overlap",     "+ DP overlap",
                                  "+ efficient ops", "+ data pipeline",  "+ LAMB (batch x3)"};
    static const double pub[] = {47.7, 52.3, 53.3, 55.5, 58.0, 59.5, 61.2, 62.3, 65.3};
    double asum = 0, aworst = 0, prev = 0;
    printf("\nMegaScale Table 3 ablation (256 GPUs, batch 256; LAMB: batch 768)\n");
    for (int k = 0; k < 9; k++) {
        plan_model m;
        plan_features f;
        ablation_step(k, &m, &f);
        plan_result r;
        double mfu = predict(&c, &m, &f, 256, k == 8 ? 768 : 256, &r);
        double e = mfu - pub[k];
        asum += fabs(e);
        if (fabs(e) > aworst) aworst = fabs(e);
        printf("%-18s pub %5.1f%%  pred %5.1f%%  (step %+5.1f, pub %+5.1f)  error %+5.1f\n",
               steps[k], pub[k], mfu, k ? mfu - prev : 0, k ? pub[k] - pub[k - 1] : 0, e);
        if (verbose) print_parts(&r);
        if (k) T_OK(mfu >= prev - 0.05); /* every step of the ablation helps, or costs nothing */
        prev = mfu;
    }
    printf("Table 3: mean error %.2f, worst %.2f MFU points\n", asum / 9, aworst);
    T_OK(aworst <= 5.0);
    return ms_test_summary("test_plan_megascale");
}
