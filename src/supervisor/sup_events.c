/* sup_events.c - the driver's events JSONL (docs/formats.md, "Supervisor
 * events"): one object a line, appended (a restarted driver adds to the
 * same file).  The line is built here, in the driver's loop, and written by
 * the writer thread (sup_writer.c) in order: a slow disk does not stall the
 * loop, and no event is dropped. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

int sup_events_open(sup_events *e, sup_writer *w, const char *path, char *why, size_t n) {
    memset(e, 0, sizeof *e);
    snprintf(e->path, sizeof e->path, "%s", path);
    e->wk = sup_writer_open(w, path, 0, why, n);
    if (e->wk < 0) return -1;
    e->w = w;
    e->t0 = ms_wall_now();
    return 0;
}

void sup_events_put(sup_events *e, const char *event, cJSON *fields) {
    cJSON *o = cJSON_CreateObject();
    double now = ms_wall_now();
    cJSON_AddNumberToObject(o, "time", (double)(long long)(now * 1e3) / 1e3);
    cJSON_AddNumberToObject(o, "t", (double)(long long)((now - e->t0) * 1e3) / 1e3);
    cJSON_AddStringToObject(o, "event", event);
    for (cJSON *it = fields ? fields->child : NULL; it;) {
        cJSON *next = it->next;
        cJSON_AddItemToObject(o, it->string, cJSON_DetachItemViaPointer(fields, it));
        it = next;
    }
    cJSON_Delete(fields);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (e->w && text) sup_writer_line(e->w, e->wk, text, strlen(text));
    cJSON_free(text);
}

void sup_events_close(sup_events *e) {
    e->w = NULL; /* the writer closes the file when it stops */
}
