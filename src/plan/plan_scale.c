/* plan_scale.c - costs of running at scale that are not in the step:
 * communication group initialisation, checkpoint stall and restore, and
 * the effective training time ratio with failures (Young/Daly). */
#include <limits.h>
#include <math.h>

#include "plan/plan.h"

/* Groups of a Megatron-style layout: TP, PP, DP, model-parallel (TP x PP)
 * and embedding (first + last stage) groups, one set each. */
static int layout_groups(int ranks, int tp, int pp) {
    int dp = ranks / (tp * pp);
    if (dp < 1) dp = 1;
    return ranks / tp + ranks / pp + ranks / dp + ranks / (tp * pp) + (pp > 1 ? ranks / pp : 0);
}

plan_init_cost plan_init_time(const plan_cluster *c, int ranks, int tp, int pp) {
    plan_init_cost r = {.ranks = ranks, .groups = layout_groups(ranks, tp, pp)};
    double a = c->inter.lat_us * 1e-6, lg = ceil(log2(ranks > 1 ? ranks : 2));
    double store = c->store_op_us * 1e-6, init = c->comm_init_ms * 1e-3;
    /* ours (comm/grid.h): per dimension one split (an all-gather of (color, key) pairs, log n
     * rounds) and one small all-reduce; each rank then initialises its own 3 communicators,
     * all ranks in parallel; one barrier through the store at the end */
    r.ours_s = 3 * (2 * lg * a + (ranks * 8.0) / (c->inter.gbps * 1e9 * c->inter.eff)) + 3 * init +
               ranks * store;
    /* a barrier through the single-threaded store after every group: n store operations each
     * (every rank checks in), and every rank takes part in creating every group */
    r.barrier_s = r.groups * (ranks * store + init);
    return r;
}

int plan_init_scales(int tp, int pp, int *ranks) {
    long long q = (long long)tp * pp;
    int n = 0;
    for (long long want = 1024; want <= 16384; want *= 2) {
        long long k = (want + q / 2) / q; /* the nearest multiple (a tie: the larger) */
        long long r = (k < 1 ? 1 : k) * q;
        if (r > INT_MAX) r = INT_MAX / q * q;
        if (n == 0 || r > ranks[n - 1]) ranks[n++] = (int)r;
    }
    return n;
}

plan_ckpt_cost plan_ckpt_time(const plan_model *m, const plan_layout *l, const plan_cluster *c) {
    plan_ckpt_cost r;
    int t = l->tp, p = l->pp, d = l->gpus / (l->tp * l->pp);
    double lp, emb;
    plan_params(m, &lp, &emb);
    double n = ((double)m->layers / p * lp + emb) / t;
    /* a rank snapshots fp32 weights of its model shard and its ZeRO shard of m and v; the
     * weights are the same on all dp ranks, so each saves 1/d of them (load-balanced) */
    double bytes = n * 4.0 / d + n * 8.0 / d;
    r.state_gb_per_gpu = bytes / 1e9;
    r.stall_s = bytes / (c->pcie_gbps * 1e9);
    int per_node = c->gpus_per_node < l->gpus ? c->gpus_per_node : l->gpus;
    r.persist_s = bytes * per_node / (c->storage_gbps * 1e9);
    /* restore: every rank needs its weights (n * 4) and its optimizer shard; one reader per
     * dp group reads the weights and broadcasts them over DP (a ring: ~ the bytes once more) */
    double shard = n * 8.0 / d, weights = n * 4.0;
    double bcast = plan_coll_s(plan_link_of(c, d, t, l->gpus), PLAN_ALLGATHER, d, weights);
    r.restore_s = (weights / d + shard) * per_node / (c->storage_gbps * 1e9) + bcast;
    r.restore_all_s = (weights + shard) * per_node / (c->storage_gbps * 1e9);
    return r;
}

double plan_ettr(double mtbf_node_h, int nodes, double interval_s, double stall_s,
                 double restart_s) {
    double mtbf = mtbf_node_h * 3600 / (nodes > 0 ? nodes : 1);
    double e = (1 - stall_s / (interval_s + stall_s)) * (1 - (restart_s + interval_s / 2) / mtbf);
    return e > 0 ? e : 0;
}

double plan_ckpt_interval_opt(double mtbf_node_h, int nodes, double stall_s) {
    double mtbf = mtbf_node_h * 3600 / (nodes > 0 ? nodes : 1);
    return sqrt(2 * stall_s * mtbf);
}

double plan_ckpt_stall(const plan_ckpt_cost *c, double interval_s) {
    /* steady state with stage 2 the bottleneck: one checkpoint per persist, so interval +
     * wait + stage 1 = persist */
    return fmax(c->stall_s, c->persist_s - interval_s);
}

double plan_ckpt_interval_best(const plan_ckpt_cost *c, double mtbf_node_h, int nodes) {
    /* below persist - stall the ETTR is interval / persist x (1 - ...): rising with it */
    return fmax(plan_ckpt_interval_opt(mtbf_node_h, nodes, c->stall_s), c->persist_s - c->stall_s);
}
