/* monitor.c - metrics writer, GEMM peak probe, peak RSS. */
#include "monitor/monitor.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/bf16.h"
#include "base/fileio.h"
#include "base/rng.h"
#include "base/timeutil.h"

/* Keep the lines of an existing metrics file whose "step" is <= keep. */
static ms_status trim_metrics(const char *path, int keep) {
    char *text = NULL;
    size_t len = 0;
    if (ms_file_read_all(path, &text, &len) != MS_OK) return MS_OK; /* nothing to keep */
    ms_atomic_file af;
    ms_status st = ms_atomic_open(&af, path);
    for (char *line = text, *next; st == MS_OK && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        const char *sp = strstr(line, "\"step\":");
        if (sp && atoi(sp + 7) <= keep) st = ms_atomic_printf(&af, "%s\n", line);
    }
    if (st == MS_OK)
        st = ms_atomic_commit(&af);
    else
        ms_atomic_abort(&af);
    free(text);
    return st;
}

ms_status mon_metrics_open(mon_metrics *mm, const char *path, int resume_step) {
    memset(mm, 0, sizeof *mm);
    if (!path || !*path) return MS_OK;
    snprintf(mm->path, sizeof mm->path, "%s", path);
    if (resume_step > 0) MS_TRY(trim_metrics(path, resume_step));
    mm->f = fopen(path, resume_step > 0 ? "a" : "w");
    if (!mm->f) return ms_error(MS_ERR_IO, "%s: open metrics: %s", path, strerror(errno));
    return MS_OK;
}

ms_status mon_metrics_write(mon_metrics *mm, const char *json_object) {
    if (!mm->f) return MS_OK;
    if (fprintf(mm->f, "%s\n", json_object) < 0 || fflush(mm->f) != 0)
        return ms_error(MS_ERR_IO, "%s: write metrics: %s", mm->path, strerror(errno));
    return MS_OK;
}

void mon_metrics_close(mon_metrics *mm) {
    if (mm->f) fclose(mm->f);
    mm->f = NULL;
}

double mon_probe_peak_flops(be_backend *be, int n, int reps) {
    size_t bytes = (size_t)n * n * be_dtype_size(be->act_dtype);
    float *host = malloc((size_t)n * n * sizeof(float));
    void *a = be->alloc(be, bytes), *b = be->alloc(be, bytes), *c = be->alloc(be, bytes);
    double best = 0;
    if (!host || !a || !b || !c) goto out;
    for (size_t i = 0; i < (size_t)n * n; i++)
        host[i] = ms_rng_uniform(7, 0, i) - 0.5f;
    if (be->act_dtype == BE_BF16) { /* round to bf16 in place (nearest even) */
        uint16_t *h16 = (uint16_t *)host;
        for (size_t i = 0; i < (size_t)n * n; i++)
            h16[i] = ms_f32_to_bf16(host[i]); /* reads float i before h16[i] covers it */
    }
    be->to_device(be, a, host, bytes);
    be->to_device(be, b, host, bytes);
    for (int r = 0; r < reps + 1; r++) { /* the first run warms up */
        be->sync(be);
        double t0 = ms_now();
        be->gemm(be, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n, 0, NULL, BE_EPI_NONE, NULL);
        be->sync(be);
        double dt = ms_now() - t0;
        double f = 2.0 * n * (double)n * n / dt;
        if (r > 0 && f > best) best = f;
    }
out:
    if (a) be->free(be, a);
    if (b) be->free(be, b);
    if (c) be->free(be, c);
    free(host);
    return best;
}

double mon_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_maxrss * 1024.0;
}
