/* trace_heatmap.c - the straggler heat map: ranks (sorted by pp, dp, tp)
 * down, steps across, each cell the rank's compute time over the step's
 * (lower) median across the ranks of its pipeline stage, or for a stage of
 * one rank over its own earlier speed, on a log colour scale (viridis, 0.5x .. 2x);
 * straggler rows boxed and labelled in red.  Drawn with cairo. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cairo.h>
#include <fontconfig/fontconfig.h>

#include "base/jsonstr.h"
#include "base/fileio.h"
#include "base/log.h"
#include "trace/trace_internal.h"

#define MAX_COLS TRACE_STRAG_HEAT_STEPS /* the newest steps shown when there are more */
#define MAX_ROWS 16000

typedef struct {
    int left, top, cw, ch, first_step, n_cols, width, height;
} layout;

/* Viridis at t in [0, 1]. */
static void colour(double t, double rgb[3]) {
    static const double stops[5][3] = {
        {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    int k = t >= 1 ? 3 : (int)(t * 4);
    double f = t * 4 - k;
    for (int i = 0; i < 3; i++)
        rgb[i] = (stops[k][i] + f * (stops[k + 1][i] - stops[k][i])) / 255.0;
}

static double ratio_t(double ratio) {
    return (log2(ratio) + 1.0) / 2.0;
} /* 0.5x..2x -> 0..1 */

/* Rank r's compute time in `step` (ms; < 0: no data). */
static double cell(const trace_strag_rank *r, int step) {
    int64_t k = (int64_t)step - r->heat_first;
    return k >= 0 && k < r->heat_n ? r->heat[k] : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The lower median of v[0..n) (n >= 1; sorted here): the lower of the two middle values of an
 * even count, so that of a stage of two ranks the faster one is the measure (the mean made
 * the healthy peer of a straggler look as far off as the straggler). */
static double lower_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[(n - 1) / 2];
}

/* The baseline of each shown step of each pipeline stage (0 where none):
 * med[stage[row] * n_cols + column], the step's lower median over the stage's
 * ranks.  Rows are in ord's order, sorted by pp first, so a stage's rows are
 * together.  Stages do different work, so a rank is compared with its own
 * stage; a stage of one rank (pipeline parallelism alone), with its own earlier
 * speed (the step's own time read 1x everywhere, and a rank that slowed down
 * did not show).  *alone: 1 if some stage has one rank. */
static double *step_medians(const trace_strag *s, const layout *L, const int *ord, int *stage,
                            int *alone) {
    int nc = L->n_cols, n_stages = 1;
    for (int row = 0; row < s->n_ranks; row++) {
        if (row && s->ranks[ord[row]].coord.pp != s->ranks[ord[row - 1]].coord.pp) n_stages++;
        stage[row] = n_stages - 1;
    }
    double *med = calloc((size_t)n_stages * nc + 1, sizeof *med);
    double *tmp = malloc(((size_t)(s->n_ranks > nc ? s->n_ranks : nc) + 1) * sizeof *tmp);
    *alone = 0;
    if (!med || !tmp) {
        free(med);
        free(tmp);
        return NULL;
    }
    for (int a = 0, b; a < s->n_ranks; a = b) {
        for (b = a + 1; b < s->n_ranks && stage[b] == stage[a];)
            b++;
        if (b - a == 1) { /* one rank (also a job of one): its own steps */
            const trace_strag_rank *r = &s->ranks[ord[a]];
            /* its earlier speed, the individual score's (the 10th percentile of its earlier
             * windows); without windows, its lower quartile over the steps shown (a median
             * read the steps before a slowdown as fast when most came after; over the steps
             * shown alone, one slowed for most of them did) */
            double own =
                r->windows > 0 && r->last_ms - r->slowed_ms > 0 ? r->last_ms - r->slowed_ms : 0;
            int n = 0;
            for (int k = 0; !own && k < nc; k++) {
                double c = cell(r, L->first_step + k);
                if (c >= 0) tmp[n++] = c;
            }
            if (n) {
                lower_median(tmp, n); /* (sorts) */
                own = tmp[(n - 1) / 4];
            }
            for (int k = 0; k < nc; k++)
                med[(size_t)stage[a] * nc + k] = own;
            *alone = 1;
            continue;
        }
        for (int k = 0; k < nc; k++) {
            int n = 0;
            for (int row = a; row < b; row++) {
                double c = cell(&s->ranks[ord[row]], L->first_step + k);
                if (c >= 0) tmp[n++] = c;
            }
            if (n) med[(size_t)stage[a] * nc + k] = lower_median(tmp, n);
        }
    }
    free(tmp);
    return med;
}

/* s at (x, y), ending there when `right`.  cairo takes only UTF-8 (else the whole drawing
 * fails): a byte that is not part of a valid character, as a directory name may hold, is
 * drawn as '?', as the JSON outputs have it. */
static void text(cairo_t *cr, double x, double y, double size, const char *s, int right) {
    char u[4400];
    cairo_text_extents_t e;
    snprintf(u, sizeof u, "%s", s);
    ms_utf8_fix(u); /* also a character cut to fit */
    cairo_set_font_size(cr, size);
    cairo_text_extents(cr, u, &e);
    cairo_move_to(cr, right ? x - e.x_advance : x, y);
    cairo_show_text(cr, u);
}

static void draw_cells(cairo_t *cr, const trace_strag *s, const layout *L, const int *ord,
                       const int *stage, const double *med) {
    for (int row = 0; row < s->n_ranks; row++) {
        const trace_strag_rank *r = &s->ranks[ord[row]];
        const double *m = med + (size_t)stage[row] * L->n_cols;
        for (int k = 0; k < L->n_cols; k++) {
            double c = cell(r, L->first_step + k), rgb[3] = {0.85, 0.85, 0.85};
            if (c >= 0 && m[k] > 0) colour(ratio_t(c / m[k]), rgb);
            if (c == 0 && m[k] == 0) colour(0.5, rgb);
            cairo_set_source_rgb(cr, rgb[0], rgb[1], rgb[2]);
            cairo_rectangle(cr, L->left + k * L->cw, L->top + row * L->ch, L->cw, L->ch);
            cairo_fill(cr);
        }
    }
}

/* Row labels "r3 (1,0,1)" (red and boxed for stragglers), step ticks. */
static void draw_axes(cairo_t *cr, const trace_strag *s, const layout *L, const int *ord) {
    int every = L->ch >= 9 ? 1 : (9 + L->ch - 1) / L->ch;
    double fs = L->ch >= 9 ? (L->ch - 2 < 12 ? L->ch - 2 : 12) : 8;
    char buf[96];
    for (int row = 0; row < s->n_ranks; row++) {
        const trace_strag_rank *r = &s->ranks[ord[row]];
        double y = L->top + row * L->ch;
        if (r->straggler) {
            cairo_set_source_rgb(cr, 0.85, 0, 0);
            cairo_set_line_width(cr, 2);
            cairo_rectangle(cr, L->left - 1, y, L->n_cols * L->cw + 2, L->ch);
            cairo_stroke(cr);
        }
        if (row % every && !r->straggler) continue;
        cairo_set_source_rgb(cr, r->straggler ? 0.85 : 0, 0, 0);
        snprintf(buf, sizeof buf, "r%d (%d,%d,%d)%s", r->rank, r->coord.dp, r->coord.pp,
                 r->coord.tp, r->straggler ? " !" : "");
        text(cr, L->left - 6, y + L->ch / 2.0 + fs / 3, fs, buf, 1);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    /* 1, 2, 5, 10, 20, 50, ... steps: labels >= 40 px apart and not
     * touching (the step numbers of a resumed run are long) */
    cairo_text_extents_t lw;
    snprintf(buf, sizeof buf, "%d", s->max_step);
    cairo_set_font_size(cr, 10);
    cairo_text_extents(cr, buf, &lw);
    double gap = lw.x_advance + 8 > 40 ? lw.x_advance + 8 : 40;
    int tick = 1;
    for (int mag = 1, k = 0; tick * L->cw < gap; k = (k + 1) % 3, mag *= k ? 1 : 10)
        tick = (k == 0 ? 2 : k == 1 ? 5 : 10) * mag;
    double y = L->top + s->n_ranks * L->ch;
    for (int k = 0; k < L->n_cols; k++) {
        int st = L->first_step + k; /* the first column, unless a tick follows too soon */
        if (st % tick && (k || (tick - st % tick) * L->cw < gap)) continue;
        snprintf(buf, sizeof buf, "%d", st);
        text(cr, L->left + k * L->cw + L->cw / 2.0 - 3, y + 14, 10, buf, 0);
    }
    text(cr, L->left + L->n_cols * L->cw / 2.0, y + 34, 12, "step", 0);
    const char *ylab = "rank (dp,pp,tp)";
    cairo_text_extents_t e;
    cairo_set_font_size(cr, 12);
    cairo_text_extents(cr, ylab, &e);
    double yc = L->top + s->n_ranks * L->ch / 2.0;
    yc = yc < L->top + e.x_advance / 2 ? L->top + e.x_advance / 2 : yc; /* below the title */
    cairo_save(cr);
    cairo_translate(cr, 18, yc + e.x_advance / 2);
    cairo_rotate(cr, -M_PI / 2);
    text(cr, 0, 0, 12, ylab, 0);
    cairo_restore(cr);
}

/* Vertical colour bar with the ratio values. */
static void draw_legend(cairo_t *cr, const layout *L) {
    double x = L->left + L->n_cols * L->cw + 30, y0 = L->top, h = 180;
    for (int i = 0; i < 180; i++) {
        double rgb[3];
        colour(1.0 - i / 179.0, rgb);
        cairo_set_source_rgb(cr, rgb[0], rgb[1], rgb[2]);
        cairo_rectangle(cr, x, y0 + i, 18, 1.5);
        cairo_fill(cr);
    }
    static const double ticks[] = {0.5, 0.71, 1.0, 1.41, 2.0};
    cairo_set_source_rgb(cr, 0, 0, 0);
    char buf[32];
    for (int i = 0; i < 5; i++) {
        double y = y0 + (1.0 - ratio_t(ticks[i])) * (h - 1);
        snprintf(buf, sizeof buf, "%gx", ticks[i]);
        text(cr, x + 24, y + 4, 10, buf, 0);
    }
    text(cr, x - 6, y0 + h + 18, 10, "compute time /", 0);
    text(cr, x - 6, y0 + h + 31, 10, "stage's median", 0);
    cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
    cairo_rectangle(cr, x, y0 + h + 42, 18, 10);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, x + 24, y0 + h + 51, 10, "no data", 0);
}

static cairo_status_t write_png(void *closure, const unsigned char *data, unsigned int len) {
    return ms_atomic_write(closure, data, len) == MS_OK ? CAIRO_STATUS_SUCCESS
                                                        : CAIRO_STATUS_WRITE_ERROR;
}

static layout make_layout(const trace_strag *s) {
    layout L = {.left = 150, .top = 56};
    L.n_cols = s->n_steps < MAX_COLS ? s->n_steps : MAX_COLS;
    L.first_step = s->max_step - L.n_cols + 1;
    L.cw = 1000 / L.n_cols;
    L.cw = L.cw < 2 ? (L.n_cols > 4000 ? 1 : 2) : L.cw > 28 ? 28 : L.cw;
    L.ch = 700 / s->n_ranks;
    L.ch = L.ch < 1 ? 1 : L.ch > 22 ? 22 : L.ch;
    L.width = L.left + L.n_cols * L.cw + 130;
    L.height = L.top + s->n_ranks * L.ch + 50;
    L.height = L.height < L.top + 300 ? L.top + 300 : L.height;
    return L;
}

static ms_status draw(cairo_t *cr, const trace_strag *s, const layout *L, const int *ord,
                      const int *stage, const double *med, int alone) {
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    draw_cells(cr, s, L, ord, stage, med);
    draw_axes(cr, s, L, ord);
    draw_legend(cr, L);
    char title[4400];
    snprintf(title, sizeof title, "compute time per step / the step's median over its stage%s: %s",
             alone ? " (a stage of one rank: its own earlier speed)" : "", s->dir);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, 14, 22, 14, title, 0);
    int n_bad = 0;
    for (int i = 0; i < s->n_ranks; i++)
        n_bad += s->ranks[i].straggler;
    snprintf(title, sizeof title, "%d straggler(s) (boxed in red), threshold %g, window %d", n_bad,
             s->opts.threshold, s->opts.window);
    cairo_set_source_rgb(cr, n_bad ? 0.85 : 0, 0, 0);
    text(cr, 14, 42, 11, title, 0);
    return cairo_status(cr) == CAIRO_STATUS_SUCCESS
               ? MS_OK
               : ms_error(MS_ERR_INTERNAL, "heat map: cairo: %s",
                          cairo_status_to_string(cairo_status(cr)));
}

ms_status trace_strag_heatmap(const trace_strag *s, const char *png_path) {
    if (!s->opts.heatmap)
        return ms_error(MS_ERR_ARG, "%s: the scores were loaded without their heat map's steps",
                        png_path);
    if (s->max_step < 1 || s->n_steps < 1 || s->n_ranks < 1)
        return ms_error(MS_ERR_NOTFOUND, "%s: no steps to draw", png_path);
    if (s->n_ranks > MAX_ROWS)
        return ms_error(MS_ERR_RANGE, "%s: %d ranks are too many for one heat map (max %d)",
                        png_path, s->n_ranks, MAX_ROWS);
    if (s->n_steps > MAX_COLS) ms_warn("%s: showing the last %d steps", png_path, MAX_COLS);
    layout L = make_layout(s);
    int *ord = malloc((size_t)s->n_ranks * sizeof *ord);
    int *stage = malloc((size_t)s->n_ranks * sizeof *stage);
    double *med = NULL;
    for (int i = 0; ord && i < s->n_ranks; i++) { /* insertion sort by (pp, dp, tp) */
        int j = i;
        while (j > 0 && trace_coord_cmp(s->ranks[ord[j - 1]].coord, s->ranks[i].coord) > 0) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
    int alone = 0;
    if (ord && stage) med = step_medians(s, &L, ord, stage, &alone);
    if (!med) {
        free(ord);
        free(stage);
        return ms_error(MS_ERR_NOMEM, "%s: out of memory", png_path);
    }
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, L.width, L.height);
    cairo_t *cr = cairo_create(sf);
    ms_status st = draw(cr, s, &L, ord, stage, med, alone);
    ms_atomic_file af;
    if (st == MS_OK) st = ms_atomic_open(&af, png_path);
    if (st == MS_OK) {
        cairo_status_t cs = cairo_surface_write_to_png_stream(sf, write_png, &af);
        if (cs != CAIRO_STATUS_SUCCESS)
            st = ms_error_wrap(MS_ERR_IO, "%s: cairo: %s", png_path, cairo_status_to_string(cs));
        if (st == MS_OK) st = ms_atomic_commit(&af);
        ms_atomic_abort(&af);
    }
    cairo_destroy(cr);
    cairo_surface_destroy(sf);
    /* cairo and fontconfig keep font caches until exit; give them back, so
     * that the process ends clean under LeakSanitizer (they are rebuilt if
     * another map is drawn) */
    cairo_debug_reset_static_data();
    FcFini();
    free(ord);
    free(stage);
    free(med);
    return st;
}
