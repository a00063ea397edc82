/* fuzz_dash.c - libFuzzer harness of the dashboard's model of a run
 * (src/supervisor/sup_dash_model.c): the line feeders of the metrics,
 * events and compute files (dash_model_metrics_line, _event_line,
 * _compute_line), which read whatever a run directory holds, and the API
 * replies built from what they kept.
 *
 * The input is a stream of lines.  A line starting with 'm', 'e' or 'c'
 * goes, without that byte, to the metrics, events or compute feeder; the
 * line "r" is a replaced metrics file (dash_model_metrics_reset); any other
 * line goes to all three.  Then every reply is built (with and without a
 * live view) and printed.  Nothing may crash or leak, whatever the lines.
 */
#include <cjson/cJSON.h>
#include <math.h>

#include "fuzz_lines.h"
#include "supervisor/sup_dash_internal.h"

static void feed(void *arg, const char *line, size_t len) {
    dash_model *m = arg;
    if (len == 1 && line[0] == 'r') {
        dash_model_metrics_reset(m);
    } else if (len > 0 && line[0] == 'm') {
        dash_model_metrics_line(m, line + 1, len - 1);
    } else if (len > 0 && line[0] == 'e') {
        dash_model_event_line(m, line + 1, len - 1);
    } else if (len > 0 && line[0] == 'c') {
        dash_model_compute_line(m, line + 1, len - 1);
    } else {
        dash_model_metrics_line(m, line, len);
        dash_model_event_line(m, line, len);
        dash_model_compute_line(m, line, len);
    }
}

/* Print a reply (it must print) and delete it. */
static void reply(cJSON *o) {
    MS_CHECK(cJSON_IsObject(o));
    char *text = cJSON_PrintUnformatted(o);
    MS_CHECK(text != NULL);
    cJSON_free(text);
    cJSON_Delete(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const sup_dash_rank ranks[] = {{SUP_DASH_RUNNING, 5, 0.5, 12.0},
                                          {SUP_DASH_HUNG, 3, NAN, NAN},
                                          {SUP_DASH_DONE, 9, 1.0, 3.0}};
    const sup_dash_live live = {2, 1, 7, 1, 0.75, 3, ranks};
    dash_model *m = dash_model_new();
    MS_CHECK(m != NULL);
    fuzz_each_line(data, size, feed, m);
    MS_CHECK(dash_model_bad_lines(m) >= 0 && dash_model_metrics_path(m));
    reply(dash_model_status(m, NULL, "run", 1000.0));
    reply(dash_model_status(m, &live, "run", 1000.0));
    reply(dash_model_metrics(m, -1, -1, DASH_METRICS_REPLY));
    reply(dash_model_metrics(m, 3, 1, 2));
    reply(dash_model_events(m, -1, DASH_EVENTS_REPLY));
    reply(dash_model_events(m, 2, 1));
    reply(dash_model_heatmap(m, DASH_HEAT_COLS));
    reply(dash_model_heatmap(m, 1));
    reply(dash_model_checkpoints(m));
    dash_model_free(m);
    return 0;
}
