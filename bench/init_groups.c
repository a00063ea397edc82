/* init_groups.c - time to create the rank grid's groups (comm_grid_create:
 * one split per dimension) on the current world, against two peers measured
 * in the same run: one world barrier (the unit of a collective round), and
 * the naive scheme that creates every group by its own world-wide
 * collective (as torch.distributed.new_group must be called by all ranks
 * for each group: O(number of groups) collectives).  MPI start-up is not
 * measured.  Run by bench/init_groups.sh under mpirun:
 *   bench_init_groups TP PP DP [REPS] [naive]
 * Rank 0 prints one table row: ranks, layout, best-of-REPS slowest-rank
 * milliseconds for the grid, the barrier and (with "naive") the naive
 * scheme, and the ratio naive / grid. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "comm/comm.h"
#include "comm/env_options.h"
#include "comm/grid.h"

/* Slowest rank's time for the section that ended now and began at t0. */
static double slowest(comm_group *world, double t0) {
    double t = ms_now() - t0;
    if (comm_allreduce(world, &t, &t, 1, COMM_F64, COMM_MAX) != MS_OK) {
        fprintf(stderr, "init_groups: %s\n", ms_errmsg());
        exit(1);
    }
    return t;
}

/* Every group of the grid created by its own world-wide split (members pass
 * the group's color, everyone else -1), then destroyed. */
static ms_status naive_groups(comm_world *w, comm_grid_shape s) {
    comm_group *world = comm_world_group(w);
    comm_grid_coord c = comm_grid_coord_at(s, comm_world_rank(w));
    int ngroups[3] = {s.pp * s.dp, s.pp * s.tp, s.dp * s.tp};
    int mine[3] = {c.pp * s.dp + c.dp, c.pp * s.tp + c.tp, c.dp * s.tp + c.tp};
    int key[3] = {c.tp, c.dp, c.pp};
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < ngroups[d]; k++) {
            comm_group *g = NULL;
            MS_TRY(comm_group_create_split(world, k == mine[d] ? 0 : -1, key[d], "naive", &g));
            comm_group_destroy(g);
        }
    return MS_OK;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_init_groups TP PP DP [REPS] [naive]\n");
        return 2;
    }
    int tp = atoi(argv[1]), pp = atoi(argv[2]), dp = atoi(argv[3]);
    int reps = argc > 4 ? atoi(argv[4]) : 3, naive = argc > 5 && !strcmp(argv[5], "naive");
    comm_world *w = NULL;
    comm_options co = ms_test_comm_options(); /* MS_COMM_TIMEOUT, MS_COMM_NCCL_SYNC */
    if (comm_world_init(&w, &argc, &argv, &co) != MS_OK) {
        fprintf(stderr, "init_groups: %s\n", ms_errmsg());
        return 1;
    }
    comm_group *world = comm_world_group(w);
    double best_grid = 1e30, best_bar = 1e30, best_naive = 1e30;
    ms_status st = comm_barrier(world);
    for (int r = 0; r < reps && st == MS_OK; r++) {
        comm_grid *grid = NULL;
        st = comm_barrier(world);
        double t0 = ms_now();
        if (st == MS_OK) st = comm_barrier(world);
        double tb = slowest(world, t0);
        if (st == MS_OK) st = comm_barrier(world);
        t0 = ms_now();
        if (st == MS_OK) st = comm_grid_create(w, tp, pp, dp, &grid);
        double tg = slowest(world, t0);
        comm_grid_destroy(grid);
        if (tb < best_bar) best_bar = tb;
        if (tg < best_grid) best_grid = tg;
        if (naive && st == MS_OK) {
            st = comm_barrier(world);
            t0 = ms_now();
            if (st == MS_OK) st = naive_groups(w, (comm_grid_shape){.tp = tp, .pp = pp, .dp = dp});
            double tn = slowest(world, t0);
            if (tn < best_naive) best_naive = tn;
        }
    }
    if (st != MS_OK) {
        fprintf(stderr, "init_groups: %s\n", ms_errmsg());
        comm_world_finalize(w);
        return 1;
    }
    if (comm_world_rank(w) == 0) {
        char layout[64], nv[32] = "-", ratio[32] = "-";
        snprintf(layout, sizeof layout, "tp%d pp%d dp%d", tp, pp, dp);
        if (naive) {
            snprintf(nv, sizeof nv, "%.2f", best_naive * 1e3);
            snprintf(ratio, sizeof ratio, "%.1fx", best_naive / best_grid);
        }
        printf("%6d  %-16s %8d %10.2f %10.3f %12.1f %10s %8s\n", comm_world_size(w), layout,
               tp * pp * dp / tp + tp * pp * dp / dp + tp * pp * dp / pp, best_grid * 1e3,
               best_bar * 1e3, best_grid / best_bar, nv, ratio);
    }
    st = comm_world_finalize(w);
    if (st != MS_OK) fprintf(stderr, "init_groups: %s\n", ms_errmsg());
    return st == MS_OK ? 0 : 1;
}
