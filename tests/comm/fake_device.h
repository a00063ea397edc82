/* fake_device.h - a comm_device (comm.h) for tests on machines without a
 * GPU.  Its "device memory" is host memory handed out by fake_dev_alloc,
 * which is_device recognises; the copies are memcpy, counted (calls and
 * bytes) and checked (to_host must read device memory into a pinned buffer,
 * to_device the reverse); pinned buffers are malloc'd and counted.  Staging
 * buffers are poisoned (0xFF bytes: NaN in f32 and bf16) when allocated and
 * right after their data was copied back to the device, so a result read
 * from a stale or reused staging buffer shows.  Every hook also records
 * whether it ran on the thread that made the fake (the communication thread
 * must never call one).  Single header, static functions: include it from
 * one test program.
 */
#ifndef MS_TEST_FAKE_DEVICE_H
#define MS_TEST_FAKE_DEVICE_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

typedef struct {
    char *p;
    size_t n;
} fake_range;

typedef struct {
    pthread_mutex_t mu;
    pthread_t owner;
    fake_range *dev, *pin;
    int ndev, npin, cap_dev, cap_pin;
    /* counters */
    long to_host, to_device, bytes_to_host, bytes_to_device;
    long host_allocs, host_frees, is_device_calls;
    long wrong_thread; /* hooks called on another thread than the owner */
    long bad_copy;     /* a copy whose source / destination is not what it should be */
    int fail_allocs;   /* > 0: the next host_alloc calls fail */
} fake_dev;

static void fake_note_thread(fake_dev *f) {
    if (!pthread_equal(pthread_self(), f->owner)) f->wrong_thread++;
}

static void fake_add(fake_range **a, int *n, int *cap, void *p, size_t len) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *a = realloc(*a, (size_t)*cap * sizeof **a);
        if (!*a) abort();
    }
    (*a)[(*n)++] = (fake_range){p, len};
}

static int fake_del(fake_range *a, int *n, void *p) {
    for (int i = 0; i < *n; i++)
        if (a[i].p == p) {
            a[i] = a[--*n];
            return 1;
        }
    return 0;
}

/* 1 if [p, p+len) lies inside one range of a. */
static int fake_inside(const fake_range *a, int n, const void *p, size_t len) {
    const char *c = p;
    for (int i = 0; i < n; i++)
        if (c >= a[i].p && c + len <= a[i].p + a[i].n) return 1;
    return 0;
}

/* ---- the hooks ----------------------------------------------------------- */

static int fake_is_device(void *ctx, const void *p) {
    fake_dev *f = ctx;
    pthread_mutex_lock(&f->mu);
    fake_note_thread(f);
    f->is_device_calls++;
    int r = fake_inside(f->dev, f->ndev, p, 1);
    pthread_mutex_unlock(&f->mu);
    return r;
}

static void fake_to_host(void *ctx, void *dst, const void *src, size_t n) {
    fake_dev *f = ctx;
    pthread_mutex_lock(&f->mu);
    fake_note_thread(f);
    f->to_host++;
    f->bytes_to_host += (long)n;
    if (!fake_inside(f->dev, f->ndev, src, n) || !fake_inside(f->pin, f->npin, dst, n))
        f->bad_copy++;
    pthread_mutex_unlock(&f->mu);
    memcpy(dst, src, n);
}

static void fake_to_device(void *ctx, void *dst, const void *src, size_t n) {
    fake_dev *f = ctx;
    pthread_mutex_lock(&f->mu);
    fake_note_thread(f);
    f->to_device++;
    f->bytes_to_device += (long)n;
    if (!fake_inside(f->dev, f->ndev, dst, n) || !fake_inside(f->pin, f->npin, src, n))
        f->bad_copy++;
    pthread_mutex_unlock(&f->mu);
    memcpy(dst, src, n);
    memset((void *)src, 0xFF, n); /* used up: poison */
}

static void *fake_host_alloc(void *ctx, size_t n) {
    fake_dev *f = ctx;
    pthread_mutex_lock(&f->mu);
    fake_note_thread(f);
    void *p = NULL;
    if (f->fail_allocs > 0) {
        f->fail_allocs--;
    } else if ((p = malloc(n ? n : 1)) != NULL) {
        memset(p, 0xFF, n);
        fake_add(&f->pin, &f->npin, &f->cap_pin, p, n);
        f->host_allocs++;
    }
    pthread_mutex_unlock(&f->mu);
    return p;
}

static void fake_host_free(void *ctx, void *p) {
    fake_dev *f = ctx;
    pthread_mutex_lock(&f->mu);
    fake_note_thread(f);
    if (fake_del(f->pin, &f->npin, p))
        f->host_frees++;
    else
        f->bad_copy++; /* freeing something host_alloc never gave */
    pthread_mutex_unlock(&f->mu);
    free(p);
}

/* ---- for the test ---------------------------------------------------------- */

/* Set up f (owned by the calling thread) and the hook table pointing at it. */
static inline void fake_dev_init(fake_dev *f, comm_device *d) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    f->owner = pthread_self();
    d->ctx = f;
    d->is_device = fake_is_device;
    d->to_host = fake_to_host;
    d->to_device = fake_to_device;
    d->host_alloc = fake_host_alloc;
    d->host_free = fake_host_free;
}

/* n bytes of "device memory" (abort on failure). */
static inline void *fake_dev_alloc(fake_dev *f, size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    pthread_mutex_lock(&f->mu);
    fake_add(&f->dev, &f->ndev, &f->cap_dev, p, n ? n : 1);
    pthread_mutex_unlock(&f->mu);
    return p;
}

static inline void fake_dev_free(fake_dev *f, void *p) {
    if (!p) return;
    pthread_mutex_lock(&f->mu);
    int ok = fake_del(f->dev, &f->ndev, p);
    pthread_mutex_unlock(&f->mu);
    if (!ok) abort();
    free(p);
}

/* Free the registries (every buffer must have been freed). */
static inline void fake_dev_destroy(fake_dev *f) {
    free(f->dev);
    free(f->pin);
    pthread_mutex_destroy(&f->mu);
}

#endif
