/* events.c - the event recorder (see events.h).
 *
 * Rings: single producer (the owning thread) and single consumer (the
 * drainer).  The producer writes ev[head % RING], then stores head + 1 with
 * release order; the consumer reads head with acquire order, copies
 * ev[tail..head) and stores the new tail with release order, which the
 * producer reads (acquire) to see free room.  A thread that exits leaves
 * its ring marked orphaned (a pthread key destructor); a new thread takes
 * an orphaned ring over once the consumer has emptied it, so short-lived
 * threads do not use up the registry.
 */
#include "base/events.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    _Atomic uint64_t head, tail;
    _Atomic uint64_t dropped;
    _Atomic int orphan;
    uint16_t lane;
    ms_event ev[MS_EV_RING];
} ev_ring;

_Atomic int ms_ev_enabled_flag;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_names[MS_EV_MAX_NAMES][MS_EV_NAME_MAX]; /* [0] unused */
static _Atomic int g_nnames = 1;
static ev_ring *g_rings[MS_EV_MAX_THREADS];
static _Atomic int g_nrings;
static _Atomic uint64_t g_lost; /* events of threads that found no ring */
static _Atomic int32_t g_step;
static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Thread_local ev_ring *tl_ring;

int64_t ms_ev_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void ms_ev_enable(int on) {
    atomic_store(&ms_ev_enabled_flag, on ? 1 : 0);
}

int ms_ev_enabled(void) {
    return ms_ev_on();
}

uint16_t ms_ev_intern(const char *name) {
    if (!name || !*name) return 0;
    pthread_mutex_lock(&g_mu);
    int n = atomic_load(&g_nnames), id = 0;
    for (int i = 1; i < n && !id; i++)
        if (!strncmp(g_names[i], name, MS_EV_NAME_MAX - 1)) id = i;
    if (!id && n < MS_EV_MAX_NAMES) {
        strncpy(g_names[n], name, MS_EV_NAME_MAX - 1);
        id = n;
        atomic_store(&g_nnames, n + 1); /* publishes the name to ms_ev_name */
    }
    pthread_mutex_unlock(&g_mu);
    return (uint16_t)id;
}

const char *ms_ev_name(uint16_t id) {
    return id > 0 && id < atomic_load(&g_nnames) ? g_names[id] : "";
}

static void ring_orphan(void *p) {
    atomic_store(&((ev_ring *)p)->orphan, 1);
}

static void key_create(void) {
    pthread_key_create(&g_key, ring_orphan);
}

/* The calling thread's ring, taking one over or allocating it (once). */
static ev_ring *my_ring(void) {
    if (tl_ring) return tl_ring;
    pthread_once(&g_once, key_create);
    pthread_mutex_lock(&g_mu);
    ev_ring *r = NULL;
    int n = atomic_load(&g_nrings);
    for (int i = 0; i < n && !r; i++) {
        ev_ring *c = g_rings[i];
        if (atomic_load(&c->orphan) && atomic_load(&c->head) == atomic_load(&c->tail)) r = c;
    }
    if (r) {
        atomic_store(&r->orphan, 0);
    } else if (n < MS_EV_MAX_THREADS && (r = calloc(1, sizeof *r)) != NULL) {
        g_rings[n] = r;
        atomic_store(&g_nrings, n + 1);
    }
    pthread_mutex_unlock(&g_mu);
    if (r) {
        r->lane = 0;
        pthread_setspecific(g_key, r);
    }
    tl_ring = r;
    return r;
}

void ms_ev_thread_init(uint16_t lane) {
    ev_ring *r = my_ring();
    if (r && lane) r->lane = lane;
}

void ms_ev_set_step(int step) {
    atomic_store_explicit(&g_step, step, memory_order_relaxed);
}

int ms_ev_step(void) {
    return atomic_load_explicit(&g_step, memory_order_relaxed);
}

static void record(uint8_t kind, uint16_t name, uint16_t lane, int64_t t0, int64_t t1,
                   const ms_ev_args *a) {
    ev_ring *r = my_ring();
    if (!r) {
        atomic_fetch_add_explicit(&g_lost, 1, memory_order_relaxed);
        return;
    }
    uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    if (h - atomic_load_explicit(&r->tail, memory_order_acquire) >= MS_EV_RING) {
        atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
        return;
    }
    ms_event *e = &r->ev[h & (MS_EV_RING - 1)];
    e->t0 = t0;
    e->t1 = t1;
    if (a)
        e->a = *a;
    else
        memset(&e->a, 0, sizeof e->a);
    if (!(e->a.has & MS_EV_STEP)) {
        int s = atomic_load_explicit(&g_step, memory_order_relaxed);
        if (s > 0) e->a.step = s, e->a.has |= MS_EV_STEP;
    }
    e->name = name;
    e->lane = lane ? lane : r->lane;
    e->kind = kind;
    atomic_store_explicit(&r->head, h + 1, memory_order_release);
}

void ms_ev_span(uint16_t name, uint16_t lane, int64_t t0, int64_t t1, const ms_ev_args *a) {
    if (!ms_ev_on() || !name) return;
    record(MS_EV_SPAN, name, lane, t0, t1 >= t0 ? t1 : t0, a);
}

void ms_ev_mark(uint16_t name, uint16_t lane, int64_t t, const ms_ev_args *a) {
    if (!ms_ev_on() || !name) return;
    record(MS_EV_MARK, name, lane, t, t, a);
}

void ms_ev_clock(int64_t t, int64_t offset_ns, int64_t err_ns) {
    if (!ms_ev_on()) return;
    ms_ev_args a = {.has = MS_EV_BYTES | MS_EV_SEQ, .bytes = offset_ns, .seq = err_ns};
    record(MS_EV_CLOCK, 0, 0, t, t, &a);
}

long ms_ev_drain(ms_ev_sink_fn fn, void *ctx, uint64_t *dropped) {
    long total = 0;
    uint64_t lost = atomic_load(&g_lost);
    int n = atomic_load(&g_nrings);
    for (int i = 0; i < n; i++) {
        ev_ring *r = g_rings[i];
        uint64_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
        uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
        for (; t < h; t++, total++) {
            ms_event e = r->ev[t & (MS_EV_RING - 1)];
            atomic_store_explicit(&r->tail, t + 1, memory_order_release);
            fn(ctx, &e);
        }
        lost += atomic_load_explicit(&r->dropped, memory_order_relaxed);
    }
    if (dropped) *dropped = lost;
    return total;
}

void ms_ev_reset(void) {
    pthread_mutex_lock(&g_mu);
    int n = atomic_load(&g_nrings);
    for (int i = 0; i < n; i++) {
        atomic_store(&g_rings[i]->tail, atomic_load(&g_rings[i]->head));
        atomic_store(&g_rings[i]->dropped, 0);
    }
    atomic_store(&g_lost, 0);
    pthread_mutex_unlock(&g_mu);
}
