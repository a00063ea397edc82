/* plan_cost.c - the planner's elementary cost models: GEMMs by shape,
 * element-wise operators by bytes, collectives by ring / tree per link
 * class (see plan.h). */
#include <math.h>

#include "plan/plan.h"

double plan_gemm_eff(const plan_cluster *c, double M, double N, double K) {
    double n = cbrt(M * N * K);
    if (c->n_gemm < 1) return 1;
    if (n <= c->gemm_n[0]) return c->gemm_eff[0] * fmax(n, 1) / c->gemm_n[0];
    for (int i = 1; i < c->n_gemm; i++)
        if (n <= c->gemm_n[i]) {
            double a = log(c->gemm_n[i - 1]), b = log(c->gemm_n[i]), x = log(n);
            return c->gemm_eff[i - 1] + (c->gemm_eff[i] - c->gemm_eff[i - 1]) * (x - a) / (b - a);
        }
    return c->gemm_eff[c->n_gemm - 1];
}

double plan_gemm_s(const plan_cluster *c, double M, double N, double K) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    double eff = plan_gemm_eff(c, M, N, K);
    double compute = 2 * M * N * K / (c->peak_flops * eff);
    double memory = (M * K + K * N + M * N) * c->act_bytes / (c->hbm_gbps * 1e9 * c->hbm_eff * eff);
    return fmax(compute, memory) + c->launch_us * 1e-6;
}

double plan_bytes_s(const plan_cluster *c, double bytes) {
    return bytes / (c->hbm_gbps * 1e9 * c->hbm_eff) + c->launch_us * 1e-6;
}

double plan_coll_s(const plan_link *l, plan_coll kind, int ranks, double bytes) {
    if (ranks <= 1 && kind != PLAN_P2P) return 0;
    double bw = l->gbps * 1e9 * l->eff, a = l->lat_us * 1e-6, n = ranks;
    switch (kind) {
    case PLAN_P2P:
        return a + bytes / bw;
    case PLAN_REDUCE_SCATTER:
    case PLAN_ALLGATHER:
        return (n - 1) * a + (n - 1) / n * bytes / bw;
    case PLAN_ALLREDUCE: {
        double ring = 2 * (n - 1) * a + 2 * (n - 1) / n * bytes / bw;
        double tree = 2 * ceil(log2(n)) * a + 2 * bytes / bw;
        return fmin(ring, tree);
    }
    }
    return 0;
}

const plan_link *plan_link_of(const plan_cluster *c, int ranks, int stride, int world) {
    long long block = (long long)ranks * stride, node = c->gpus_per_node;
    if (world <= node || ranks <= 1) return &c->intra;
    return block <= node && node % block == 0 ? &c->intra : &c->inter;
}
