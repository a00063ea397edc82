/* grid.h - the 3D rank grid: world = DP x PP x TP.
 *
 * TP is innermost (tensor-parallel peers are neighbouring positions, i.e.
 * on the same host), then DP, then PP outermost:
 *     position = pp * (DP * TP) + dp * TP + tp
 * Positions are given host by host (comm_world_host_index): the ranks of
 * the first host (the one of world rank 0) take the first positions in
 * world-rank order, then the next host's, and so on.  When mpirun numbers
 * ranks host by host (its default, --map-by slot) a rank's position is its
 * world rank; when it deals them out round-robin (--map-by node) the grid
 * still puts a tensor-parallel group inside one host whenever tp divides
 * the ranks of each host, then data-parallel peers, then pipeline stages.
 * World rank 0 is always position 0.
 * comm_grid_create() computes this rank's coordinates and creates its three
 * groups, named "tp", "dp" and "pp", in that order (DP before PP).  Each is
 * one MPI_Comm_split over the world (plus one small all-reduce inside the
 * new group for its arrival-board slot): 3 world collectives in all,
 * independent of the number of groups formed, so creation is O(1)
 * collectives (each O(log n) deep in MPI) rather than one per group.
 * Within each group, the group rank equals the coordinate along that
 * dimension (tp group rank == tp, dp group rank == dp, pp group rank == pp).
 *
 * Who calls it: the trainer and the parallel layers; bench/init_groups.
 * Memory: the grid owns its groups; comm_grid_destroy frees them.
 * Thread-safety: creation/destruction are collective calls like any group
 * op; the accessors are read-only and thread-safe.
 */
#ifndef MS_COMM_GRID_H
#define MS_COMM_GRID_H

#include "base/status.h"
#include "comm/comm.h"

typedef enum { COMM_DIM_TP = 0, COMM_DIM_DP, COMM_DIM_PP } comm_grid_dim;

/* Sizes of the three dimensions, or a position in the grid. */
typedef struct {
    int tp, pp, dp;
} comm_grid_shape;
typedef struct {
    int tp, pp, dp;
} comm_grid_coord;

typedef struct comm_grid comm_grid;

/* position = pp*(DP*TP) + dp*TP + tp; -1 if c is outside the shape.  (The
 * world rank at a position: comm_grid_rank_of.) */
int comm_grid_rank_at(comm_grid_shape s, comm_grid_coord c);
/* Inverse of comm_grid_rank_at (position must be in [0, tp*pp*dp)). */
comm_grid_coord comm_grid_coord_at(comm_grid_shape s, int rank);

/* The grid positions of n ranks whose hosts are host_of[r] (0.., numbered
 * in the order of their lowest rank, as comm_world_host_index does):
 * rank_of[pos] = the rank at position pos, host by host, each host's ranks
 * in rank order.  Returns 1 if that is not the identity.  Pure. */
int comm_grid_place(const int *host_of, int n, int *rank_of);

/* Collective over the world.  Errors: MS_ERR_ARG when a size is < 1 or the
 * world size is not tp*pp*dp (message gives both); group creation errors
 * (MS_ERR_TIMEOUT / MS_ERR_INTERNAL) naming the dimension. */
ms_status comm_grid_create(comm_world *w, int tp, int pp, int dp, comm_grid **out);
/* Destroy the three groups and the grid (local).  NULL is ignored. */
void comm_grid_destroy(comm_grid *g);

comm_grid_shape comm_grid_shape_of(const comm_grid *g);
comm_grid_coord comm_grid_coord_of(const comm_grid *g); /* this rank's position */
comm_group *comm_grid_group(const comm_grid *g, comm_grid_dim dim);
int comm_grid_dim_size(const comm_grid *g, comm_grid_dim dim);

/* Global rank of the (tp, dp, pp) coordinate; -1 if outside the grid. */
int comm_grid_rank_of(const comm_grid *g, int tp, int dp, int pp);
/* The coordinate of world rank `rank` (in [0, world)). */
comm_grid_coord comm_grid_coord_of_rank(const comm_grid *g, int rank);
/* 1 if the grid reordered the world ranks (they were not host by host). */
int comm_grid_placed(const comm_grid *g);
/* Global rank of pipeline stage `stage` in this rank's (tp, dp) column. */
int comm_grid_stage_rank(const comm_grid *g, int stage);
/* Global rank of the next / previous pipeline stage, -1 at the last / first
 * stage.  (In the pp group these are group ranks pp+1 / pp-1.) */
int comm_grid_next_stage(const comm_grid *g);
int comm_grid_prev_stage(const comm_grid *g);

#endif
