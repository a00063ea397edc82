/* schedule_slots.c - activation sets ("slots") for one stage's instruction
 * list (see par_schedule_slots in schedule.h).
 *
 * A (mb, chunk) pair holds a slot of its chunk from the first instruction
 * that touches it (RECV_ACT posted early into the slot's input, or its FWD
 * on the first global chunk) until its BWD has run; later instructions of
 * the pair (SEND_GRAD, WAITs) only use the chunk's send buffers.  Slots are
 * one pool for all local chunks (every chunk holds the same number of
 * blocks, so a set fits any of them), taken lowest-free-first: the count is
 * the most pairs alive at once, early receives included. */
#include <stdlib.h>

#include "parallel/schedule.h"

ms_status par_schedule_slots(const par_instr *list, int n, int vpp, int n_micro, int *slot,
                             int *n_slots) {
    int pairs = vpp * n_micro;
    /* busy[k]: set k is taken */
    char *busy = calloc((size_t)pairs, 1);
    char *freed = calloc((size_t)pairs, 1);
    if (!busy || !freed) {
        free(busy);
        free(freed);
        return ms_error(MS_ERR_NOMEM, "pipeline slots: out of memory");
    }
    for (int i = 0; i < pairs; i++)
        slot[i] = -1;
    *n_slots = 0;
    ms_status st = MS_OK;
    for (int i = 0; i < n && st == MS_OK; i++) {
        const par_instr *in = &list[i];
        if (in->mb < 0 || in->mb >= n_micro || in->chunk < 0 || in->chunk >= vpp) {
            st = ms_error(MS_ERR_ARG, "pipeline slots: instruction %d names mb %d chunk %d", i,
                          in->mb, in->chunk);
            break;
        }
        int p = in->mb * vpp + in->chunk, c = in->chunk;
        char *b = busy;
        if (slot[p] < 0 && !freed[p]) {
            int k = 0;
            while (b[k])
                k++;
            b[k] = 1;
            slot[p] = k;
            if (k + 1 > *n_slots) *n_slots = k + 1;
        }
        if (in->op == PAR_BWD) {
            if (freed[p]) { /* (its slot stays named: it is the result) */
                st = ms_error(MS_ERR_ARG, "pipeline slots: BWD(mb=%d,c=%d) twice", in->mb, c);
                break;
            }
            b[slot[p]] = 0;
            freed[p] = 1;
        }
    }
    for (int p = 0; p < pairs && st == MS_OK; p++)
        if (!freed[p])
            st = ms_error(MS_ERR_ARG, "pipeline slots: (mb=%d,c=%d) never reaches its BWD", p / vpp,
                          p % vpp);
    free(busy);
    free(freed);
    return st;
}
