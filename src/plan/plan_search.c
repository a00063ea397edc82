/* plan_search.c - the layouts that fit, ranked by iteration time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"
#include "plan/plan.h"

static int by_iter(const void *a, const void *b) {
    double x = ((const plan_candidate *)a)->result.iter_s;
    double y = ((const plan_candidate *)b)->result.iter_s;
    return x < y ? -1 : x > y;
}

/* Keep the best `max` of *n candidates in out (sorted), adding one. */
static void keep(plan_candidate *out, int max, int *n, const plan_candidate *c) {
    if (*n < max) {
        out[(*n)++] = *c;
    } else if (c->result.iter_s < out[max - 1].result.iter_s) {
        out[max - 1] = *c;
    } else {
        return;
    }
    qsort(out, (size_t)*n, sizeof *out, by_iter);
}

/* A layout refused for a reason other than the batch: counted, the first one's message kept. */
static void refuse(plan_search_tally *t) {
    if (!t->refused++) snprintf(t->refused_why, sizeof t->refused_why, "%s", ms_errmsg());
}

ms_status plan_search(const plan_model *m, const plan_layout *base, const plan_features *f,
                      const plan_cluster *c, int max_vpp, int max_micro, plan_candidate *out,
                      int max, plan_search_tally *t, plan_candidate *smallest) {
    memset(t, 0, sizeof *t);
    if (max < 1) return ms_error(MS_ERR_ARG, "plan search: room for no result");
    MS_TRY(plan_cluster_check(c, c->name));
    int small_memory_only = 0; /* *smallest has only its memory parts yet */
    /* a job on one node may split it any way; across nodes a tp group stays on one host */
    int one_node = base->gpus <= c->gpus_per_node;
    for (int tp = 1; tp <= m->heads && tp <= c->gpus_per_node; tp++) {
        /* a tp of the search's own divides the node; one given is taken as it is */
        if (m->heads % tp || (base->tp ? tp != base->tp : !one_node && c->gpus_per_node % tp))
            continue;
        /* products in 64 bits: --tp, --pp and --vpp go up to 65536 each */
        for (int pp = 1; pp <= m->layers && (long long)tp * pp <= base->gpus; pp++) {
            if (m->layers % pp || base->gpus % ((long long)tp * pp) || (base->pp && pp != base->pp))
                continue;
            long long dp = base->gpus / ((long long)tp * pp);
            int top_vpp = base->vpp ? base->vpp : pp > 1 ? max_vpp : 1;
            for (int vpp = base->vpp ? base->vpp : 1; vpp <= top_vpp; vpp++) {
                if (m->layers % ((long long)pp * vpp)) continue;
                int micro0 = base->micro ? base->micro : 1,
                    top_micro = base->micro ? micro0 : max_micro;
                /* doubled in 64 bits: 2^30 x 2 is past int (it wrapped to 0, for ever) */
                for (long long micro = micro0; micro <= top_micro; micro *= 2) {
                    plan_candidate cand = {.layout = *base};
                    cand.layout.tp = tp, cand.layout.pp = pp, cand.layout.vpp = vpp;
                    cand.layout.micro = (int)micro;
                    if (plan_check(m, &cand.layout) != MS_OK) {
                        if (plan_over_cap(m, &cand.layout))
                            t->over_cap++;
                        else if (base->batch % (dp * micro) == 0)
                            refuse(t);
                        continue;
                    }
                    /* a layout the trainer refuses is no candidate (--recompute ln with tp,
                     * its message tags) */
                    if (plan_check_features(f, &cand.layout) != MS_OK) {
                        refuse(t);
                        continue;
                    }
                    /* the memory first: the step (a pipeline simulation) only for a layout
                     * that fits, or, once the search is over, the smallest */
                    ms_status st = plan_memory(m, &cand.layout, f, c, &cand.result);
                    if (st == MS_OK && cand.result.fits)
                        st = plan_predict(m, &cand.layout, f, c, &cand.result);
                    if (st == MS_ERR_NOMEM) return st;
                    if (st != MS_OK) continue;
                    if (smallest &&
                        (!t->tried || cand.result.memory_gb < smallest->result.memory_gb))
                        *smallest = cand, small_memory_only = !cand.result.fits;
                    t->tried++;
                    if (cand.result.fits) keep(out, max, &t->n, &cand), t->fit++;
                }
            }
        }
    }
    if (small_memory_only) return plan_predict(m, &smallest->layout, f, c, &smallest->result);
    return MS_OK;
}
