/* events.h - the event recorder: timed spans and marks from any thread of a
 * process, for the always-on timers, the per-rank event log and the merged
 * timeline (docs/formats.md, "Event log").
 *
 * Who calls it: every layer (the trainer, the model, the communication
 * thread, the prefetch and persist threads, the backends) records; one
 * consumer (monitor/'s event-log flusher) drains.  It is the process's
 * second piece of shared state after ms_ctx (STYLE.md allows one): a layer
 * must be able to record without being handed a handle and without calling
 * upward, so the registry of per-thread buffers is process-wide.
 *
 * Model.  Each recording thread owns one ring buffer (allocated on its
 * first record, or by ms_ev_thread_init; never freed before
 * ms_ev_shutdown).  Recording writes one fixed-size event into the thread's
 * own ring and publishes it with a release store: no lock, no allocation,
 * no system call beyond clock_gettime.  A full ring drops the event and
 * counts it (recording never blocks).  ms_ev_drain, called by one consumer
 * thread at a time, copies out what every ring holds.  When recording is
 * off (the default), every record call is one relaxed load and a branch.
 *
 * Names and lanes are small integer ids from ms_ev_intern (a lock, once per
 * name: intern at set-up time, or cache with ms_ev_id).  A lane is the
 * timeline track an event belongs to ("compute", "data", "ckpt",
 * "comm:dp"...); each thread has a default lane (ms_ev_thread_init).
 *
 * Times are CLOCK_MONOTONIC nanoseconds (ms_ev_now); ms_now() is the same
 * clock in seconds.  (The header is also read by the CUDA sources, compiled
 * as C++: the inline helpers over C11 atomics are C only.)
 */
#ifndef MS_EVENTS_H
#define MS_EVENTS_H

#include <stdint.h>
#ifndef __cplusplus
#include <stdatomic.h>
#endif

#define MS_EV_MAX_NAMES 512   /* interned names and lanes together */
#define MS_EV_NAME_MAX 48     /* bytes of a name, with the NUL */
#define MS_EV_MAX_THREADS 128 /* recording threads per process */
#define MS_EV_RING 8192       /* events per thread ring (power of two) */

/* Which optional arguments an event carries (ms_ev_args.has). */
enum {
    MS_EV_STEP = 1 << 0,   /* step: 1-based optimiser step (set by default, see ms_ev_set_step) */
    MS_EV_MB = 1 << 1,     /* mb: micro-batch */
    MS_EV_CHUNK = 1 << 2,  /* chunk: model chunk (pipeline) */
    MS_EV_PEER = 1 << 3,   /* peer: global rank of a point-to-point peer */
    MS_EV_TAG = 1 << 4,    /* tag: point-to-point tag */
    MS_EV_BYTES = 1 << 5,  /* bytes */
    MS_EV_SEQ = 1 << 6,    /* seq: collective sequence number on its group */
    MS_EV_POSTED = 1 << 7, /* posted: ns when a comm op was handed to MPI */
    MS_EV_OP = 1 << 8,     /* op: interned name of the op waited for */
    MS_EV_GROUP = 1 << 9,  /* group: interned communicator group name */
};

typedef struct {
    uint32_t has; /* MS_EV_* bits of the fields that are set */
    int32_t step, mb, chunk, peer, tag;
    int64_t bytes, seq, posted;
    uint16_t op, group;
} ms_ev_args;

typedef enum {
    MS_EV_SPAN = 0,  /* t0..t1 */
    MS_EV_MARK = 1,  /* an instant t0 */
    MS_EV_CLOCK = 2, /* a clock sample: from t0 on, global = local + bytes (ns), +- seq (ns) */
} ms_ev_kind;

typedef struct {
    int64_t t0, t1;
    ms_ev_args a;
    uint16_t name, lane;
    uint8_t kind;
} ms_event;

/* Monotonic time in ns. */
int64_t ms_ev_now(void);

/* Recording on / off for the whole process (off at start). */
void ms_ev_enable(int on);
int ms_ev_enabled(void); /* the same as ms_ev_on, as a function (for C++ callers) */
#ifndef __cplusplus
extern _Atomic int ms_ev_enabled_flag;
static inline int ms_ev_on(void) {
    return atomic_load_explicit(&ms_ev_enabled_flag, memory_order_relaxed);
}
#endif

/* The id of `name` (1..MS_EV_MAX_NAMES-1), interning it on first use; 0 if
 * the table is full (events with name 0 are not recorded).  Names longer
 * than MS_EV_NAME_MAX-1 bytes are cut.  Thread-safe (takes a lock). */
uint16_t ms_ev_intern(const char *name);
/* The name of id ("" for 0 or an unknown id).  Thread-safe. */
const char *ms_ev_name(uint16_t id);
#ifndef __cplusplus
/* ms_ev_intern cached in *cache (a static of the call site). */
static inline uint16_t ms_ev_id(_Atomic uint16_t *cache, const char *name) {
    uint16_t id = atomic_load_explicit(cache, memory_order_relaxed);
    if (!id) {
        id = ms_ev_intern(name);
        atomic_store_explicit(cache, id, memory_order_relaxed);
    }
    return id;
}
#endif

/* Give the calling thread its ring now (instead of at its first record)
 * and its default lane (an interned id; 0 keeps the current one). */
void ms_ev_thread_init(uint16_t lane);
/* The step attached to events that do not set MS_EV_STEP (process-wide:
 * the comm thread's spans get the trainer's current step); 0: none. */
void ms_ev_set_step(int step);
int ms_ev_step(void);

/* Record a span [t0, t1] (ns) on `lane` (0: the thread's default lane).
 * a may be NULL. */
void ms_ev_span(uint16_t name, uint16_t lane, int64_t t0, int64_t t1, const ms_ev_args *a);
/* Record an instant at t (ns). */
void ms_ev_mark(uint16_t name, uint16_t lane, int64_t t, const ms_ev_args *a);
/* Record a clock sample: from local time t on, global time = local +
 * offset_ns, with uncertainty +- err_ns. */
void ms_ev_clock(int64_t t, int64_t offset_ns, int64_t err_ns);

/* Copy every recorded event out of the rings, oldest first per thread,
 * calling fn for each (on the calling thread); returns the number drained.
 * *dropped (may be NULL) gets the total number of events dropped so far
 * because a ring was full.  One consumer at a time. */
typedef void (*ms_ev_sink_fn)(void *ctx, const ms_event *e);
long ms_ev_drain(ms_ev_sink_fn fn, void *ctx, uint64_t *dropped);

/* Discard everything recorded (rings kept).  No recorder may be running. */
void ms_ev_reset(void);

#endif
