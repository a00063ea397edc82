/* test_schedule_slots.c - the activation sets a pipeline stage allocates
 * (par_schedule_slots) against its instruction lists: over a grid of every
 * valid (kind, pp, vpp, n_micro), replaying each stage's list, no two
 * (mb, chunk) pairs alive at once (from the first instruction touching them,
 * e.g. an early receive into their input, until their BWD) share a set, no
 * set index reaches what was allocated (activations in flight never exceed
 * the allocation), and the count stays within the validator's max
 * activations in flight plus one early receive; for both communication
 * modes (the blocking lists post receives later, so they need no more).
 * Also the errors on a broken list. */
#include <stdlib.h>

#include "check.h"
#include "parallel/schedule.h"

/* Replay stage s's list with its slots; returns 1 if the slots are sound. */
static int replay(const par_instr *list, int n, int vpp, int n_micro, const int *slot,
                  int n_slots) {
    int pairs = vpp * n_micro, okay = 1;
    int *owner = malloc(sizeof(int) * (size_t)pairs); /* owner[k]: the pair in set k */
    char *done = calloc((size_t)pairs, 1);
    for (int i = 0; i < pairs; i++)
        owner[i] = -1;
    for (int i = 0; i < n; i++) {
        int p = list[i].mb * vpp + list[i].chunk, k = slot[p];
        if (k < 0 || k >= n_slots) {
            okay = 0;
            break;
        }
        int *o = &owner[k];
        if (done[p]) continue; /* only send buffers after the BWD */
        if (*o != -1 && *o != p) okay = 0;
        *o = p;
        if (list[i].op == PAR_BWD) *o = -1, done[p] = 1;
    }
    free(owner);
    free(done);
    return okay;
}

static void test_grid(void) {
    int checked = 0;
    for (int comm = 0; comm < 2; comm++) /* PAR_COMM_OVERLAP, PAR_COMM_BLOCKING */
        for (int kind = 0; kind < 2; kind++)
            for (int pp = 1; pp <= 6; pp++)
                for (int vpp = 1; vpp <= 4; vpp++)
                    for (int m = 1; m <= 12; m++) {
                        if (par_schedule_check_args(kind, pp, vpp, m) != MS_OK) continue;
                        par_plan plan;
                        T_EQ_INT(par_plan_build_comm(kind, (par_comm)comm, pp, vpp, m, &plan),
                                 MS_OK);
                        int inflight[8];
                        T_EQ_INT(par_schedule_validate(&plan, 1, 2, NULL, inflight), MS_OK);
                        for (int s = 0; s < pp; s++) {
                            int slot[4 * 12], total = 0;
                            T_EQ_INT(par_schedule_slots(plan.lists[s], plan.lens[s], vpp, m, slot,
                                                        &total),
                                     MS_OK);
                            int sound = replay(plan.lists[s], plan.lens[s], vpp, m, slot, total);
                            /* at most one receive posted ahead of its FWD */
                            int bounded = total >= inflight[s] && total <= inflight[s] + 1;
                            if (!sound || !bounded)
                                fprintf(stderr,
                                        "%s%s pp %d vpp %d m %d stage %d: sets %d, in flight %d\n",
                                        par_sched_kind_name(kind), comm ? " blocking" : "", pp, vpp,
                                        m, s, total, inflight[s]);
                            T_OK(sound);
                            T_OK(bounded);
                            checked++;
                        }
                        par_plan_free(&plan);
                    }
    T_OK(checked > 200);
}

static void test_errors(void) {
    par_instr *list;
    int n, slot[4], n_slots;
    T_EQ_INT(par_schedule(PAR_SCHED_1F1B, 2, 1, 4, 0, &list, &n), MS_OK);
    for (int i = 0; i < n; i++) /* drop the BWD of mb 2 */
        if (list[i].op == PAR_BWD && list[i].mb == 2) list[i].op = PAR_FWD;
    T_EQ_INT(par_schedule_slots(list, n, 1, 4, slot, &n_slots), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "never reaches its BWD");
    list[0].mb = 9;
    T_EQ_INT(par_schedule_slots(list, n, 1, 4, slot, &n_slots), MS_ERR_ARG);
    free(list);
    /* a BWD repeated (mb 0's, in place of mb 3's, the last): refused (before, the repeat
     * passed and freed the slot another live pair held) */
    T_EQ_INT(par_schedule(PAR_SCHED_1F1B, 2, 1, 4, 0, &list, &n), MS_OK);
    int last = -1;
    for (int i = 0; i < n; i++)
        if (list[i].op == PAR_BWD) last = i;
    T_OK(last >= 0);
    list[last].mb = 0;
    for (int i = 0; i < n; i++) /* mb 3 then needs no BWD: give it mb 0's other work too */
        if (list[i].mb == 3 && i != last) list[i].mb = 0;
    T_EQ_INT(par_schedule_slots(list, n, 1, 4, slot, &n_slots), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "twice");
    free(list);
}

int main(void) {
    test_grid();
    test_errors();
    return ms_test_summary("test_schedule_slots");
}
