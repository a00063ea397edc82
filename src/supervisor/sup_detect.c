/* sup_detect.c - the detectors the beats feed (docs/operations.md, "The
 * supervisor"): the longest recent step (the no-progress limit's base), a loss spike (a z-score of
 * the change of rank 0's loss from the step before, against the changes of the last
 * SUP_SPIKE_WINDOW steps, so a loss that falls fast is not a spike) and a straggler (a rank whose
 * compute time per step is well above the others' of its pipeline stage, round after round: the
 * compute-span score of `megascale trace stragglers`, live). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor/sup_internal.h"

#define SPIKE_MIN_HISTORY 16

int sup_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, sup_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void sup_interval_feed(sup_interval *v, int step, double seconds) {
    int k = step / SUP_INTERVAL_WINDOW;
    if (k > v->bucket) {
        if (v->cur > 0) v->prev = v->cur; /* a bucket with no step timed forgets nothing */
        v->cur = 0;
        v->bucket = k;
    }
    if (seconds > v->cur) v->cur = seconds;
}

double sup_interval_max(const sup_interval *v) {
    return fmax(v->cur, v->prev);
}

double sup_spike_feed(sup_spike *s, int step, double loss, double z_max, double *mean, double *sd) {
    if (step <= s->last_step || !isfinite(loss)) return 0;
    s->last_step = step;
    int have_prev = s->have_prev;
    double d = loss - s->prev; /* the step-to-step change: a falling loss is not a spike */
    s->prev = loss;
    s->have_prev = 1;
    if (!have_prev) return 0;
    if (s->skip_next) { /* the fall back after a spike is not the new normal either */
        s->skip_next = 0;
        return 0;
    }
    double z = 0, m = 0, v = 0;
    if (s->n >= SPIKE_MIN_HISTORY) {
        /* a robust z-score: the median and the median absolute deviation
         * (x 1.4826, the standard deviation of a normal), so the large
         * changes of the first steps do not hide a later spike */
        double t[SUP_SPIKE_WINDOW];
        memcpy(t, s->v, sizeof(double) * (size_t)s->n);
        m = median(t, s->n);
        for (int i = 0; i < s->n; i++)
            t[i] = fabs(s->v[i] - m);
        v = 1.4826 * median(t, s->n);
        /* a floor on the spread: a flat loss must not make noise a spike */
        double floor = 1e-3 * fabs(loss) + 1e-6;
        z = (d - m) / (v > floor ? v : floor);
    }
    if (mean) *mean = loss - d; /* the loss it jumped from */
    if (sd) *sd = v;
    if (z > z_max) {
        s->skip_next = 1;
        return z; /* a spike stays out of the window */
    }
    s->v[s->next] = d;
    s->next = (s->next + 1) % SUP_SPIKE_WINDOW;
    if (s->n < SUP_SPIKE_WINDOW) s->n++;
    return 0;
}

int sup_straggler_init(sup_straggler *s, int n) {
    memset(s, 0, sizeof *s);
    s->n = n;
    s->compute = calloc((size_t)n, sizeof *s->compute);
    s->step = calloc((size_t)n, sizeof *s->step);
    s->strikes = calloc((size_t)n, sizeof *s->strikes);
    s->stage = calloc((size_t)n, sizeof *s->stage);
    s->early = calloc((size_t)n * SUP_STRAGGLER_BASE, sizeof *s->early);
    s->n_early = calloc((size_t)n, sizeof *s->n_early);
    s->base = calloc((size_t)n, sizeof *s->base);
    if (!s->compute || !s->step || !s->strikes || !s->stage || !s->early || !s->n_early || !s->base)
        return -1;
    sup_straggler_reset(s);
    return 0;
}

void sup_straggler_free(sup_straggler *s) {
    free(s->compute);
    free(s->step);
    free(s->strikes);
    free(s->stage);
    free(s->early);
    free(s->n_early);
    free(s->base);
    memset(s, 0, sizeof *s);
}

void sup_straggler_reset(sup_straggler *s) {
    for (int i = 0; i < s->n; i++) {
        s->compute[i] = NAN;
        s->step[i] = 0;
        s->strikes[i] = 0;
        s->stage[i] = -1;
        s->n_early[i] = 0; /* a new attempt may run on other nodes: learnt again */
        s->base[i] = NAN;
    }
    s->round_step = 0;
}

void sup_straggler_feed(sup_straggler *s, int r, int stage, int step, double compute_ms) {
    if (r < 0 || r >= s->n || step <= s->step[r] || !isfinite(compute_ms)) return;
    s->stage[r] = stage;
    s->compute[r] = compute_ms;
    s->step[r] = step;
}

int sup_straggler_check(sup_straggler *s, double score, int rounds, double *out_score) {
    if (s->n < 2) return -1;
    int newest = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->step[i] <= s->round_step) return -1; /* a rank has not reported this round */
        if (s->step[i] > newest) newest = s->step[i];
    }
    s->round_step = newest;
    double *others = malloc(sizeof(double) * (size_t)s->n);
    double *own = malloc(sizeof(double) * (size_t)s->n); /* each rank's own-speed score */
    if (!others || !own) {
        free(others);
        free(own);
        return -1;
    }
    for (int r = 0; r < s->n; r++) {
        if (s->n_early[r] < SUP_STRAGGLER_BASE) {
            s->early[(size_t)r * SUP_STRAGGLER_BASE + s->n_early[r]++] = s->compute[r];
            if (s->n_early[r] == SUP_STRAGGLER_BASE) {
                double t[SUP_STRAGGLER_BASE];
                memcpy(t, s->early + (size_t)r * SUP_STRAGGLER_BASE, sizeof t);
                s->base[r] = median(t, SUP_STRAGGLER_BASE);
            }
        }
        own[r] = isfinite(s->base[r]) && s->base[r] > 1.0 && s->compute[r] > 1.0
                     ? s->base[r] / s->compute[r]
                     : NAN;
    }
    int worst = -1;
    double worst_score = 1;
    for (int r = 0; r < s->n; r++) {
        int m = 0; /* the others of its stage: stages do different work */
        for (int i = 0; i < s->n; i++)
            if (i != r && s->stage[i] == s->stage[r]) others[m++] = s->compute[i];
        /* alone in its stage: nothing to compare with; below 1 ms a step
         * is noise, not a straggler */
        double sc = m && s->compute[r] > 1.0 ? median(others, m) / s->compute[r] : 1.0;
        /* slower than itself, and so is its stage (the median of its stage's
         * own-speed scores: a rank slower than its stage-mates is the score
         * above's; one rank's own score alone is scheduling noise where
         * ranks share cores) */
        m = 0;
        for (int i = 0; i < s->n; i++)
            if (s->stage[i] == s->stage[r] && isfinite(own[i])) others[m++] = own[i];
        double own_sc = isfinite(own[r]) && m ? fmax(own[r], median(others, m)) : NAN;
        if (isfinite(own_sc) && own_sc < sc) {
            /* a straggler only if the other stages are not slower than
             * themselves (a slowdown of the whole job is no node's fault) */
            m = 0;
            for (int i = 0; i < s->n; i++)
                if (s->stage[i] != s->stage[r] && isfinite(own[i])) others[m++] = own[i];
            if (m && median(others, m) >= score) sc = own_sc;
        }
        s->strikes[r] = sc < score ? s->strikes[r] + 1 : 0;
        if (s->strikes[r] >= rounds && sc < worst_score) worst = r, worst_score = sc;
    }
    free(others);
    free(own);
    if (out_score) *out_score = worst_score;
    return worst;
}
