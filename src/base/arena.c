/* arena.c - bump allocation of aligned views inside one buffer. */
#include "base/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/status.h"

void ms_arena_init(ms_arena *a, void *base, size_t cap) {
    a->base = base;
    a->cap = cap;
    a->used = 0;
}

void *ms_arena_push(ms_arena *a, size_t bytes) {
    MS_CHECKF(a->used <= SIZE_MAX - MS_ARENA_ALIGN, "arena overflow: %zu bytes used", a->used);
    size_t off = (a->used + MS_ARENA_ALIGN - 1) & ~(size_t)(MS_ARENA_ALIGN - 1);
    /* off + bytes must not wrap below cap (a view past the buffer) */
    MS_CHECKF(bytes <= SIZE_MAX - MS_ARENA_ALIGN - off, "arena overflow: %zu + %zu bytes", off,
              bytes);
    a->used = off + bytes;
    if (!a->base) return (void *)(uintptr_t)(off + MS_ARENA_ALIGN); /* sizing pass */
    MS_CHECKF(a->used <= a->cap, "arena overflow: %zu > %zu bytes", a->used, a->cap);
    return a->base + off;
}

size_t ms_arena_used(const ms_arena *a) {
    return a->used;
}

/* Buffers of at least this size ask for transparent huge pages (2 MB). */
#define MS_HUGE_MIN ((size_t)8 << 20)
#define MS_HUGE_PAGE ((size_t)2 << 20)

/* bytes rounded up to what ms_alloc_aligned_raw allocates; 0 if that
 * does not fit a size_t (the rounding wrapped to a small block) */
static size_t alloc_size(size_t bytes) {
    if (bytes > SIZE_MAX - MS_HUGE_PAGE) return 0;
    size_t n = (bytes + MS_ARENA_ALIGN - 1) & ~(size_t)(MS_ARENA_ALIGN - 1);
    return n >= MS_HUGE_MIN ? (n + MS_HUGE_PAGE - 1) & ~(MS_HUGE_PAGE - 1) : n;
}

void *ms_alloc_aligned_raw(size_t bytes) {
    size_t n = alloc_size(bytes);
    if (n == 0 && bytes > 0) return NULL; /* too large for any allocation */
    if (n >= MS_HUGE_MIN) {
        /* Aligned to a huge page, and advised as such before the first
         * touch: the first touch then faults in 2 MB pages instead of 4 KB
         * ones (a 124M-parameter model's 2.4 GB is 600,000 faults), and the
         * streaming passes (the optimizer) miss the TLB less.  Where THP is
         * off the advice is ignored. */
        void *p = NULL;
        if (posix_memalign(&p, MS_HUGE_PAGE, n) != 0) return NULL;
        madvise(p, n, MADV_HUGEPAGE);
        return p;
    }
    return aligned_alloc(MS_ARENA_ALIGN, n ? n : MS_ARENA_ALIGN);
}

void *ms_alloc_aligned(size_t bytes) {
    void *p = ms_alloc_aligned_raw(bytes);
    if (p) memset(p, 0, alloc_size(bytes));
    return p;
}

void ms_free_aligned(void *p) {
    free(p);
}
