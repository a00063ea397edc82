/* comm_nccl_group.c - giving a group an NCCL communicator
 * (comm_group_enable_nccl), freeing it, and the group's watchdog thread.
 * See comm_nccl.c for the model.  Only with MS_HAVE_NCCL.
 *
 * Enabling is collective over the group and uses the group's MPI path for
 * its own exchanges (host buffers): every member's GPU identity
 * ("host/PCI bus id") is all-gathered to refuse two members on one GPU,
 * rank 0's ncclUniqueId is broadcast, and after the non-blocking
 * ncclCommInitRankConfig two all-reduces make every member agree on
 * success, so that all keep a communicator or none does.
 */
#ifdef MS_HAVE_NCCL

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timeutil.h"
#include "comm/comm_nccl_internal.h"

#define COMM_NCCL_WATCH_S 0.05 /* watchdog period */
#define COMM_NCCL_ID_MAX 160   /* "host/pci-bus-id" of a member's GPU */

/* The watchdog thread: a pass every 50 ms until stopped. */
static void *comm_nccl_watchdog_main(void *arg) {
    comm_nccl *n = arg;
    COMM_CU_WARN("the NCCL watchdog thread", cudaSetDevice(n->device));
    pthread_mutex_lock(&n->mu);
    while (!n->stop) {
        comm_nccl_watch_locked(n);
        struct timespec ts = ms_deadline(CLOCK_MONOTONIC, COMM_NCCL_WATCH_S);
        pthread_cond_timedwait(&n->cv, &n->mu, &ts);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* ---- enable / free ------------------------------------------------------- */

/* Free n's CUDA objects and memory (communicator already gone). */
static void comm_nccl_free_struct(comm_nccl *n) {
    const char *what = n->g->name;
    for (int i = 0; i < n->nslots; i++)
        COMM_CU_WARN(what, cudaEventDestroy(n->slots[i].ev));
    if (n->ready) COMM_CU_WARN(what, cudaEventDestroy(n->ready));
    if (n->stream) COMM_CU_WARN(what, cudaStreamDestroy(n->stream));
    free(n->slots);
    free(n->pending);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n);
}

static void comm_nccl_watchdog_stop(comm_nccl *n) {
    if (!n->watchdog_started) return;
    pthread_mutex_lock(&n->mu);
    n->stop = 1;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    pthread_join(n->watchdog, NULL);
    n->watchdog_started = 0;
}

void comm_nccl_group_free(comm_group *g, int broken) {
    comm_nccl *n = g->nccl;
    if (!n) return;
    g->nccl = NULL;
    comm_nccl_watchdog_stop(n);
    char what[96];
    snprintf(what, sizeof what, "destroying the NCCL communicator of group '%s'", g->name);
    if (n->comm && broken) {
        COMM_NC_WARN(what, ncclCommAbort(n->comm));
    } else if (n->comm) {
        double deadline = ms_now() + comm_world_timeout(g->w);
        pthread_mutex_lock(&n->mu);
        ms_status st = COMM_NC_SETTLE(n, what, deadline, ncclCommFinalize(n->comm));
        if (st == MS_OK && n->comm)
            st = COMM_NC(what, n->comm, ncclCommDestroy(n->comm));
        else if (n->comm)
            COMM_NC_WARN(what, ncclCommAbort(n->comm));
        pthread_mutex_unlock(&n->mu);
        if (st != MS_OK) ms_warn("%s", ms_errmsg());
    }
    n->comm = NULL;
    comm_nccl_free_struct(n);
}

/* This member's GPU as "host/pci-bus-id"; ok = 0 with the reason in id. */
static int comm_nccl_gpu_id(char *id, size_t len, int *device) {
    char host[64] = "?", bus[64];
    gethostname(host, sizeof host - 1);
    cudaError_t e = cudaGetDevice(device);
    if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, *device);
    if (e != cudaSuccess) {
        snprintf(id, len, "cannot identify its CUDA device: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    snprintf(id, len, "%s/%s", host, bus);
    return 1;
}

/* All-gather every member's GPU id over MPI; fail (the same way on every
 * member) if one could not tell it or two members share a GPU. */
static ms_status comm_nccl_check_gpus(comm_group *g, const char *fn, int *device) {
    typedef struct {
        int ok;
        char id[COMM_NCCL_ID_MAX];
    } gpu_rec;
    gpu_rec mine;
    memset(&mine, 0, sizeof mine);
    mine.ok = comm_nccl_gpu_id(mine.id, sizeof mine.id, device);
    gpu_rec *all = calloc((size_t)g->size, sizeof *all);
    if (!all) return ms_error(MS_ERR_NOMEM, "%s on group '%s': out of memory", fn, g->name);
    ms_status st = comm_allgather(g, &mine, all, sizeof mine, COMM_U8);
    for (int i = 0; i < g->size && st == MS_OK; i++) {
        if (!all[i].ok) {
            st = ms_error(MS_ERR_INTERNAL, "%s on group '%s': rank %d (global %d) %s", fn, g->name,
                          i, g->global[i], all[i].id);
            break;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(all[i].id, all[j].id)) {
                st = ms_error(MS_ERR_INTERNAL,
                              "%s on group '%s': ranks %d and %d (global %d and %d) use the same "
                              "GPU (%s); NCCL cannot put two ranks on one GPU: keep this group on "
                              "MPI (device buffers are staged through host memory, "
                              "comm_world_set_device) or give each rank its own GPU",
                              fn, g->name, j, i, g->global[j], g->global[i], all[i].id);
                break;
            }
    }
    free(all);
    return st;
}

/* All members agree on whether each had `st` == MS_OK (MPI all-reduce);
 * returns the local failure, or one naming the step if another failed. */
static ms_status comm_nccl_agree(comm_group *g, ms_status st, const char *what, const char *step) {
    char local[COMM_MSG_MAX];
    snprintf(local, sizeof local, "%s", st != MS_OK ? ms_errmsg() : "");
    int32_t ok = st == MS_OK, all_ok = 0;
    ms_status ast = comm_allreduce(g, &ok, &all_ok, 1, COMM_I32, COMM_MIN);
    if (st != MS_OK) return ms_error(st, "%s", local);
    if (ast != MS_OK) return ast;
    if (!all_ok)
        return ms_error(MS_ERR_INTERNAL, "%s: another member failed to %s (see its log)", what,
                        step);
    return MS_OK;
}

/* Create n's stream, events and communicator (id from rank 0): the init
 * call (non-blocking: it answers at once), an agreement that every member
 * got that far (so one that failed at once does not leave the others
 * waiting for it), then the wait for the init under the op timeout, and
 * another agreement. */
static ms_status comm_nccl_create(comm_group *g, comm_nccl *n, const ncclUniqueId *id,
                                  const char *what) {
    ms_status st = COMM_CU(what, cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking));
    if (st == MS_OK)
        st = COMM_CU(what, cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming));
    ncclResult_t rc = ncclInternalError;
    if (st == MS_OK) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        rc = ncclCommInitRankConfig(&n->comm, g->size, *id, g->rank, &cfg);
        if (rc != ncclSuccess && rc != ncclInProgress)
            st = comm_nc(rc, "ncclCommInitRankConfig", what, NULL);
    }
    MS_TRY(comm_nccl_agree(g, st, what, "start NCCL"));
    double deadline = ms_now() + comm_world_timeout(g->w);
    pthread_mutex_lock(&n->mu);
    st = comm_nccl_settle(n, rc, "ncclCommInitRankConfig", what, deadline);
    pthread_mutex_unlock(&n->mu);
    return comm_nccl_agree(g, st, what, "create its NCCL communicator");
}

