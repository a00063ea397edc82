/* sup_heatlog.c - RUN_DIR/compute.jsonl, the dashboard's heat map: one
 * line per step with every rank's compute time as its heartbeats said
 * (docs/formats.md, "Supervisor files").  A row is written once every rank
 * reported the step, or, incomplete, once the job is 8 steps past it or the
 * attempt ends; a redone step gets a new row (the newer one counts).  Rows
 * are built here, in the driver's loop, and written by the writer thread
 * (sup_writer.c): past SUP_HEAT_QUEUE bytes waiting for a slow disk, rows
 * are dropped and counted (the summary event says how many). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor/sup_internal.h"

#define LAG 8 /* steps a row waits for its missing ranks */

#define CELL_MAX 16 /* ",123456789.123" or ",null" */

int sup_heatlog_open(sup_heatlog *h, sup_writer *w, const char *path, int np, uint64_t max_bytes,
                     char *why, size_t n) {
    memset(h, 0, sizeof *h);
    h->np = np;
    h->ms = malloc(sizeof *h->ms * (size_t)np * SUP_HEAT_PENDING);
    h->have = calloc(SUP_HEAT_PENDING, sizeof *h->have);
    h->line = malloc((size_t)np * CELL_MAX + 64);
    if (!h->ms || !h->have || !h->line) {
        snprintf(why, n, "%s: out of memory", path);
        sup_heatlog_close(h);
        return -1;
    }
    h->wk = sup_writer_open(w, path, SUP_HEAT_QUEUE, why, n);
    if (h->wk < 0) {
        sup_heatlog_close(h);
        return -1;
    }
    sup_writer_rotate(w, h->wk, max_bytes);
    h->w = w;
    for (int k = 0; k < SUP_HEAT_PENDING; k++)
        h->step[k] = -1;
    return 0;
}

static void write_row(sup_heatlog *h, int k) {
    const double *row = h->ms + (size_t)k * (size_t)h->np;
    size_t cap = (size_t)h->np * CELL_MAX + 64;
    int len = snprintf(h->line, cap, "{\"step\":%d,\"attempt\":%d,\"compute_ms\":[", h->step[k],
                       h->attempt);
    for (int r = 0; r < h->np; r++) /* a cell fits CELL_MAX: clamped to +-1e8 ms */
        if (isfinite(row[r]))
            len += snprintf(h->line + len, cap - (size_t)len, "%s%.3f", r ? "," : "",
                            fmin(fmax(row[r], -1e8), 1e8));
        else
            len += snprintf(h->line + len, cap - (size_t)len, "%snull", r ? "," : "");
    len += snprintf(h->line + len, cap - (size_t)len, "]}");
    sup_writer_line(h->w, h->wk, h->line, (size_t)len);
    h->step[k] = -1;
    h->have[k] = 0;
}

void sup_heatlog_feed(sup_heatlog *h, int attempt, int rank, int step, double ms) {
    if (!h->w || rank < 0 || rank >= h->np || step < 1 || !isfinite(ms)) return;
    if (attempt != h->attempt) {
        sup_heatlog_flush(h);
        h->attempt = attempt;
    }
    int k = -1, free_k = -1, oldest = -1;
    for (int i = 0; i < SUP_HEAT_PENDING; i++) {
        if (h->step[i] == step) k = i;
        if (h->step[i] < 0 && free_k < 0) free_k = i;
        if (h->step[i] >= 0 && h->step[i] < step - LAG)
            write_row(h, i), free_k = free_k < 0 ? i : free_k;
        if (h->step[i] >= 0 && (oldest < 0 || h->step[i] < h->step[oldest])) oldest = i;
    }
    if (k < 0) {
        if (free_k < 0) write_row(h, free_k = oldest); /* more steps in flight than slots */
        k = free_k;
        h->step[k] = step;
        for (int r = 0; r < h->np; r++)
            h->ms[(size_t)k * (size_t)h->np + r] = NAN;
    }
    double *cell = &h->ms[(size_t)k * (size_t)h->np + rank];
    if (!isfinite(*cell)) h->have[k]++;
    *cell = ms;
    if (h->have[k] == h->np) write_row(h, k);
}

void sup_heatlog_flush(sup_heatlog *h) {
    for (int pass = 0; h->w && pass < SUP_HEAT_PENDING; pass++) { /* in step order */
        int k = -1;
        for (int i = 0; i < SUP_HEAT_PENDING; i++)
            if (h->step[i] >= 0 && (k < 0 || h->step[i] < h->step[k])) k = i;
        if (k < 0) break;
        write_row(h, k);
    }
}

void sup_heatlog_close(sup_heatlog *h) {
    sup_heatlog_flush(h); /* to the writer, which closes the file when it stops */
    free(h->ms);
    free(h->line);
    free(h->have);
    memset(h, 0, sizeof *h);
}
