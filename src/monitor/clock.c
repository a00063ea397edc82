/* clock.c - the clock reference for merged timelines (mon_clock_sync).
 *
 * Rank 0's monotonic clock is the reference.  Each other rank in turn does
 * `pings` round trips with rank 0 (as NTP and veScale's ndtimeline do):
 * it sends its time t1, rank 0 answers with its time t0, and the rank reads
 * t2 on arrival.  Assuming the two legs take equally long, rank 0's clock
 * read t0 at local (t1 + t2) / 2, so offset = t0 - (t1 + t2) / 2, within
 * +- (t2 - t1) / 2; the round trip with the smallest delay wins.  Ranks
 * are served one after the other so rank 0 answers without queueing.
 */
#include <stdint.h>

#include "base/events.h"
#include "monitor/evlog.h"

#define CLOCK_TAG 32001 /* on the world group; no other p2p uses it */

static ms_status serve(comm_group *g, int pings) {
    int n = comm_group_size(g);
    for (int r = 1; r < n; r++)
        for (int k = 0; k < pings; k++) {
            long long t1 = 0, t0;
            MS_TRY(comm_recv(g, &t1, 1, COMM_I64, r, CLOCK_TAG));
            t0 = ms_ev_now();
            MS_TRY(comm_send(g, &t0, 1, COMM_I64, r, CLOCK_TAG));
        }
    return MS_OK;
}

static ms_status ask(comm_group *g, int pings, long long *offset, long long *err) {
    long long best = -1;
    for (int k = 0; k < pings; k++) {
        long long t1 = ms_ev_now(), t0 = 0;
        MS_TRY(comm_send(g, &t1, 1, COMM_I64, 0, CLOCK_TAG));
        MS_TRY(comm_recv(g, &t0, 1, COMM_I64, 0, CLOCK_TAG));
        long long t2 = ms_ev_now();
        if (best < 0 || t2 - t1 < best) {
            best = t2 - t1;
            *offset = t0 - (t1 + t2) / 2;
            *err = (t2 - t1 + 1) / 2;
        }
    }
    return MS_OK;
}

ms_status mon_clock_sync(comm_world *w, int pings, long long *offset_ns, long long *err_ns,
                         long long *err_max_ns) {
    comm_group *g = comm_world_group(w);
    long long off = 0, err = 0;
    if (pings < 1) pings = 1;
    int64_t t = ms_ev_now();
    if (comm_group_rank(g) == 0)
        MS_TRY(serve(g, pings));
    else
        MS_TRY(ask(g, pings, &off, &err));
    ms_ev_clock(t, off, err);
    long long emax = err;
    MS_TRY(comm_allreduce(g, &emax, &emax, 1, COMM_I64, COMM_MAX));
    if (offset_ns) *offset_ns = off;
    if (err_ns) *err_ns = err;
    if (err_max_ns) *err_max_ns = emax;
    return MS_OK;
}
