/* train_dist.c - a job's ranks and its model, for the trainer and for
 * `megascale eval`: MPI and the rank grid (after the ranks agreed on their
 * options), the communicator's device hooks and NCCL groups, and the model
 * (whole, or this rank's pipeline stage with its schedule). */
#include <stdio.h>
#include <string.h>

#include "base/ctx.h"
#include "base/log.h"
#include "comm/comm.h"
#include "comm/grid.h"
#include "train/train_internal.h"

ms_status train_dist_open(const train_config *tc, const char *cmd, comm_world **world,
                          comm_grid **grid, int *dp, train_gate **gate) {
    *world = NULL;
    *grid = NULL;
    *gate = NULL;
    if (ms_ctx_get()->world == 1) return train_check_layout(tc, 1, dp);
    int tp = tc->tp > 0 ? tc->tp : 1, pp = tc->pp > 0 ? tc->pp : 1;
    comm_options co = comm_options_default();
    if (tc->comm_timeout > 0) co.timeout_s = tc->comm_timeout;
    co.nccl_sync = tc->comm_nccl_sync;
    MS_TRY(comm_world_init(world, NULL, NULL, &co));
    MS_TRY(train_gate_open(*world, cmd, MS_OK, gate)); /* before any other collective */
    int n = comm_world_size(*world);
    MS_TRY(train_agree(*world, tc->shared_json, train_dp_of(tc, n)));
    MS_TRY(train_check_layout(tc, n, dp));
    return comm_grid_create(*world, tp, pp, *dp, grid);
}

/* comm_device hooks over the backend's table. */
static int dev_is_device(void *be, const void *p) {
    return ((be_backend *)be)->is_device(be, p);
}
static void dev_to_host(void *be, void *dst, const void *src, size_t n) {
    ((be_backend *)be)->to_host(be, dst, src, n);
}
static void dev_to_device(void *be, void *dst, const void *src, size_t n) {
    ((be_backend *)be)->to_device(be, dst, src, n);
}
static void *dev_host_alloc(void *be, size_t n) {
    return ((be_backend *)be)->host_alloc(be, n);
}
static void dev_host_free(void *be, void *p) {
    ((be_backend *)be)->host_free(be, p);
}

ms_status train_dist_device(const train_config *tc, comm_world *world, comm_grid *grid,
                            be_backend *be) {
    const char *mode = tc->comm && *tc->comm ? tc->comm : "auto";
    if (strcmp(mode, "auto") && strcmp(mode, "nccl") && strcmp(mode, "mpi"))
        return ms_error(MS_ERR_ARG, "--comm %s: expected auto, nccl or mpi", mode);
    if (!be->stream && strcmp(mode, "auto") && (!world || comm_world_rank(world) == 0))
        ms_warn("--comm %s is for device buffers (--device cuda): the %s backend's host buffers "
                "go through MPI whatever it says",
                mode, be->name ? be->name : "cpu");
    if (!world || !be->stream) return MS_OK; /* one process, or host memory */
    comm_device dev = {be,           dev_is_device, dev_to_host, dev_to_device, dev_host_alloc,
                       dev_host_free};
    MS_TRY(comm_world_set_device(world, &dev));
    if (!strcmp(mode, "mpi")) {
        ms_info("comm: device buffers staged through pinned host memory (MPI), as --comm mpi asks");
        return MS_OK;
    }
    static const comm_grid_dim dims[] = {COMM_DIM_TP, COMM_DIM_DP, COMM_DIM_PP};
    static const char *names[] = {"tp", "dp", "pp"};
    for (int i = 0; i < 3; i++) {
        comm_group *g = comm_grid_group(grid, dims[i]);
        if (!g || comm_group_size(g) < 2) continue;
        ms_status st = comm_group_enable_nccl(g, be->stream);
        if (st == MS_OK) {
            ms_info("comm: %s group (%d ranks) on NCCL", names[i], comm_group_size(g));
        } else if (!strcmp(mode, "nccl") || st == MS_ERR_TIMEOUT) {
            return ms_error_wrap(st, "--comm %s: %s group", mode, names[i]);
        } else {
            ms_info("comm: %s group: device buffers staged through pinned host memory (MPI): %s",
                    names[i], ms_errmsg());
        }
    }
    return MS_OK;
}

ms_status train_model_create(const train_config *tc, const gpt_config *mc, be_backend *be,
                             comm_world *world, comm_grid *grid, int micro, int n_micro,
                             size_t align, gpt_model **m, train_pipe **pipe) {
    *m = NULL;
    *pipe = NULL;
    int pp = tc->pp > 0 ? tc->pp : 1;
    comm_group *tpg = grid && tc->tp > 1 ? comm_grid_group(grid, COMM_DIM_TP) : NULL;
    if (pp == 1) return gpt_create_tp(m, mc, be, micro, tc->seq, align, tpg);
    int vpp = tc->vpp > 0 ? tc->vpp : 1, stage = comm_grid_coord_of(grid).pp;
    gpt_stage st;
    MS_TRY(gpt_stage_init(&st, mc, pp, vpp, stage, 1)); /* layers divide? */
    MS_TRY(train_pipe_plan(pipe, grid, world, vpp, n_micro));
    MS_TRY(gpt_stage_init(&st, mc, pp, vpp, stage, train_pipe_slots(*pipe)));
    MS_TRY(gpt_create_stage(m, mc, be, micro, tc->seq, align, tpg, &st));
    return train_pipe_attach(*pipe, *m, micro, tc->seq);
}

/* Rank 0: the layout line naming each rank's host and grid coordinate
 * (the first 64 ranks), and a warning when tensor-parallel groups span
 * hosts (tp does not divide the ranks of a host). */
void train_dist_log_hosts(comm_world *w, const comm_grid *g) {
    if (!w || !g || comm_world_rank(w) != 0) return;
    int n = comm_world_size(w), nh = comm_world_n_hosts(w);
    char line[4096];
    size_t len = 0;
    for (int r = 0; r < n && r < 64 && len < sizeof line; r++) {
        comm_grid_coord c = comm_grid_coord_of_rank(g, r);
        len += (size_t)snprintf(line + len, sizeof line - len, "%sr%d %s (tp%d dp%d pp%d)",
                                r ? ", " : "", r, comm_world_host(w, r), c.tp, c.dp, c.pp);
    }
    if (n > 64 && len < sizeof line) snprintf(line + len, sizeof line - len, ", ...");
    ms_info("hosts: %d rank(s) on %d host(s)%s: %s", n, nh,
            comm_grid_placed(g) ? " (mpirun did not number them host by host: the grid is "
                                  "placed host by host)"
                                : "",
            line);
    comm_grid_shape s = comm_grid_shape_of(g);
    int spanning = 0, groups = s.dp * s.pp, first = -1;
    for (int q = 0; q < groups && s.tp > 1; q++) {
        int h0 = comm_world_host_index(w, comm_grid_rank_of(g, 0, q % s.dp, q / s.dp));
        for (int t = 1; t < s.tp; t++)
            if (comm_world_host_index(w, comm_grid_rank_of(g, t, q % s.dp, q / s.dp)) != h0) {
                if (first < 0) first = comm_grid_rank_of(g, 0, q % s.dp, q / s.dp);
                spanning++;
                break;
            }
    }
    if (spanning)
        ms_warn("hosts: %d of %d tensor-parallel group(s) span hosts (the first: the group of "
                "rank %d on %s): their all-reduces in every layer cross the network; give each "
                "host a multiple of --tp %d ranks",
                spanning, groups, first, comm_world_host(w, first), s.tp);
}
