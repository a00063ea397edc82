/* test_comm_grid.c - the rank grid (src/comm/grid.c) on N ranks: for every
 * ordered factorisation N = tp*pp*dp (under mpirun with N = 1, 2, 4, 8 this
 * covers every layout in {1,2}^3), the coordinates, the three groups
 * (sizes, ranks, members) and the pipeline neighbours are checked against
 * rank = pp*(DP*TP) + dp*TP + tp, and an all-reduce in each group checks
 * that the groups really connect those members.  Also: the pure helpers on
 * larger shapes, placement host by host (comm_grid_place), and the errors
 * for a world that is not tp*pp*dp. */
#include <stdio.h>
#include <stdlib.h>

#include "base/ctx.h"
#include "check.h"
#include "comm/comm.h"
#include "comm/env_options.h"
#include "comm/grid.h"

static int R, N;

/* Members of the group along dim through coordinate c, checked in order. */
static void check_group(const comm_grid *grid, comm_grid_dim dim, comm_grid_shape s,
                        comm_grid_coord c) {
    comm_group *g = comm_grid_group(grid, dim);
    int n = dim == COMM_DIM_TP ? s.tp : dim == COMM_DIM_DP ? s.dp : s.pp;
    int mine = dim == COMM_DIM_TP ? c.tp : dim == COMM_DIM_DP ? c.dp : c.pp;
    static const char *names[] = {"tp", "dp", "pp"};
    T_STR_CONTAINS(comm_group_name(g), names[dim]);
    T_EQ_INT(comm_group_size(g), n);
    T_EQ_INT(comm_grid_dim_size(grid, dim), n);
    T_EQ_INT(comm_group_rank(g), mine);
    long long want = 0;
    for (int i = 0; i < n; i++) {
        comm_grid_coord m = c;
        *(dim == COMM_DIM_TP ? &m.tp : dim == COMM_DIM_DP ? &m.dp : &m.pp) = i;
        int gr = m.pp * (s.dp * s.tp) + m.dp * s.tp + m.tp;
        T_EQ_INT(comm_group_global_rank(g, i), gr);
        want += gr * 1000 + 1;
    }
    long long v = R * 1000 + 1, sum = 0;
    T_EQ_INT(comm_allreduce(g, &v, &sum, 1, COMM_I64, COMM_SUM), MS_OK);
    T_EQ_INT(sum, want);
}

static void check_layout(comm_world *w, int tp, int pp, int dp) {
    comm_grid *grid = NULL;
    ms_status st = comm_grid_create(w, tp, pp, dp, &grid);
    T_EQ_INT(st, MS_OK);
    if (st != MS_OK) {
        fprintf(stderr, "grid tp%d pp%d dp%d: %s\n", tp, pp, dp, ms_errmsg());
        return;
    }
    comm_grid_shape s = comm_grid_shape_of(grid);
    comm_grid_coord c = comm_grid_coord_of(grid);
    T_EQ_INT(s.tp, tp);
    T_EQ_INT(s.pp, pp);
    T_EQ_INT(s.dp, dp);
    T_EQ_INT(c.pp * (dp * tp) + c.dp * tp + c.tp, R);
    T_OK(c.tp >= 0 && c.tp < tp && c.dp >= 0 && c.dp < dp && c.pp >= 0 && c.pp < pp);
    T_EQ_INT(comm_grid_rank_of(grid, c.tp, c.dp, c.pp), R);
    for (int d = 0; d < 3; d++)
        check_group(grid, (comm_grid_dim)d, s, c);
    int next = c.pp + 1 < pp ? (c.pp + 1) * dp * tp + c.dp * tp + c.tp : -1;
    int prev = c.pp > 0 ? (c.pp - 1) * dp * tp + c.dp * tp + c.tp : -1;
    T_EQ_INT(comm_grid_next_stage(grid), next);
    T_EQ_INT(comm_grid_prev_stage(grid), prev);
    T_EQ_INT(comm_grid_stage_rank(grid, 0), c.dp * tp + c.tp);
    /* TP neighbours are adjacent world ranks */
    if (tp > 1 && c.tp + 1 < tp) T_EQ_INT(comm_grid_rank_of(grid, c.tp + 1, c.dp, c.pp), R + 1);
    comm_grid_destroy(grid);
}

