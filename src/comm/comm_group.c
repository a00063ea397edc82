/* comm_group.c - groups of ranks: creation by split or by rank list,
 * destruction, accessors.  Creation is collective and runs on the
 * communication thread (never posted by the caller itself): the
 * public call queues a request and waits for it like any op, so it obeys
 * the timeout too.  A split first passes a non-blocking barrier on the
 * parent (so a missing or dead rank is caught and named like in any
 * collective) and only then calls the blocking MPI_Comm_split.  Creation
 * from a rank list (MPI_Comm_create_group, collective over the members
 * only) blocks the communication thread; if a member never comes, the
 * waiter's backstop (deadline + 2 s, see comm_wait) gives up.
 *
 * Every group gets an arrival-board slot (gid) that all its members agree
 * on: each rank proposes the lowest slot it has not used yet and the group
 * takes the maximum (one small all-reduce on the new group).  Slots are
 * never reused; past COMM_BOARD_MAX_GROUPS a group has no slot and its
 * timeouts say the missing ranks are unknown.
 *
 * The group owns its member table (and its NCCL state, comm_nccl.c);
 * comm_group_destroy frees them.  Thread-safe through the request queue.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/events.h"
#include "base/log.h"
#include "comm/comm_internal.h"

comm_group *comm_group_wrap(comm_world *w, MPI_Comm comm, const char *name, char *err, size_t n) {
    comm_group *g = calloc(1, sizeof *g);
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    int *idx = NULL, rc;
    if (!g) {
        snprintf(err, n, "out of memory for group '%s'", name);
        return NULL;
    }
    g->w = w;
    g->comm = comm;
    g->gid = -1;
    g->last_kind = -1;
    snprintf(g->name, sizeof g->name, "%s", name);
    char lane[COMM_NAME_MAX + 8];
    snprintf(lane, sizeof lane, "comm:%s", g->name);
    g->ev_lane = ms_ev_intern(lane);
    g->ev_name = ms_ev_intern(g->name);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(comm, &g->size);
    MPI_Comm_rank(comm, &g->rank);
    g->global = malloc((size_t)g->size * sizeof *g->global);
    idx = malloc((size_t)g->size * sizeof *idx);
    if (!g->global || !idx) {
        snprintf(err, n, "out of memory for group '%s' (%d ranks)", name, g->size);
        goto fail;
    }
    for (int i = 0; i < g->size; i++)
        idx[i] = i;
    const char *call = "MPI_Comm_group";
    if ((rc = MPI_Comm_group(comm, &mine)) != MPI_SUCCESS ||
        (rc = MPI_Comm_group(MPI_COMM_WORLD, &world)) != MPI_SUCCESS ||
        (call = "MPI_Group_translate_ranks",
         rc = MPI_Group_translate_ranks(mine, g->size, idx, world, g->global)) != MPI_SUCCESS) {
        comm_mpi_errstr(rc, call, err, n);
        goto fail;
    }
    if (w->ngroups == w->cap_groups) { /* the live groups, for hang dumps */
        int cap = w->cap_groups ? 2 * w->cap_groups : 8;
        comm_group **a = realloc(w->groups, (size_t)cap * sizeof *a);
        if (!a) {
            snprintf(err, n, "out of memory for group '%s'", name);
            goto fail;
        }
        w->groups = a;
        w->cap_groups = cap;
    }
    w->groups[w->ngroups++] = g;
    goto out;
fail:
    free(g->global);
    free(g);
    g = NULL;
out:
    if (mine != MPI_GROUP_NULL) MPI_Group_free(&mine);
    if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
    free(idx);
    return g;
}

void comm_group_free_struct(comm_group *g) {
    if (!g) return;
    comm_world *w = g->w;
    for (int i = 0; i < w->ngroups; i++)
        if (w->groups[i] == g) {
            w->groups[i] = w->groups[--w->ngroups];
            break;
        }
    free(g->global);
    free(g);
}

/* Wrap the new communicator and agree on its board slot (comm thread). */
static void comm_group_adopt(comm_world *w, comm_req *r, MPI_Comm nc) {
    char err[512];
    comm_group *g = comm_group_wrap(w, nc, r->name, err, sizeof err);
    if (!g) {
        MPI_Comm_free(&nc);
        r->status = MS_ERR_NOMEM;
        snprintf(r->msg, sizeof r->msg, "comm: creating group '%s': %s", r->name, err);
        return;
    }
    int mine = w->next_gid, gid = 0;
    int rc = MPI_Allreduce(&mine, &gid, 1, MPI_INT, MPI_MAX, nc);
    if (rc != MPI_SUCCESS) {
        comm_mpi_errstr(rc, "MPI_Allreduce (board slot)", err, sizeof err);
        snprintf(r->msg, sizeof r->msg, "comm: creating group '%s': %s", r->name, err);
        r->status = MS_ERR_INTERNAL;
        MPI_Comm_free(&g->comm);
        comm_group_free_struct(g);
        return;
    }
    w->next_gid = gid + 1;
    g->gid = gid < COMM_BOARD_MAX_GROUPS ? gid : -1;
    r->out = g;
}

/* MPI_Comm_create_group over r->ranks (parent ranks). */
static int comm_group_exec_create(comm_req *r, MPI_Comm *nc, const char **call) {
    MPI_Group pg = MPI_GROUP_NULL, ng = MPI_GROUP_NULL;
    int rc;
    *call = "MPI_Comm_group";
    if ((rc = MPI_Comm_group(r->g->comm, &pg)) != MPI_SUCCESS) return rc;
    *call = "MPI_Group_incl";
    if ((rc = MPI_Group_incl(pg, r->nranks, r->ranks, &ng)) == MPI_SUCCESS) {
        *call = "MPI_Comm_create_group";
        rc = MPI_Comm_create_group(r->g->comm, ng, 0, nc);
        MPI_Group_free(&ng);
    }
    MPI_Group_free(&pg);
    return rc;
}

