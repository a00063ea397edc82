/* grid.c - the 3D rank grid (see grid.h): grid positions host by host,
 * coordinates from the position formula, one split per dimension (TP,
 * then DP, then PP). */
#include "comm/grid.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm_internal.h"

struct comm_grid {
    comm_world *w;
    comm_grid_shape shape;
    comm_grid_coord me;
    comm_group *groups[3]; /* indexed by comm_grid_dim */
    int *rank_of;          /* [world]: the world rank at each grid position */
    int placed;            /* 1 if that is not the identity (ranks reordered by host) */
};

int comm_grid_rank_at(comm_grid_shape s, comm_grid_coord c) {
    if (c.tp < 0 || c.tp >= s.tp || c.dp < 0 || c.dp >= s.dp || c.pp < 0 || c.pp >= s.pp) return -1;
    return c.pp * (s.dp * s.tp) + c.dp * s.tp + c.tp;
}

comm_grid_coord comm_grid_coord_at(comm_grid_shape s, int rank) {
    MS_CHECK(rank >= 0 && rank < s.tp * s.pp * s.dp);
    comm_grid_coord c = {.tp = rank % s.tp, .dp = (rank / s.tp) % s.dp, .pp = rank / (s.tp * s.dp)};
    return c;
}

int comm_grid_place(const int *host_of, int n, int *rank_of) {
    int placed = 0, pos = 0;
    for (int h = 0; pos < n; h++) /* host by host, each host's ranks in order */
        for (int r = 0; r < n; r++)
            if (host_of[r] == h) {
                placed |= r != pos;
                rank_of[pos++] = r;
            }
    return placed;
}

/* One split along dim: members share the other two coordinates, ordered by
 * their coordinate along dim. */
static ms_status comm_grid_split(comm_grid *g, comm_grid_dim dim) {
    static const char *names[] = {"tp", "dp", "pp"};
    const comm_grid_shape s = g->shape;
    const comm_grid_coord c = g->me;
    int color, key;
    switch (dim) {
    case COMM_DIM_TP:
        color = c.pp * s.dp + c.dp, key = c.tp;
        break;
    case COMM_DIM_DP:
        color = c.pp * s.tp + c.tp, key = c.dp;
        break;
    default:
        color = c.dp * s.tp + c.tp, key = c.pp;
        break;
    }
    ms_status st =
        comm_group_create_split(comm_world_group(g->w), color, key, names[dim], &g->groups[dim]);
    if (st != MS_OK)
        return ms_error_wrap(st, "comm_grid_create (tp %d, pp %d, dp %d): creating the %s groups",
                             s.tp, s.pp, s.dp, names[dim]);
    return MS_OK;
}

ms_status comm_grid_create(comm_world *w, int tp, int pp, int dp, comm_grid **out) {
    *out = NULL;
    int ws = comm_world_size(w);
    if (tp < 1 || pp < 1 || dp < 1)
        return ms_error(MS_ERR_ARG, "comm_grid_create: sizes must be >= 1 (tp %d, pp %d, dp %d)",
                        tp, pp, dp);
    if ((long long)tp * pp * dp != ws)
        return ms_error(MS_ERR_ARG,
                        "comm_grid_create: world size %d != tp %d x pp %d x dp %d = %lld", ws, tp,
                        pp, dp, (long long)tp * pp * dp);
    comm_grid *g = calloc(1, sizeof *g);
    if (!g) return ms_error(MS_ERR_NOMEM, "comm_grid_create: out of memory");
    g->w = w;
    g->shape = (comm_grid_shape){.tp = tp, .pp = pp, .dp = dp};
    ms_status st = MS_OK;
    if (!(g->rank_of = malloc((size_t)ws * sizeof *g->rank_of))) {
        st = ms_error(MS_ERR_NOMEM, "comm_grid_create: out of memory");
        goto out;
    }
    int *host_of = malloc((size_t)ws * sizeof *host_of);
    if (!host_of) {
        st = ms_error(MS_ERR_NOMEM, "comm_grid_create: out of memory");
        goto out;
    }
    for (int r = 0; r < ws; r++)
        host_of[r] = comm_world_host_index(w, r);
    g->placed = comm_grid_place(host_of, ws, g->rank_of);
    free(host_of);
    int me = 0;
    while (g->rank_of[me] != comm_world_rank(w))
        me++;
    g->me = comm_grid_coord_at(g->shape, me);
    if ((st = comm_grid_split(g, COMM_DIM_TP)) != MS_OK) goto out;
    if ((st = comm_grid_split(g, COMM_DIM_DP)) != MS_OK) goto out;
    if ((st = comm_grid_split(g, COMM_DIM_PP)) != MS_OK) goto out;
    pthread_mutex_lock(&w->mu); /* for hang dumps (comm_dump.c) */
    w->has_coord = 1;
    w->coord[0] = g->me.dp, w->coord[1] = g->me.pp, w->coord[2] = g->me.tp;
    w->shape[0] = dp, w->shape[1] = pp, w->shape[2] = tp;
    pthread_mutex_unlock(&w->mu);
    *out = g;
out:
    if (st != MS_OK) comm_grid_destroy(g);
    return st;
}

void comm_grid_destroy(comm_grid *g) {
    if (!g) return;
    for (int d = 2; d >= 0; d--)
        comm_group_destroy(g->groups[d]);
    free(g->rank_of);
    free(g);
}

comm_grid_shape comm_grid_shape_of(const comm_grid *g) {
    return g->shape;
}

comm_grid_coord comm_grid_coord_of(const comm_grid *g) {
    return g->me;
}

comm_group *comm_grid_group(const comm_grid *g, comm_grid_dim dim) {
    MS_CHECK((unsigned)dim <= COMM_DIM_PP);
    return g->groups[dim];
}

int comm_grid_dim_size(const comm_grid *g, comm_grid_dim dim) {
    MS_CHECK((unsigned)dim <= COMM_DIM_PP);
    return dim == COMM_DIM_TP ? g->shape.tp : dim == COMM_DIM_DP ? g->shape.dp : g->shape.pp;
}

int comm_grid_rank_of(const comm_grid *g, int tp, int dp, int pp) {
    int pos = comm_grid_rank_at(g->shape, (comm_grid_coord){.tp = tp, .pp = pp, .dp = dp});
    return pos < 0 ? -1 : g->rank_of[pos];
}

comm_grid_coord comm_grid_coord_of_rank(const comm_grid *g, int rank) {
    int n = g->shape.tp * g->shape.pp * g->shape.dp;
    MS_CHECK(rank >= 0 && rank < n);
    for (int pos = 0; pos < n; pos++)
        if (g->rank_of[pos] == rank) return comm_grid_coord_at(g->shape, pos);
    MS_CHECK(0 && "a world rank without a grid position");
    return g->me;
}

int comm_grid_placed(const comm_grid *g) {
    return g->placed;
}

int comm_grid_stage_rank(const comm_grid *g, int stage) {
    return comm_grid_rank_of(g, g->me.tp, g->me.dp, stage);
}

int comm_grid_next_stage(const comm_grid *g) {
    return comm_grid_stage_rank(g, g->me.pp + 1);
}

int comm_grid_prev_stage(const comm_grid *g) {
    return comm_grid_stage_rank(g, g->me.pp - 1);
}
