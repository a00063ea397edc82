/* sup_events.c - the driver's events JSONL (docs/formats.md, "Supervisor
 * events"): one object a line, flushed, appended (a restarted driver adds
 * to the same file). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

int sup_events_open(sup_events *e, const char *path, char *why, size_t n) {
    memset(e, 0, sizeof *e);
    snprintf(e->path, sizeof e->path, "%s", path);
    e->f = fopen(path, "ae"); /* "e": O_CLOEXEC, so mpirun and diag do not inherit it */
    if (!e->f) {
        snprintf(why, n, "%s: open the events file: %s", path, strerror(errno));
        return -1;
    }
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
    if (e->f && text) {
        fprintf(e->f, "%s\n", text);
        fflush(e->f);
    }
    cJSON_free(text);
}

void sup_events_close(sup_events *e) {
    if (e->f) fclose(e->f);
    e->f = NULL;
}