ms_status comm_group_enable_nccl(comm_group *g, void *cuda_stream) {
    static const char *fn = "comm_group_enable_nccl";
    if (!g) return ms_error(MS_ERR_ARG, "%s: NULL group", fn);
    if (g->nccl) return ms_error(MS_ERR_ARG, "%s: group '%s' already has NCCL", fn, g->name);
    char what[96];
    snprintf(what, sizeof what, "%s on group '%s'", fn, g->name);
    int device = 0;
    MS_TRY(comm_nccl_check_gpus(g, fn, &device));

    /* Rank 0's id, with a flag so that a failure there fails everyone. */
    struct {
        int ok;
        ncclUniqueId id;
    } u;
    memset(&u, 0, sizeof u);
    char local_err[COMM_MSG_MAX] = "";
    if (g->rank == 0) {
        u.ok = COMM_NC(what, NULL, ncclGetUniqueId(&u.id)) == MS_OK;
        if (!u.ok) snprintf(local_err, sizeof local_err, "%s", ms_errmsg());
    }
    MS_TRY(comm_broadcast(g, &u, sizeof u, COMM_U8, 0));
    if (!u.ok)
        return ms_error(MS_ERR_INTERNAL, "%s: rank 0 could not make an NCCL id%s%s", what,
                        local_err[0] ? ": " : "", local_err);

    /* each step that can fail on one member alone is agreed on, so that
     * every member keeps a communicator or none does (a member left on MPI
     * while its peers ran NCCL hung at the group's first op; one that
     * could not allocate left its peers waiting in the create) */
    comm_nccl *n = calloc(1, sizeof *n);
    pthread_condattr_t ca;
    int inited = 0;
    ms_status st = MS_OK;
    if (!n || pthread_mutex_init(&n->mu, NULL) || pthread_condattr_init(&ca) ||
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) || pthread_cond_init(&n->cv, &ca))
        st = ms_error(MS_ERR_NOMEM, "%s: cannot allocate the NCCL state", what);
    else
        inited = 1, pthread_condattr_destroy(&ca);
    st = comm_nccl_agree(g, st, what, "allocate its NCCL state");
    if (st != MS_OK) {
        char msg[COMM_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", ms_errmsg());
        if (inited) {
            n->g = g;
            comm_nccl_free_struct(n);
        } else {
            free(n); /* (a failed init leaves nothing to destroy) */
        }
        return ms_error(st, "%s", msg);
    }
    n->g = g;
    n->device = device;
    n->compute = (cudaStream_t)cuda_stream;
    st = comm_nccl_create(g, n, &u.id, what); /* everyone has one, or nobody */
    if (st == MS_OK) {
        int rc = pthread_create(&n->watchdog, NULL, comm_nccl_watchdog_main, n);
        n->watchdog_started = rc == 0;
        ms_status wst = rc == 0
                            ? MS_OK
                            : ms_error(MS_ERR_INTERNAL, "%s: cannot start the watchdog thread: %s",
                                       what, strerror(rc));
        st = comm_nccl_agree(g, wst, what, "start its NCCL watchdog");
    }
    if (st != MS_OK) {
        char msg[COMM_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", ms_errmsg());
        comm_nccl_watchdog_stop(n);
        if (n->comm) COMM_NC_WARN(what, ncclCommAbort(n->comm));
        n->comm = NULL;
        comm_nccl_free_struct(n);
        return ms_error(st, "%s", msg);
    }
    g->nccl = n;
    ms_debug("comm: group '%s' (%d ranks) on NCCL %d.%d, GPU %d", g->name, g->size, NCCL_MAJOR,
             NCCL_MINOR, device);
    return MS_OK;
}

#else
typedef int comm_nccl_group_not_built; /* ISO C wants something in a translation unit */
#endif
