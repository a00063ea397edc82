/* comm_hosts.c - which host every rank of the world runs on: each rank's
 * gethostname(), gathered once at comm_world_init (one MPI_Allgather of
 * COMM_HOST_MAX bytes a rank), and the hosts numbered in the order of their
 * lowest world rank.  The rank grid places its groups by it (grid.c), the
 * trainer shares batches among the ranks of a host, and timeout messages
 * name the host of a peer that did not arrive (comm_board.c).
 *
 * A host is its name: two ranks with the same gethostname() share a host
 * (its memory, its /dev/shm).  On machines that is the truth; in the
 * namespace test bed (scripts/test-hosts) the launch agent gives every
 * namespace its own UTS name for the same reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"

ms_status comm_hosts_init(comm_world *w) {
    char me[COMM_HOST_MAX] = {0};
    if (gethostname(me, sizeof me - 1) != 0 || !me[0]) snprintf(me, sizeof me, "localhost");
    w->host_name = calloc((size_t)w->size, COMM_HOST_MAX);
    w->host_of = calloc((size_t)w->size, sizeof *w->host_of);
    if (!w->host_name || !w->host_of)
        return ms_error(MS_ERR_NOMEM, "comm_world_init: out of memory (host names)");
    int rc = MPI_Allgather(me, COMM_HOST_MAX, MPI_CHAR, w->host_name, COMM_HOST_MAX, MPI_CHAR,
                           MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return comm_mpi_error(rc, "MPI_Allgather", "comm_world_init (hosts)");
    w->n_hosts = 0;
    for (int r = 0; r < w->size; r++) {
        w->host_name[r][COMM_HOST_MAX - 1] = 0;
        int h = -1;
        for (int q = 0; q < r && h < 0; q++)
            if (!strcmp(w->host_name[q], w->host_name[r])) h = w->host_of[q];
        w->host_of[r] = h >= 0 ? h : w->n_hosts++;
    }
    return MS_OK;
}

void comm_hosts_free(comm_world *w) {
    free(w->host_name);
    free(w->host_of);
    w->host_name = NULL;
    w->host_of = NULL;
}

const char *comm_world_host(const comm_world *w, int rank) {
    if (!w->host_name || rank < 0 || rank >= w->size) return "?";
    return w->host_name[rank];
}

int comm_world_host_index(const comm_world *w, int rank) {
    MS_CHECK(rank >= 0 && rank < w->size);
    return w->host_of ? w->host_of[rank] : 0;
}

int comm_world_n_hosts(const comm_world *w) {
    return w->host_of ? w->n_hosts : 1;
}
