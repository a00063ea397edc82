/* devtime.h - device spans over the backend's timer pool (be->ev_record /
 * ev_poll): timestamps are taken in the op stream without waiting, and the
 * spans between them are read late, once the device has passed them, so
 * timing never stalls the step.  Completed spans go to the event recorder
 * (on the "device" lane, for a device backend; on the CPU they would repeat
 * the host spans) and their durations are kept by name for the step record.
 *
 * Who calls it: the trainer (one per backend).  Memory: create allocates,
 * destroy frees (pending timestamps are drained without waiting and
 * dropped).  Thread-safety: the backend's thread only.
 */
#ifndef MON_DEVTIME_H
#define MON_DEVTIME_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/events.h"
#include "base/status.h"

typedef struct mon_devtime mon_devtime;

/* emit: also record each completed span on the recorder's "device" lane. */
ms_status mon_devtime_create(mon_devtime **out, be_backend *be, int emit);
void mon_devtime_destroy(mon_devtime *d);

/* A timestamp in the op stream now: a handle, or -1 if the pool is dry
 * (a span using it is then dropped).  Each handle belongs to exactly one
 * span (reading the span gives it back): for two spans that meet, take two
 * marks. */
int mon_devtime_mark(mon_devtime *d);
/* The span from mark h0 to mark h1, named `name` (interned), recorded when
 * both have completed; a may be NULL. */
void mon_devtime_span(mon_devtime *d, uint16_t name, int h0, int h1, const ms_ev_args *a);
/* Collect what has completed (never waits).  Call it after the step's own
 * synchronisation point; it also re-anchors the device clock there. */
void mon_devtime_poll(mon_devtime *d);
/* Duration (ms) of the last completed span named `name`, 0 if none yet. */
double mon_devtime_last_ms(const mon_devtime *d, uint16_t name);

#endif
