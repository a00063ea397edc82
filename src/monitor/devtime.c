/* devtime.c - device spans read late (see devtime.h). */
#include "monitor/devtime.h"

#include <stdlib.h>

#define DEV_PENDING 256 /* spans in flight */
#define DEV_NAMES 16    /* names whose last duration is kept */

typedef struct {
    int h0, h1;
    int64_t t0; /* h0's time once polled; -1 before */
    uint16_t name;
    ms_ev_args a;
    int has_args;
} dev_span;

struct mon_devtime {
    be_backend *be;
    int emit;
    uint16_t lane;
    dev_span q[DEV_PENDING]; /* ring, oldest at head */
    int head, n;
    struct {
        uint16_t name;
        double ms;
    } last[DEV_NAMES];
    int n_last;
};

ms_status mon_devtime_create(mon_devtime **out, be_backend *be, int emit) {
    mon_devtime *d = calloc(1, sizeof *d);
    if (!d) return ms_error(MS_ERR_NOMEM, "device timers: out of memory");
    d->be = be;
    d->emit = emit;
    d->lane = ms_ev_intern("device");
    *out = d;
    return MS_OK;
}

int mon_devtime_mark(mon_devtime *d) {
    return d->be->ev_record(d->be);
}

/* Give a handle back (its span is dropped).  A pending CUDA event cannot be
 * given back before it completes; one that is not yet done stays in the
 * pool's hands until the backend is destroyed (this happens only when more
 * than DEV_PENDING spans are in flight, i.e. never in a healthy run). */
static void release(mon_devtime *d, int h) {
    int64_t t;
    if (h >= 0) (void)d->be->ev_poll(d->be, h, &t);
}

void mon_devtime_span(mon_devtime *d, uint16_t name, int h0, int h1, const ms_ev_args *a) {
    if (d->n == DEV_PENDING) mon_devtime_poll(d);
    if (h0 < 0 || h1 < 0 || d->n == DEV_PENDING) { /* lost: give the handles back */
        release(d, h0);
        release(d, h1);
        return;
    }
    dev_span *s = &d->q[(d->head + d->n++) % DEV_PENDING];
    *s = (dev_span){h0, h1, -1, name, {0}, a != NULL};
    if (a) s->a = *a;
}

static void keep_last(mon_devtime *d, uint16_t name, double ms) {
    for (int i = 0; i < d->n_last; i++)
        if (d->last[i].name == name) {
            d->last[i].ms = ms;
            return;
        }
    if (d->n_last < DEV_NAMES) {
        d->last[d->n_last].name = name;
        d->last[d->n_last++].ms = ms;
    }
}

void mon_devtime_poll(mon_devtime *d) {
    while (d->n) {
        dev_span *s = &d->q[d->head];
        int64_t t1;
        if (s->t0 < 0 && !d->be->ev_poll(d->be, s->h0, &s->t0)) {
            s->t0 = -1;
            break;
        }
        if (!d->be->ev_poll(d->be, s->h1, &t1)) break;
        keep_last(d, s->name, (double)(t1 - s->t0) / 1e6);
        if (d->emit) ms_ev_span(s->name, d->lane, s->t0, t1, s->has_args ? &s->a : NULL);
        d->head = (d->head + 1) % DEV_PENDING;
        d->n--;
    }
    d->be->ev_anchor(d->be);
}

double mon_devtime_last_ms(const mon_devtime *d, uint16_t name) {
    for (int i = 0; i < d->n_last; i++)
        if (d->last[i].name == name) return d->last[i].ms;
    return 0;
}

void mon_devtime_destroy(mon_devtime *d) {
    if (!d) return;
    free(d);
}
