/* prefetch.h - asynchronous batches: a background thread fills a ring of
 * `depth` batches ahead of the training step from a data_loader, so reading
 * and checking tokens overlaps with compute.
 *
 * The prefetcher borrows the loader (the thread is its only user until
 * data_prefetch_stop).  data_prefetch_cursor is the loader cursor just after
 * the last batch handed out, which is what a checkpoint must store: the
 * batches still in the ring are read again after a resume.  An error in
 * the thread (a bad token, an unreadable shard) is returned by the
 * data_prefetch_next call that would have received that batch, with the
 * thread's message.  One consumer thread.
 */
#ifndef DATA_PREFETCH_H
#define DATA_PREFETCH_H

#include <stdint.h>

#include "data/loader.h"

typedef struct data_prefetch data_prefetch;

ms_status data_prefetch_start(data_prefetch **out, data_loader *dl, int B, int T, int depth);
/* Copy the next batch into inputs/targets ((B,T) int32 each); *wait_sec
 * receives how long the caller waited for it (0 when it was ready). */
ms_status data_prefetch_next(data_prefetch *p, int32_t *inputs, int32_t *targets, double *wait_sec);
data_cursor data_prefetch_cursor(const data_prefetch *p);
/* Stop and join the thread; the loader may be used directly again. */
void data_prefetch_stop(data_prefetch *p);

#endif
