/* trace_strag.c - straggler scores: per rank and step the compute time
 * (fwd + bwd spans minus the wait / data_wait spans nested in them, plus an
 * injected slow fault's delay, fault_slow: it stands for slower compute), then
 * a relative score against the fastest rank of the same pipeline stage
 * and an individual score against the rank's own earlier speed.  Streaming:
 * one rank's log is read, reduced to its row of step times, scored and
 * freed before the next; no ranks x steps matrix is held (the heat map
 * keeps each rank's newest TRACE_STRAG_HEAT_STEPS steps as floats). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "trace/trace_internal.h"

#define STRAG_MIN_STEPS 3        /* a rank's steps to be scored (its first is left out) */
#define STRAG_MAX_STEPS 10000000 /* the newest steps scored when the logs span more */
/* The individual score's earlier speed: this quantile of the earlier windows' medians
 * (a fast one, not the fastest). */
#define STRAG_BASE_Q 0.10

typedef struct {
    int span, step; /* step: the step a fwd/bwd span counts for (or -1) */
} nest_entry;

typedef struct {
    int fwd, bwd, slow, wait, data_wait, step; /* interned names, -1 when absent */
} strag_names;

/* A compute span: fwd, bwd, or the sleep of --inject-fault slow=MS (the
 * trainer's stand-in for a slower device: it sleeps before the step's
 * compute, so no fwd/bwd span holds it). */
static int is_fb(const strag_names *nm, int name) {
    return name >= 0 && (name == nm->fwd || name == nm->bwd || name == nm->slow);
}

static int is_wait(const strag_names *nm, int name) {
    return name >= 0 && (name == nm->wait || name == nm->data_wait);
}

/* Add one rank's compute times (ns) into c[0..n) for steps first..first+n-1
 * (c[k] < 0: no fwd/bwd in that step yet), and the time of its whole "step" span into st[k]
 * (< 0: none).  spans are the rank's compute lane. */
