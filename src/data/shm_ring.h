/* shm_ring.h - one reader per node: a ring of batches in POSIX shared memory.
 *
 * Ranks that must see identical batches (a tensor-parallel group on one
 * node) do not each read the shards: the leader reads (usually through a
 * data_prefetch) and publishes every batch with data_shm_put; each follower
 * attaches to the same named segment and takes the batches in order with
 * data_shm_get.  The leader blocks when the oldest slot has not yet been
 * read by every follower, so the ring never overwrites an unread batch.
 * Synchronisation is a process-shared robust mutex and condition variable in
 * the segment: a follower whose leader died, or a leader whose follower
 * died, gets an error naming the segment after `timeout_s` (or at once when
 * the dead process held the lock) instead of waiting forever.
 * The leader creates and finally unlinks the segment; followers wait up to
 * timeout_s for it to appear.  One thread per process uses a handle.
 * A timeout's error names the member that did not come, by its global
 * rank when `ranks` is given: a follower that has not read the oldest
 * slot, or the leader that has not published the next batch.
 */
#ifndef DATA_SHM_RING_H
#define DATA_SHM_RING_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct data_shm data_shm;

typedef struct {
    const char *name;   /* segment name, unique to the ring (the trainer: pid and 64 random bits) */
    int followers;      /* number of followers that read every batch */
    size_t batch_ints;  /* int32 elements of inputs (= of targets) per batch */
    int depth;          /* slots in the ring */
    double timeout_s;   /* longest wait for a peer */
    int member;         /* this process: 0 the leader, 1..followers a follower (each its own) */
    const int *ranks;   /* optional: the members' global ranks (followers + 1), for messages */
    /* optional: called by put and get, on the caller's thread, each time the
     * call begins to wait for another member (0: the leader), so that the
     * caller can tell its waits for a rank apart (the heartbeats, the hang
     * dumps); the call returns when the wait is over.  It must not block. */
    void (*on_wait)(void *ctx, int member);
    void *wait_ctx;
    /* optional: asked, with wait_ctx, at least every 0.2 s while a call waits; nonzero ends
     * the wait at once (MS_ERR_IO "...: given up waiting for ..."): the caller's other
     * communication failed meanwhile, and the member waited for will not come (before, a
     * follower of a hung leader waited out its whole timeout after its peers' collective had
     * already timed out: twice the time to detect).  It must not block. */
    int (*give_up)(void *ctx);
} data_shm_config;

ms_status data_shm_open_leader(data_shm **out, const data_shm_config *cfg);
ms_status data_shm_open_follower(data_shm **out, const data_shm_config *cfg);
/* Leader: publish the next batch; *wait_sec (may be NULL) gets the time
 * spent waiting for a follower to free the oldest slot. */
ms_status data_shm_put(data_shm *s, const int32_t *inputs, const int32_t *targets,
                       double *wait_sec);
/* Follower: copy the next batch; *wait_sec gets the time spent waiting. */
ms_status data_shm_get(data_shm *s, int32_t *inputs, int32_t *targets, double *wait_sec);
/* Leader, once every follower has opened the segment: remove its name now,
 * so that nothing is left in /dev/shm if the processes are killed (the
 * mappings stay valid). */
void data_shm_unlink(data_shm *s);
/* Detach (the leader also unlinks the name, if not done already). */
void data_shm_close(data_shm *s);

#endif