/* The pure rank <-> coordinate helpers on shapes larger than the world. */
static void test_formula(void) {
    comm_grid_shape shapes[] = {{4, 3, 2}, {8, 1, 16}, {1, 5, 3}, {2, 2, 2}};
    for (int k = 0; k < 4; k++) {
        comm_grid_shape s = shapes[k];
        int n = s.tp * s.pp * s.dp, bad = 0;
        for (int r = 0; r < n; r++) {
            comm_grid_coord c = comm_grid_coord_at(s, r);
            bad += c.pp * (s.dp * s.tp) + c.dp * s.tp + c.tp != r;
            bad += comm_grid_rank_at(s, c) != r;
        }
        T_EQ_INT(bad, 0);
        T_EQ_INT(comm_grid_rank_at(s, (comm_grid_coord){.tp = s.tp, .pp = 0, .dp = 0}), -1);
    }
}

/* Placement host by host: round-robin numbering (--map-by node) gives each
 * host consecutive positions, so tp2 groups stay inside a host; rank 0
 * keeps position 0; numbering already host by host is the identity. */
static void test_place(void) {
    int rr[] = {0, 1, 0, 1}, rank_of[8]; /* 2 hosts, ranks dealt out in turn */
    T_EQ_INT(comm_grid_place(rr, 4, rank_of), 1);
    int want[] = {0, 2, 1, 3};
    for (int i = 0; i < 4; i++)
        T_EQ_INT(rank_of[i], want[i]);
    comm_grid_shape s = {.tp = 2, .pp = 1, .dp = 2};
    for (int q = 0; q < 2; q++) /* both members of tp group q on one host */
        T_EQ_INT(rr[rank_of[comm_grid_rank_at(s, (comm_grid_coord){.tp = 0, .dp = q})]],
                 rr[rank_of[comm_grid_rank_at(s, (comm_grid_coord){.tp = 1, .dp = q})]]);
    int blocks[] = {0, 0, 1, 1, 2, 2, 3, 3};
    T_EQ_INT(comm_grid_place(blocks, 8, rank_of), 0);
    for (int i = 0; i < 8; i++)
        T_EQ_INT(rank_of[i], i);
    int odd[] = {0, 1, 2, 1, 0, 2}; /* 3 hosts, uneven order */
    T_EQ_INT(comm_grid_place(odd, 6, rank_of), 1);
    int want3[] = {0, 4, 1, 3, 2, 5};
    for (int i = 0; i < 6; i++)
        T_EQ_INT(rank_of[i], want3[i]);
}

static void test_errors(comm_world *w) {
    comm_grid *grid = (comm_grid *)1;
    T_EQ_INT(comm_grid_create(w, 3, 1, N + 1, &grid), MS_ERR_ARG);
    T_OK(grid == NULL);
    char want[64];
    snprintf(want, sizeof want, "world size %d != tp 3 x pp 1 x dp %d", N, N + 1);
    T_STR_CONTAINS(ms_errmsg(), want);
    T_EQ_INT(comm_grid_create(w, 0, N, 1, &grid), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "sizes must be >= 1");
    T_EQ_INT(comm_grid_create(w, N, 2, 1, &grid), MS_ERR_ARG);
}

int main(int argc, char **argv) {
    ms_ctx_init(); /* rank-aware log lines */
    comm_world *w = NULL;
    comm_options co = ms_test_comm_options(); /* MS_COMM_TIMEOUT, MS_COMM_NCCL_SYNC */
    if (comm_world_init(&w, &argc, &argv, &co) != MS_OK) {
        fprintf(stderr, "test_comm_grid: %s\n", ms_errmsg());
        return 1;
    }
    R = comm_world_rank(w), N = comm_world_size(w);
    test_formula();
    test_place();
    test_errors(w);
    int layouts = 0;
    for (int tp = 1; tp <= N; tp++)
        for (int pp = 1; pp <= N; pp++)
            for (int dp = 1; dp <= N; dp++) {
                if (tp * pp * dp != N) continue;
                check_layout(w, tp, pp, dp);
                layouts++;
            }
    if (R == 0) printf("test_comm_grid: %d ranks, %d layouts\n", N, layouts);
    T_EQ_INT(comm_world_finalize(w), MS_OK);
    char name[64];
    snprintf(name, sizeof name, "test_comm_grid r%d/%d", R, N);
    return ms_test_summary(name);
}