static void rank_compute(trace_log *l, const strag_names *nm, double *c, double *st, int first,
                         int n, int *idx, nest_entry *stack) {
    for (int i = 0; i < l->n_spans; i++)
        idx[i] = i;
    trace_nest(l->spans, idx, l->n_spans);
    int top = 0;
    for (int k = 0; k < l->n_spans; k++) {
        const trace_span *s = &l->spans[idx[k]];
        if (s->flags & TRACE_IS_MARK) continue;
        while (top && l->spans[stack[top - 1].span].t1 <= s->t0)
            top--;
        int fb = -1, in_wait = 0, step_ctx = -1;
        for (int t = 0; t < top; t++) {
            const trace_span *a = &l->spans[stack[t].span];
            if (fb < 0 && is_fb(nm, a->name)) fb = t;
            in_wait |= is_wait(nm, a->name);
            if (a->name == nm->step && (a->flags & TRACE_HAS_STEP)) step_ctx = a->step;
        }
        int step = -1;
        double dur = (double)(s->t1 - s->t0);
        if (s->name == nm->step && (s->flags & TRACE_HAS_STEP)) { /* the whole step */
            int64_t k = (int64_t)s->step - first;
            if (s->step >= 1 && k >= 0 && k < n) st[k] = dur;
        }
        if (is_fb(nm, s->name) && fb < 0) {
            step = s->flags & TRACE_HAS_STEP ? s->step : step_ctx;
            int64_t k = (int64_t)step - first;
            if (step >= 1 && k >= 0 && k < n) c[k] = (c[k] < 0 ? 0 : c[k]) + dur;
        } else if (is_wait(nm, s->name) && fb >= 0 && !in_wait) {
            int64_t k = (int64_t)stack[fb].step - first;
            if (stack[fb].step >= 1 && k >= 0 && k < n && c[k] >= dur) c[k] -= dur;
        }
        stack[top++] = (nest_entry){idx[k], fb >= 0 ? stack[fb].step : step};
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) { /* sorts v */
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The p-quantile of sorted v[0..n) (n >= 1), linear between neighbours. */
static double quantile(const double *v, int n, double p) {
    double k = p * (n - 1);
    int i = (int)k;
    return i + 1 < n ? v[i] + (v[i + 1] - v[i]) * (k - i) : v[n - 1];
}

/* The median of sorted v[0..m) without one element equal to x (m >= 2). */
static double median_without(const double *v, int m, double x) {
    int pos = 0;
    while (pos < m - 1 && v[pos] < x)
        pos++;
    int n = m - 1; /* the k-th of the rest: v[k] before pos, v[k + 1] from it */
#define REST(k) ((k) < pos ? v[k] : v[(k) + 1])
    double med = n % 2 ? REST(n / 2) : 0.5 * (REST(n / 2 - 1) + REST(n / 2));
#undef REST
    return med;
}

/* Median and individual score of one rank from its row c[0..n_steps) (ms, < 0: no data;
 * compacted in place).  The rank's first step is left out: it carries the set-up (of the
 * run, or of a resume).  A rank with fewer than STRAG_MIN_STEPS steps is not scored
 * (r->unscored says why): its set-up step would be scored as compute.  The individual
 * score compares the rank's latest speed with its own earlier one, over windows of
 * `window` steps ending at its newest step: latest = the last window's median, or with
 * three windows or more the faster of the last two (a slowdown must last two windows to
 * count); earlier = the STRAG_BASE_Q quantile of the medians of the windows before those.
 * Before, earlier was the best window of the run: a minimum over all of them, which falls
 * as a run grows, so that on a noisy host (12% step-to-step) one slow last window named a
 * rank in most runs of 2,000 steps.  w: room for `window` values, wm for
 * n_steps / window + 1.  Returns the rank's steps with compute, scored or not. */
static int rank_scores(trace_strag_rank *r, double *c, double *st, int n_steps, int window,
                       double *w, double *wm) {
    int n = 0, n_st = 0;
    for (int k = 0; k < n_steps; k++) {
        if (c[k] >= 0 && n && st && st[k] >= 0) st[n_st++] = st[k]; /* not the warm-up's */
        if (c[k] >= 0) c[n++] = c[k];
    }
    r->step_ms = n_st ? median(st, n_st) : 0;
    r->slowed_ms = r->q25_ms = r->q75_ms = r->last_ms = 0;
    r->individual = 1.0;
    r->steps = r->windows = 0;
    r->median_ms = 0;
    r->unscored[0] = 0;
    if (n < STRAG_MIN_STEPS) { /* no score: not a healthy rank either */
        if (!n)
            snprintf(r->unscored, sizeof r->unscored, "no fwd/bwd spans");
        else
            snprintf(r->unscored, sizeof r->unscored,
                     "%d step(s): too few to leave out the warm-up step (%d needed)", n,
                     STRAG_MIN_STEPS);
        return n;
    }
    memmove(c, c + 1, (size_t)--n * sizeof *c);
    r->steps = n;
    /* windows of `window` steps, the last one ending at the newest step: wm[0] the newest */
    for (int end = n; end - window >= 0; end -= window, r->windows++) {
        memcpy(w, c + end - window, (size_t)window * sizeof *w);
        wm[r->windows] = median(w, window);
    }
    if (r->windows) {
        int judged = r->windows >= 3 ? 2 : 1;
        double last = judged == 2 && wm[1] < wm[0] ? wm[1] : wm[0];
        double base = last;
        if (r->windows > judged) { /* the earlier windows' STRAG_BASE_Q quantile */
            qsort(wm + judged, (size_t)(r->windows - judged), sizeof *wm, cmp_double);
            base = quantile(wm + judged, r->windows - judged, STRAG_BASE_Q);
        }
        /* at most 1: a rank faster now than before has not slowed (the best window of
         * the old score was never slower than the last) */
        r->individual = last > base ? base / last : 1.0;
        r->slowed_ms = last > base ? last - base : 0;
        r->last_ms = last;
    }
    r->median_ms = median(c, n); /* sorts c */
    r->q25_ms = quantile(c, n, 0.25);
    r->q75_ms = quantile(c, n, 0.75);
    return n + 1;
}

/* One rank's compute times (ns) for its steps first..first+n-1 (c[k] < 0: none). */
typedef struct {
    int first, n;
    double *c, *st; /* st: its whole steps' times ("step" spans; < 0: none) */
} strag_row;

/* Read log li's compute spans, reduce them to its row, and free them again: memory holds
 * one rank's spans at a time, not the run's (a long run's logs are gigabytes a rank). */
static ms_status rank_row(trace_set *set, int li, strag_row *row) {
    trace_log *l = &set->logs[li];
    *row = (strag_row){0};
    MS_TRY(trace_log_load(set, li, TRACE_LOAD_COMPUTE));
    strag_names nm = {trace_str_find(set, "fwd"),        trace_str_find(set, "bwd"),
                      trace_str_find(set, "fault_slow"), trace_str_find(set, "wait"),
                      trace_str_find(set, "data_wait"),  trace_str_find(set, "step")};
    /* the steps the log holds: a resumed run's start at its resume step */
    int first = 0, last = 0;
    for (int i = 0; i < l->n_spans; i++) {
        const trace_span *sp = &l->spans[i];
        if (!(sp->flags & TRACE_HAS_STEP) || sp->step < 1) continue;
        last = sp->step > last ? sp->step : last;
        first = !first || sp->step < first ? sp->step : first;
    }
    ms_status st = MS_OK;
    if (last) {
        if (last - first >= STRAG_MAX_STEPS) first = last - STRAG_MAX_STEPS + 1;
        row->first = first, row->n = last - first + 1;
        row->c = malloc((size_t)row->n * sizeof *row->c);
        row->st = malloc((size_t)row->n * sizeof *row->st);
        int *idx = malloc(((size_t)l->n_spans + 1) * sizeof *idx);
        nest_entry *stack = malloc(((size_t)l->n_spans + 1) * sizeof *stack);
        if (row->c && row->st && idx && stack) {
            for (int k = 0; k < row->n; k++)
                row->c[k] = row->st[k] = -1;
            rank_compute(l, &nm, row->c, row->st, row->first, row->n, idx, stack);
            for (int k = 0; k < row->n; k++) { /* ms */
                row->c[k] = row->c[k] >= 0 ? row->c[k] / 1e6 : -1;
                row->st[k] = row->st[k] >= 0 ? row->st[k] / 1e6 : -1;
            }
        } else {
            st = ms_error(MS_ERR_NOMEM, "%s: out of memory", l->path);
        }
        free(idx);
        free(stack);
    }
    trace_log_unload(l);
    return st;
}

/* Keep the newest TRACE_STRAG_HEAT_STEPS of a row for the heat map: they hold every step
 * it shows (the run's newest, and this rank's newest step is no newer than the run's). */
static ms_status keep_heat(trace_strag_rank *r, const strag_row *row) {
    int n = row->n < TRACE_STRAG_HEAT_STEPS ? row->n : TRACE_STRAG_HEAT_STEPS;
    if (!n) return MS_OK;
    if (!(r->heat = malloc((size_t)n * sizeof *r->heat)))
        return ms_error(MS_ERR_NOMEM, "out of memory");
    r->heat_first = row->first + row->n - n;
    r->heat_n = n;
    for (int k = 0; k < n; k++)
        r->heat[k] = (float)row->c[row->n - n + k];
    return MS_OK;
}

/* Score rank li: its row from step `from` on (the steps of the run's report). */
static ms_status score_rank(trace_strag *s, int li, const strag_row *row, int from, double *w,
                            int *with_compute) {
    trace_strag_rank *r = &s->ranks[li];
    int skip = from > row->first ? from - row->first : 0;
    skip = skip > row->n ? row->n : skip;
    if (s->opts.heatmap && !r->heat) MS_TRY(keep_heat(r, row));
    double *c = row->c ? row->c + skip : NULL; /* NULL: no steps */
    double *st = row->st ? row->st + skip : NULL;
    double *wm = malloc(((size_t)(row->n - skip) / (size_t)s->opts.window + 1) * sizeof *wm);
    if (!wm) return ms_error(MS_ERR_NOMEM, "out of memory");
    *with_compute = rank_scores(r, c, st, row->n - skip, s->opts.window, w, wm) > 0;
    free(wm);
    if (row->n && skip == row->n) /* its spans were there, older than the report's steps */
        snprintf(r->unscored, sizeof r->unscored,
                 "its steps %d..%d are before the newest %d scored (from %d)", row->first,
                 row->first + row->n - 1, STRAG_MAX_STEPS, from);
    return MS_OK;
}

/* Every rank's row, scored as it is read and then freed (with the newest
 * TRACE_STRAG_HEAT_STEPS kept for the heat map); the report's steps are those of all of
 * them, the newest STRAG_MAX_STEPS when they span more: a rank whose row began before those
 * (a run of more than STRAG_MAX_STEPS steps) is read and scored again without the older. */
static ms_status score_rows(trace_strag *s, trace_set *set, int *any) {
    int *row_first = calloc((size_t)set->n_logs + 1, sizeof *row_first);
    char *has = calloc((size_t)set->n_logs + 1, 1);
    double *w = malloc(((size_t)s->opts.window + 1) * sizeof *w);
    ms_status st = row_first && has && w ? MS_OK : ms_error(MS_ERR_NOMEM, "out of memory");
    int first = 0, last = 0;
    for (int li = 0; st == MS_OK && li < set->n_logs; li++) {
        strag_row row;
        int wc = 0;
        st = rank_row(set, li, &row);
        if (st == MS_OK && row.n) {
            int a = row.first, b = row.first + row.n - 1;
            first = !first || a < first ? a : first;
            last = b > last ? b : last;
            row_first[li] = row.first;
        }
        if (st == MS_OK) st = score_rank(s, li, &row, row.first, w, &wc);
        has[li] = (char)wc;
        free(row.c);
        free(row.st);
    }
    if (!last) first = 1;
    if (last - first >= STRAG_MAX_STEPS) first = last - STRAG_MAX_STEPS + 1;
    for (int li = 0; st == MS_OK && li < set->n_logs; li++) {
        if (!row_first[li] || row_first[li] >= first) continue;
        strag_row row;
        int wc = 0;
        st = rank_row(set, li, &row);
        if (st == MS_OK) st = score_rank(s, li, &row, first, w, &wc);
        has[li] = (char)wc;
        free(row.c);
        free(row.st);
    }
    *any = 0;
    for (int li = 0; li < set->n_logs; li++)
        *any |= has[li];
    s->first_step = first;
    s->max_step = last;
    s->n_steps = last - first + 1;
    free(row_first);
    free(has);
    free(w);
    return st;
}

static ms_status strag_alloc(trace_strag **out, const trace_set *set, const trace_strag_opts *o) {
    trace_strag *s = calloc(1, sizeof *s);
    if (!s) return ms_error(MS_ERR_NOMEM, "out of memory");
    *out = s;
    s->opts = *o;
    s->dir = strdup(set->dir);
    s->ranks = calloc((size_t)set->n_logs + 1, sizeof *s->ranks);
    if (!s->dir || !s->ranks) return ms_error(MS_ERR_NOMEM, "out of memory");
    s->n_ranks = set->n_logs;
    return MS_OK;
}

/* Whether a lag of lag_ms a step costs the job at least TRACE_STRAG_MIN_LAG of rank r's whole
 * step (its median "step" span; without one, any lag counts). */
static int lag_counts(const trace_strag_rank *r, double lag_ms) {
    return r->step_ms <= 0 || lag_ms >= TRACE_STRAG_MIN_LAG * r->step_ms;
}

/* Rank r's relative score against ref (its stage's fastest rank; n_stage scored ranks) and
 * its verdict; ind[0..m): the sorted individual scores.  A straggler needs a large lag (a
 * score below the threshold) that is consistent (relative: its faster quarter of steps
 * slower than ref's slower quarter, not a median that noise moved), that costs the job
 * (lag_counts), over enough steps (TRACE_STRAG_JUDGE_STEPS).  With two ranks a stage, the
 * one peer is all it is compared with: those conditions are what make the verdict hold. */
static void verdict(const trace_strag *s, trace_strag_rank *r, const trace_strag_rank *ref,
                    int n_stage, const double *ind, int m) {
    double thr = s->opts.threshold;
    r->relative = !r->steps || !ref ? 1.0 : r->median_ms > 0 ? ref->median_ms / r->median_ms : 1.0;
    int slowed = r->steps && r->windows && r->individual < thr;
    r->slowed_alone =
        m >= 2 && slowed && median_without(ind, m, r->individual) >= thr && r->behind_stage;
    r->peers = r->steps ? n_stage - 1 : 0;
    r->judged = r->steps >= TRACE_STRAG_JUDGE_STEPS;
    r->consistent = r->steps && ref && r != ref && r->q25_ms > ref->q75_ms;
    int rel = r->relative < thr && r->consistent;
    int rel_cost = rel && lag_counts(r, r->median_ms - ref->median_ms);
    int ind_cost = r->slowed_alone && lag_counts(r, r->slowed_ms);
    r->lag_small = (rel && !rel_cost) || (r->slowed_alone && !ind_cost);
    r->straggler = r->judged && (rel_cost || ind_cost);
}

/* behind_stage of stage p's ranks: a rank's last window against the median of the
 * last windows of the other ranks of its stage (they do the same work) that kept their
 * own speed (individual at the threshold or above); v: room for n_ranks values.  Where
 * no other rank of the stage kept its speed (a throttled node of one stage: its ranks
 * slowed together) there is nobody to be behind, and the rank passes. */
static void stage_lag(trace_strag *s, int p, double *v) {
    double thr = s->opts.threshold;
    int n = 0;
    for (int li = 0; li < s->n_ranks; li++) {
        const trace_strag_rank *r = &s->ranks[li];
        if (r->coord.pp == p && r->steps && r->windows && r->individual >= thr) v[n++] = r->last_ms;
    }
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int li = 0; li < s->n_ranks; li++) {
        trace_strag_rank *r = &s->ranks[li];
        if (r->coord.pp != p) continue;
        int in_v = r->steps && r->windows && r->individual >= thr; /* r's own value is in v */
        if (!r->steps || !r->windows || n - in_v < 1)
            r->behind_stage = 1;
        else
            r->behind_stage =
                r->last_ms > (in_v ? median_without(v, n, r->last_ms) : quantile(v, n, 0.5));
    }
}

/* Both scores and the verdict for every rank.  The relative score compares
 * a rank with the ranks of its own pipeline stage only: they do the same
 * work, while stages differ (the last one also computes the loss). */
static ms_status score(trace_strag *s, trace_set *set) {
    int n_pp = 1, any = 0;
    for (int li = 0; li < s->n_ranks; li++) {
        trace_strag_rank *r = &s->ranks[li];
        const trace_log *l = &set->logs[li];
        r->rank = l->rank;
        r->coord = l->coord;
        snprintf(r->host, sizeof r->host, "%s", l->host);
        n_pp = l->coord.pp >= n_pp ? l->coord.pp + 1 : n_pp;
    }
    MS_TRY(score_rows(s, set, &any));
    if (!any)
        return ms_error(MS_ERR_NOTFOUND, "%s: no rank has fwd/bwd spans on its compute lane",
                        s->dir);
    /* per stage: its fastest rank (by median) and its scored ranks */
    int *best = malloc((size_t)n_pp * 2 * sizeof *best), *n_stage = best + n_pp;
    if (!best) return ms_error(MS_ERR_NOMEM, "out of memory");
    for (int p = 0; p < n_pp; p++)
        best[p] = -1, n_stage[p] = 0;
    for (int li = 0; li < s->n_ranks; li++) {
        const trace_strag_rank *r = &s->ranks[li];
        int *b = &best[r->coord.pp];
        if (r->steps && (*b < 0 || r->median_ms < s->ranks[*b].median_ms)) *b = li;
        n_stage[r->coord.pp] += r->steps > 0;
    }
    /* The individual scores of the ranks that have one, sorted: a rank that
     * slowed counts as a straggler only when the other ranks kept their speed
     * (the median of theirs at the threshold or above).  When they all
     * slowed, so did the job: load on the machine, or a step that grew, is
     * no rank's fault (the live detector's rule too, docs/operations.md).
     * The job's score is the median over the ranks that did not slow alone:
     * over all of them, one strong straggler of two ranks (or of few) would
     * drag it under the threshold and the job would be said to have slowed
     * too, no rank's fault, next to the rank named for it. */
    double *ind = malloc(sizeof(double) * (size_t)s->n_ranks);
    if (!ind) {
        free(best);
        return ms_error(MS_ERR_NOMEM, "out of memory");
    }
    for (int p = 0; p < n_pp; p++) /* behind_stage: against the stage's other last windows */
        stage_lag(s, p, ind);
    int m = 0;
    for (int li = 0; li < s->n_ranks; li++)
        if (s->ranks[li].steps && s->ranks[li].windows) ind[m++] = s->ranks[li].individual;
    if (m) qsort(ind, (size_t)m, sizeof *ind, cmp_double);
    for (int li = 0; li < s->n_ranks; li++) {
        int p = s->ranks[li].coord.pp;
        verdict(s, &s->ranks[li], best[p] >= 0 ? &s->ranks[best[p]] : NULL, n_stage[p], ind, m);
    }
    int k = 0;
    for (int li = 0; li < s->n_ranks; li++)
        if (s->ranks[li].steps && s->ranks[li].windows && !s->ranks[li].slowed_alone)
            ind[k++] = s->ranks[li].individual;
    s->job_individual = k ? median(ind, k) : NAN; /* sorts ind */
    free(ind);
    free(best);
    return MS_OK;
}

ms_status trace_strag_load(const char *dir, const trace_strag_opts *o, trace_strag **out) {
    *out = NULL;
    if (!(o->threshold > 0 && o->threshold <= 1))
        return ms_error(MS_ERR_ARG, "--threshold %g: expected a score in (0, 1]", o->threshold);
    if (o->window < 1 || o->window > 100000)
        return ms_error(MS_ERR_ARG, "--window %d: expected 1 to 100000 steps", o->window);
    trace_set *set = NULL;
    trace_strag *s = NULL;
    MS_TRY(trace_set_load(dir, TRACE_LOAD_COMPUTE | TRACE_LOAD_HEADERS, &set));
    ms_status st = strag_alloc(&s, set, o);
    if (st == MS_OK) st = score(s, set);
    trace_set_free(set);
    if (st != MS_OK) {
        trace_strag_free(s);
        return st;
    }
    *out = s;
    return MS_OK;
}

void trace_strag_free(trace_strag *s) {
    if (!s) return;
    for (int i = 0; s->ranks && i < s->n_ranks; i++)
        free(s->ranks[i].heat);
    free(s->ranks);
    free(s->dir);
    free(s);
}

/* A scored rank's verdict, for the table ("5%": TRACE_STRAG_MIN_LAG). */
static const char *verdict_str(const trace_strag *s, const trace_strag_rank *r) {
    if (r->straggler) return r->peers == 1 ? "STRAGGLER (slower than its one peer)" : "STRAGGLER";
    if (!r->judged) return "ok? (too few steps to judge)";
    if (r->lag_small) return "ok (slower, by under 5% of a step: no cost)";
    if (r->relative < s->opts.threshold)
        return "ok (slower, but its step times overlap the fastest's: noise)";
    if (r->windows && r->individual < s->opts.threshold && !r->behind_stage &&
        !(s->job_individual < s->opts.threshold))
        return "ok (slower than before, but not behind its stage's other ranks)";
    if (r->windows && r->individual < s->opts.threshold) return "ok (slowed with the others)";
    return r->windows ? "ok" : "ok (relative score only)";
}

#define STRAG_NOTES 2
#define STRAG_NOTE_LEN 320

/* What limits the verdicts: a run too short, a stage of two ranks.  Fills notes, returns
 * how many. */
static int strag_notes(const trace_strag *s, char notes[STRAG_NOTES][STRAG_NOTE_LEN]) {
    int n_short = 0, pair = 0, k = 0;
    for (int i = 0; i < s->n_ranks; i++) {
        n_short += s->ranks[i].steps && !s->ranks[i].judged;
        pair |= s->ranks[i].peers == 1;
    }
    if (n_short)
        snprintf(notes[k++], STRAG_NOTE_LEN,
                 "too short to judge: %d rank(s) have fewer than %d scored steps (a run of at "
                 "least %d steps: the first is warm-up); their scores are shown, none is named",
                 n_short, TRACE_STRAG_JUDGE_STEPS, TRACE_STRAG_JUDGE_STEPS + 1);
    if (pair)
        snprintf(notes[k++], STRAG_NOTE_LEN,
                 "a pipeline stage of 2 ranks: each is compared with its one peer, not with a "
                 "population; the slower is named only when its lag is large, consistent (its "
                 "faster quarter of steps slower than the peer's slower quarter) and at least "
                 "%.0f%% of a step",
                 TRACE_STRAG_MIN_LAG * 100);
    return k;
}

void trace_strag_print(const trace_strag *s, FILE *f) {
    fprintf(f,
            "stragglers in %s: %d rank(s), steps %d-%d, threshold %g, window %d (a rank's "
            "first step skipped as warm-up; a rank with fewer than %d steps not scored)\n",
            s->dir, s->n_ranks, s->first_step, s->max_step, s->opts.threshold, s->opts.window,
            STRAG_MIN_STEPS);
    fprintf(f, "%6s  %-12s %-20s %10s %9s %11s %6s  %s\n", "rank", "(dp,pp,tp)", "host",
            "median_ms", "relative", "individual", "steps", "verdict");
    int n_bad = 0;
    for (int i = 0; i < s->n_ranks; i++) {
        const trace_strag_rank *r = &s->ranks[i];
        char c[48];
        snprintf(c, sizeof c, "(%d,%d,%d)", r->coord.dp, r->coord.pp, r->coord.tp);
        if (r->unscored[0])
            fprintf(f, "%6d  %-12s %-20s %10s %9s %11s %6d  not scored: %s\n", r->rank, c, r->host,
                    "-", "-", "-", 0, r->unscored);
        else if (r->windows)
            fprintf(f, "%6d  %-12s %-20s %10.3f %9.3f %11.3f %6d  %s\n", r->rank, c, r->host,
                    r->median_ms, r->relative, r->individual, r->steps, verdict_str(s, r));
        else /* too few steps for one window: the relative score alone */
            fprintf(f, "%6d  %-12s %-20s %10.3f %9.3f %11s %6d  %s\n", r->rank, c, r->host,
                    r->median_ms, r->relative, "-", r->steps, verdict_str(s, r));
        n_bad += r->straggler;
    }
    fprintf(f, "stragglers:");
    for (int i = 0, k = 0; i < s->n_ranks; i++) {
        const trace_strag_rank *r = &s->ranks[i];
        char c[64];
        if (r->straggler)
            fprintf(f, "%s rank %d %s on %s", k++ ? "," : "", r->rank,
                    trace_coord_str(c, sizeof c, r->coord), r->host);
    }
    fprintf(f, "%s\n", n_bad ? "" : " none");
    if (s->job_individual < s->opts.threshold) /* NaN: no rank has a window */
        fprintf(f,
                "the job as a whole slowed: its median rank's latest windows of %d steps ran at "
                "%.2f x its earlier speed (load on the machine, throttling, or longer steps: "
                "no rank's fault; a rank that slows counts as a straggler only while the others "
                "keep their speed)\n",
                s->opts.window, s->job_individual);
    char notes[STRAG_NOTES][STRAG_NOTE_LEN];
    for (int i = 0, n = strag_notes(s, notes); i < n; i++)
        fprintf(f, "note: %s\n", notes[i]);
    int k = 0; /* no score is no clean bill of health */
    for (int i = 0; i < s->n_ranks; i++)
        if (s->ranks[i].unscored[0])
            fprintf(f, "%s rank %d (%s)", k++ ? "," : "not scored:", s->ranks[i].rank,
                    s->ranks[i].unscored);
    if (k) fputc('\n', f);
}

static cJSON *rank_json(const trace_strag_rank *r) {
    cJSON *o = cJSON_CreateObject(), *c = trace_coord_json(r->coord);
    if (!o || !c || !cJSON_AddNumberToObject(o, "rank", r->rank) ||
        !cJSON_AddItemToObject(o, "coord", c)) {
        cJSON_Delete(o);
        cJSON_Delete(c);
        return NULL;
    }
    int ok = cJSON_AddStringToObject(o, "host", r->host) != NULL &&
             cJSON_AddBoolToObject(o, "scored", !r->unscored[0]);
    if (ok && r->unscored[0]) ok = cJSON_AddStringToObject(o, "unscored", r->unscored) != NULL;
    if (!r->unscored[0])
        ok = ok && cJSON_AddNumberToObject(o, "median_ms", r->median_ms) &&
             cJSON_AddNumberToObject(o, "relative", r->relative) &&
             (r->windows ? cJSON_AddNumberToObject(o, "individual", r->individual)
                         : cJSON_AddNullToObject(o, "individual"));
    else
        ok = ok && cJSON_AddNullToObject(o, "median_ms") && cJSON_AddNullToObject(o, "relative") &&
             cJSON_AddNullToObject(o, "individual");
    if (!r->unscored[0])
        ok = ok && cJSON_AddNumberToObject(o, "q25_ms", r->q25_ms) &&
             cJSON_AddNumberToObject(o, "q75_ms", r->q75_ms) &&
             cJSON_AddNumberToObject(o, "step_ms", r->step_ms) &&
             cJSON_AddBoolToObject(o, "consistent", r->consistent) &&
             (r->windows ? cJSON_AddNumberToObject(o, "last_ms", r->last_ms)
                         : cJSON_AddNullToObject(o, "last_ms")) &&
             cJSON_AddBoolToObject(o, "behind_stage", r->behind_stage) &&
             cJSON_AddBoolToObject(o, "lag_small", r->lag_small) &&
             cJSON_AddNumberToObject(o, "peers", r->peers);
    ok = ok && cJSON_AddBoolToObject(o, "judged", r->judged) &&
         cJSON_AddBoolToObject(o, "straggler", r->straggler) &&
         cJSON_AddNumberToObject(o, "steps", r->steps);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

cJSON *trace_strag_json(const trace_strag *s) {
    cJSON *o = cJSON_CreateObject(), *ranks = cJSON_CreateArray(), *bad = cJSON_CreateArray();
    cJSON *unscored = cJSON_AddArrayToObject(o, "unscored");
    int ok = o && ranks && bad && unscored &&
             cJSON_AddNumberToObject(o, "threshold", s->opts.threshold) &&
             cJSON_AddNumberToObject(o, "window", s->opts.window) &&
             cJSON_AddNumberToObject(o, "min_steps", TRACE_STRAG_JUDGE_STEPS) &&
             cJSON_AddNumberToObject(o, "min_lag", TRACE_STRAG_MIN_LAG) &&
             trace_json_add_text(o, "dir", s->dir) &&
             (isfinite(s->job_individual)
                  ? cJSON_AddNumberToObject(o, "job_individual", s->job_individual) != NULL
                  : cJSON_AddNullToObject(o, "job_individual") != NULL);
    for (int i = 0; ok && i < s->n_ranks; i++) {
        cJSON *r = rank_json(&s->ranks[i]);
        ok = r && cJSON_AddItemToArray(ranks, r);
        if (ok && s->ranks[i].straggler)
            ok = cJSON_AddItemToArray(bad, cJSON_CreateNumber(s->ranks[i].rank));
        if (ok && s->ranks[i].unscored[0])
            ok = cJSON_AddItemToArray(unscored, cJSON_CreateNumber(s->ranks[i].rank));
    }
    char notes[STRAG_NOTES][STRAG_NOTE_LEN];
    cJSON *nj = ok ? cJSON_AddArrayToObject(o, "notes") : NULL;
    ok = ok && nj;
    for (int i = 0, n = ok ? strag_notes(s, notes) : 0; ok && i < n; i++) {
        cJSON *x = cJSON_CreateString(notes[i]);
        ok = x && cJSON_AddItemToArray(nj, x);
        if (!ok) cJSON_Delete(x);
    }
    if (ok && cJSON_AddItemToObject(o, "ranks", ranks)) {
        ranks = NULL;
        if (cJSON_AddItemToObject(o, "stragglers", bad)) return o;
    }
    cJSON_Delete(ranks);
    cJSON_Delete(bad);
    cJSON_Delete(o);
    return NULL;
}
