/* arena.h - bump allocation of views inside one large buffer.
 *
 * The model computes the layout of parameters / gradients / activations once
 * ("few, large allocations"): run the same sequence of ms_arena_push calls on
 * an arena with base == NULL to size it, allocate one buffer of
 * ms_arena_used() bytes (on any device), then run the sequence again on an
 * arena over that buffer.  Pushes are aligned to MS_ARENA_ALIGN bytes.
 * The arena never owns its memory.  Not thread-safe.
 */
#ifndef MS_ARENA_H
#define MS_ARENA_H

#include <stddef.h>

#define MS_ARENA_ALIGN 64

typedef struct {
    char *base;  /* NULL while sizing */
    size_t cap;  /* capacity in bytes; ignored while sizing */
    size_t used; /* bytes handed out so far, including alignment padding */
} ms_arena;

void ms_arena_init(ms_arena *a, void *base, size_t cap);
/* Returns an aligned pointer to `bytes` bytes (base + offset; a fake non-NULL
 * offset pointer while sizing).  Aborts if the arena is full: running out is
 * a layout bug, not a run-time condition. */
void *ms_arena_push(ms_arena *a, size_t bytes);
size_t ms_arena_used(const ms_arena *a);

/* Host allocation helpers: 64-byte aligned, zeroed; NULL on failure.  From
 * 8 MB on, 2 MB aligned and advised as transparent huge pages (fewer
 * faults at start-up, fewer TLB misses in the streaming passes). */
void *ms_alloc_aligned(size_t bytes);
/* The same not zeroed, for a caller that touches its pages first where they
 * are used (a parallel fill: each thread faults in its own part). */
void *ms_alloc_aligned_raw(size_t bytes);
void ms_free_aligned(void *p);

#endif
