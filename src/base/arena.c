/* arena.c - bump allocation of aligned views inside one buffer. */
#include "base/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

void ms_arena_init(ms_arena *a, void *base, size_t cap) {
    a->base = base;
    a->cap = cap;
    a->used = 0;
}

void *ms_arena_push(ms_arena *a, size_t bytes) {
    size_t off = (a->used + MS_ARENA_ALIGN - 1) & ~(size_t)(MS_ARENA_ALIGN - 1);
    a->used = off + bytes;
    if (!a->base) return (void *)(uintptr_t)(off + MS_ARENA_ALIGN); /* sizing pass */
    MS_CHECKF(a->used <= a->cap, "arena overflow: %zu > %zu bytes", a->used, a->cap);
    return a->base + off;
}

size_t ms_arena_used(const ms_arena *a) {
    return a->used;
}

void *ms_alloc_aligned(size_t bytes) {
    size_t n = (bytes + MS_ARENA_ALIGN - 1) & ~(size_t)(MS_ARENA_ALIGN - 1);
    void *p = aligned_alloc(MS_ARENA_ALIGN, n ? n : MS_ARENA_ALIGN);
    if (p) memset(p, 0, n);
    return p;
}

void ms_free_aligned(void *p) {
    free(p);
}