void comm_group_exec(comm_world *w, comm_req *r) {
    MPI_Comm nc = MPI_COMM_NULL;
    const char *call = "MPI_Comm_split";
    int rc = MPI_SUCCESS;
    r->status = MS_OK;
    switch (r->kind) {
    case COMM_K_SPLIT:
        rc = MPI_Comm_split(r->g->comm, r->color < 0 ? MPI_UNDEFINED : r->color, r->key, &nc);
        break;
    case COMM_K_CREATE:
        rc = comm_group_exec_create(r, &nc, &call);
        break;
    case COMM_K_FREE:
        call = "MPI_Comm_free";
        rc = MPI_Comm_free(&r->g->comm);
        break;
    default:
        MS_CHECKF(0, "comm: kind %d is not a group op", (int)r->kind);
    }
    if (rc != MPI_SUCCESS) {
        char d[256], e[MPI_MAX_ERROR_STRING + 64];
        comm_req_describe(r, d, sizeof d);
        comm_mpi_errstr(rc, call, e, sizeof e);
        r->status = MS_ERR_INTERNAL;
        snprintf(r->msg, sizeof r->msg, "comm: %s creating '%s': %s", d, r->name, e);
        return;
    }
    if (r->kind == COMM_K_FREE)
        comm_group_free_struct(r->g);
    else if (nc != MPI_COMM_NULL)
        comm_group_adopt(w, r, nc);
}

/* Queue a group request and wait for it; *out gets the new group. */
static ms_status comm_group_run(comm_req *r, int collective, comm_group **out) {
    MS_TRY(comm_submit(r, collective));
    comm_group *g = NULL;
    ms_status st = comm_wait_result(r, &g);
    if (out) *out = st == MS_OK ? g : NULL;
    return st;
}

ms_status comm_group_create_split(comm_group *parent, int color, int key, const char *name,
                                  comm_group **out) {
    if (!parent || !out) return ms_error(MS_ERR_ARG, "comm_group_create_split: NULL argument");
    *out = NULL;
    comm_req *r = comm_req_alloc(parent->w);
    if (!r) return ms_error(MS_ERR_NOMEM, "comm_group_create_split: out of memory");
    r->g = parent;
    r->kind = COMM_K_SPLIT;
    r->color = color;
    r->key = key;
    snprintf(r->name, sizeof r->name, "%s", name ? name : "group");
    return comm_group_run(r, 1, out);
}

ms_status comm_group_create_ranks(comm_group *parent, const int *ranks, int n, const char *name,
                                  comm_group **out) {
    static const char *fn = "comm_group_create_ranks";
    if (!parent || !out || !ranks) return ms_error(MS_ERR_ARG, "%s: NULL argument", fn);
    *out = NULL;
    const char *nm = name ? name : "group";
    if (n < 1 || n > parent->size)
        return ms_error(MS_ERR_ARG, "%s '%s' from '%s': %d ranks (parent has %d)", fn, nm,
                        parent->name, n, parent->size);
    int self = 0;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size)
            return ms_error(MS_ERR_ARG, "%s '%s' from '%s': rank %d not in [0, %d)", fn, nm,
                            parent->name, ranks[i], parent->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return ms_error(MS_ERR_ARG, "%s '%s' from '%s': rank %d listed twice", fn, nm,
                                parent->name, ranks[i]);
        self |= ranks[i] == parent->rank;
    }
    if (!self)
        return ms_error(MS_ERR_ARG, "%s '%s' from '%s': calling rank %d is not in the list", fn, nm,
                        parent->name, parent->rank);
    comm_req *r = comm_req_alloc(parent->w);
    if (!r) return ms_error(MS_ERR_NOMEM, "%s: out of memory", fn);
    r->g = parent;
    r->kind = COMM_K_CREATE;
    r->ranks = ranks;
    r->nranks = n;
    snprintf(r->name, sizeof r->name, "%s", nm);
    return comm_group_run(r, 0, out);
}

void comm_group_destroy(comm_group *g) {
    if (!g || g == g->w->world_group) return;
    int broken = comm_world_broken(g->w);
    if (g->nccl) comm_nccl_group_free(g, broken);
    if (broken) return; /* the comm thread may still hold it: leak */
    comm_req *r = comm_req_alloc(g->w);
    if (!r) {
        ms_warn("comm_group_destroy '%s': out of memory, group leaked", g->name);
        return;
    }
    char name[COMM_NAME_MAX];
    snprintf(name, sizeof name, "%s", g->name);
    r->g = g;
    r->kind = COMM_K_FREE;
    snprintf(r->name, sizeof r->name, "%s", name);
    if (comm_group_run(r, 0, NULL) != MS_OK)
        ms_warn("comm_group_destroy '%s': %s", name, ms_errmsg());
}

int comm_group_has_nccl(const comm_group *g) {
    return g && g->nccl != NULL;
}

const char *comm_group_name(const comm_group *g) {
    return g->name;
}

int comm_group_size(const comm_group *g) {
    return g->size;
}

int comm_group_rank(const comm_group *g) {
    return g->rank;
}

int comm_group_global_rank(const comm_group *g, int i) {
    MS_CHECKF(i >= 0 && i < g->size, "comm_group_global_rank: %d not in [0, %d) of '%s'", i,
              g->size, g->name);
    return g->global[i];
}

comm_world *comm_group_world(const comm_group *g) {
    return g->w;
}
