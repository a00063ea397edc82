/* prefetch.c - a producer thread and a ring of batches. */
#include "data/prefetch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/events.h"
#include "base/timeutil.h"

typedef struct {
    int32_t *inp, *tgt;
    data_cursor after; /* loader cursor after this batch */
    ms_status st;
    char *msg; /* error message when st != MS_OK */
} slot;

struct data_prefetch {
    data_loader *dl;
    int B, T, depth;
    slot *ring;
    uint64_t produced, consumed; /* batches; slot = index % depth */
    int stop, failed;
    data_cursor last;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *producer(void *arg) {
    data_prefetch *p = arg;
    static _Atomic uint16_t c_lane, c_load;
    ms_ev_thread_init(ms_ev_id(&c_lane, "data"));
    uint16_t load = ms_ev_id(&c_load, "load");
    pthread_mutex_lock(&p->mu);
    while (!p->stop && !p->failed) {
        if (p->produced - p->consumed == (uint64_t)p->depth) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        slot *s = &p->ring[p->produced % (uint64_t)p->depth];
        pthread_mutex_unlock(&p->mu); /* read without the lock: this slot is ours */
        int64_t t0 = ms_ev_now();
        s->st = data_loader_next(p->dl, s->inp, s->tgt);
        ms_ev_span(load, 0, t0, ms_ev_now(), NULL);
        s->after = data_loader_cursor(p->dl);
        if (s->st != MS_OK) s->msg = strdup(ms_errmsg());
        pthread_mutex_lock(&p->mu);
        if (s->st != MS_OK) p->failed = 1;
        p->produced++;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ms_status data_prefetch_start(data_prefetch **out, data_loader *dl, int B, int T, int depth) {
    *out = NULL;
    if (depth < 1) depth = 1;
    data_prefetch *p = calloc(1, sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "prefetch: out of memory");
    p->dl = dl;
    p->B = B;
    p->T = T;
    p->depth = depth;
    p->last = data_loader_cursor(dl);
    p->ring = calloc((size_t)depth, sizeof *p->ring);
    size_t n = (size_t)B * T;
    for (int i = 0; p->ring && i < depth; i++) {
        p->ring[i].inp = malloc(n * sizeof(int32_t));
        p->ring[i].tgt = malloc(n * sizeof(int32_t));
        if (!p->ring[i].inp || !p->ring[i].tgt) goto nomem;
    }
    if (!p->ring) goto nomem;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, producer, p) != 0) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        goto nomem;
    }
    *out = p;
    return MS_OK;
nomem:
    for (int i = 0; p->ring && i < depth; i++) {
        free(p->ring[i].inp);
        free(p->ring[i].tgt);
    }
    free(p->ring);
    free(p);
    return ms_error(MS_ERR_NOMEM, "prefetch: cannot allocate %d batches or start the thread", depth);
}

ms_status data_prefetch_next(data_prefetch *p, int32_t *inputs, int32_t *targets,
                             double *wait_sec) {
    double t0 = ms_now();
    pthread_mutex_lock(&p->mu);
    while (p->produced == p->consumed) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    if (wait_sec) *wait_sec = ms_now() - t0;
    slot *s = &p->ring[p->consumed % (uint64_t)p->depth];
    ms_status st = s->st;
    if (st != MS_OK) {
        ms_error(st, "%s", s->msg ? s->msg : "data loader failed");
        return st; /* the failed slot stays: every later call fails the same way */
    }
    size_t n = (size_t)p->B * p->T;
    memcpy(inputs, s->inp, n * sizeof(int32_t));
    memcpy(targets, s->tgt, n * sizeof(int32_t));
    p->last = s->after;
    pthread_mutex_lock(&p->mu);
    p->consumed++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return MS_OK;
}

data_cursor data_prefetch_cursor(const data_prefetch *p) { return p->last; }

void data_prefetch_stop(data_prefetch *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    /* batches still in the ring are read again; the loader made this cursor */
    MS_CHECK(data_loader_seek(p->dl, p->last) == MS_OK);
    for (int i = 0; i < p->depth; i++) {
        free(p->ring[i].inp);
        free(p->ring[i].tgt);
        free(p->ring[i].msg);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->ring);
    free(p);
}
