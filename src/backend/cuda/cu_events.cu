/* cu_events.cu - the CUDA backend's device timer pool (be->ev_record,
 * ev_poll, ev_anchor; see backend.h).
 *
 * A pool of CUDA events handed out by index from a free stack.  Recording
 * enqueues the event on the op stream and returns at once; polling asks
 * cudaEventQuery, never waits, and converts a completed event to the host's
 * monotonic clock through an anchor: an event recorded when the stream was
 * idle, whose host time is therefore known (within the launch latency, a
 * few microseconds).  cudaEventElapsedTime is a float of milliseconds, so
 * its resolution degrades as events move away from their anchor; and the
 * GPU and host clocks drift apart.  ev_anchor, called by the trainer right
 * after its per-step loss read-back, takes a new anchor when the stream is
 * idle (cudaStreamQuery; never waits: a busy stream keeps the old anchor);
 * every event is converted through the anchor that was current when it was
 * recorded (a small ring of anchors, so events in flight across an anchor
 * stay valid).
 */
#include <stdlib.h>
#include <string.h>

#include "cu_internal.h"

extern "C" {
#include "base/events.h"
}

#define CU_EV_POOL 2048
#define CU_EV_ANCHORS 16

typedef struct {
    cudaEvent_t ev;
    int64_t host_ns; /* host time of the anchor */
    unsigned gen;    /* bumped each time the slot is re-recorded */
} cu_anchor;

struct cu_evpool {
    cudaEvent_t ev[CU_EV_POOL];
    int anchor_of[CU_EV_POOL]; /* the anchor slot current at record time */
    unsigned gen_of[CU_EV_POOL];
    int free_stack[CU_EV_POOL], n_free;
    cu_anchor anchor[CU_EV_ANCHORS];
    int cur;
};

static cu_evpool *pool_of(be_backend *be) {
    return (cu_evpool *)cu_of(be)->events;
}

void cu_ev_anchor(be_backend *be) {
    cu_evpool *p = pool_of(be);
    cudaStream_t s = cu_of(be)->stream;
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaErrorNotReady) { /* busy: an anchor now would wait; keep the current one */
        (void)cudaGetLastError();
        return;
    }
    CU_CHECK(e);
    p->cur = (p->cur + 1) % CU_EV_ANCHORS;
    cu_anchor *a = &p->anchor[p->cur];
    CU_CHECK(cudaEventRecord(a->ev, s));
    CU_CHECK(cudaEventSynchronize(a->ev)); /* the stream is idle: returns at once */
    a->host_ns = ms_ev_now();
    a->gen++;
}

int cu_ev_record(be_backend *be) {
    cu_evpool *p = pool_of(be);
    if (!p->n_free) return -1;
    int h = p->free_stack[--p->n_free];
    CU_CHECK(cudaEventRecord(p->ev[h], cu_of(be)->stream));
    p->anchor_of[h] = p->cur;
    p->gen_of[h] = p->anchor[p->cur].gen;
    return h;
}

int cu_ev_poll(be_backend *be, int h, int64_t *t_ns) {
    cu_evpool *p = pool_of(be);
    MS_CHECKF(h >= 0 && h < CU_EV_POOL, "device timer handle %d", h);
    cudaError_t e = cudaEventQuery(p->ev[h]);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    CU_CHECK(e);
    cu_anchor *a = &p->anchor[p->anchor_of[h]];
    if (a->gen != p->gen_of[h]) a = &p->anchor[p->cur]; /* its anchor was reused: the newest */
    float ms = 0;
    CU_CHECK(cudaEventElapsedTime(&ms, a->ev, p->ev[h]));
    *t_ns = a->host_ns + (int64_t)((double)ms * 1e6);
    p->free_stack[p->n_free++] = h;
    return 1;
}

ms_status cu_events_init(be_backend *be) {
    cu_evpool *p = (cu_evpool *)calloc(1, sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "cuda backend: out of host memory for timers");
    cu_of(be)->events = p;
    for (int i = 0; i < CU_EV_POOL; i++) {
        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            return ms_error(MS_ERR_INTERNAL, "cuda backend: cannot create timer events");
        }
        p->free_stack[p->n_free++] = CU_EV_POOL - 1 - i;
    }
    for (int i = 0; i < CU_EV_ANCHORS; i++)
        if (cudaEventCreate(&p->anchor[i].ev) != cudaSuccess) {
            (void)cudaGetLastError();
            return ms_error(MS_ERR_INTERNAL, "cuda backend: cannot create timer events");
        }
    cu_ev_anchor(be);
    return MS_OK;
}

void cu_events_free(be_backend *be) {
    cu_evpool *p = pool_of(be);
    if (!p) return;
    for (int i = 0; i < CU_EV_POOL; i++)
        if (p->ev[i]) cudaEventDestroy(p->ev[i]);
    for (int i = 0; i < CU_EV_ANCHORS; i++)
        if (p->anchor[i].ev) cudaEventDestroy(p->anchor[i].ev);
    free(p);
    cu_of(be)->events = NULL;
}
