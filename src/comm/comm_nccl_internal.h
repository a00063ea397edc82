/* comm_nccl_internal.h - the NCCL implementation's private structures,
 * shared by comm_nccl.c (ops, checking wrappers, the watchdog's pass) and
 * comm_nccl_group.c (enable / free, the watchdog thread).  Only with
 * MS_HAVE_NCCL; not for use outside src/comm/.  Locking: see comm_nccl.c.
 */
#ifndef MS_COMM_NCCL_INTERNAL_H
#define MS_COMM_NCCL_INTERNAL_H

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/comm_internal.h"

typedef struct {
    cudaEvent_t ev; /* recorded on the NCCL stream after the op */
    int busy;       /* the op is in flight or not yet waited */
    int waited;     /* comm_wait returned for it */
    int done;       /* ev was seen complete */
    double t_start, deadline, t_dead_seen;
    comm_kind kind; /* for the arrival report */
    uint64_t seq;
    int peer;
    char desc[256];
} comm_nccl_slot;

struct comm_nccl {
    comm_group *g;
    ncclComm_t comm; /* NULL once aborted or destroyed */
    int device;
    cudaStream_t compute; /* the caller's stream */
    cudaStream_t stream;  /* the NCCL ops' stream */
    cudaEvent_t ready;    /* recorded on compute before each launch */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t watchdog;
    int watchdog_started, stop;
    /* under mu */
    comm_nccl_slot *slots;
    int nslots;
    comm_req **pending; /* send/recv started, not yet launched */
    int npending, cap_pending;
    int aborted;
    ms_status err_code;
    char err_msg[COMM_MSG_MAX];
};

/* "comm: <what>: <call> failed: <CUDA / NCCL message>" as MS_ERR_INTERNAL;
 * MS_OK on success.  The _warn forms log a failure (cleanup paths). */
ms_status comm_cu(cudaError_t e, const char *call, const char *what);
ms_status comm_nc(ncclResult_t rc, const char *call, const char *what, ncclComm_t comm);
void comm_cu_warn(cudaError_t e, const char *call, const char *what);
void comm_nc_warn(ncclResult_t rc, const char *call, const char *what);
#define COMM_CU(what, call) comm_cu((call), #call, (what))
/* For calls that cannot answer ncclInProgress. */
#define COMM_NC(what, comm, call) comm_nc((call), #call, (what), (comm))
#define COMM_CU_WARN(what, call) comm_cu_warn((call), #call, (what))
#define COMM_NC_WARN(what, call) comm_nc_warn((call), #call, (what))

/* Wait (n->mu held) until the non-blocking communicator has finished the
 * call that answered rc, failed, or the deadline passed (then it is
 * aborted: MS_ERR_TIMEOUT). */
ms_status comm_nccl_settle(comm_nccl *n, ncclResult_t rc, const char *call, const char *what,
                           double deadline);
#define COMM_NC_SETTLE(n, what, deadline, call)                                                    \
    comm_nccl_settle((n), (call), #call, (what), (deadline))
/* Abort the communicator (n->mu held); breaks the world if it is in service. */
void comm_nccl_abort_locked(comm_nccl *n, ms_status code, const char *msg);
/* One watchdog pass over the ops in flight (n->mu held). */
void comm_nccl_watch_locked(comm_nccl *n);

#endif
