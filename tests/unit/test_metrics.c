/* test_metrics.c - the metrics JSONL sink (monitor/step.h): a run's config,
 * step, validation and "ckpt" lines with their fields (an unknown stall is
 * null), sinks without on_ckpt are skipped, and a resumed run keeps the
 * lines of steps <= resume_step (commits by the same rule as steps) and
 * drops the later ones.  The peak cache (monitor/peakcache.h): of eight
 * processes saving at once one writes, a later load reads the peak and
 * is not re-probed, another key's entry is kept beside it, and a corrupt
 * or foreign file is ignored and rewritten. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/fileio.h"
#include "check.h"
#include "monitor/peakcache.h"
#include "monitor/step.h"
#include "tmpdir.h"

#define MAX_LINES 64

typedef struct {
    int n;
    cJSON *o[MAX_LINES];
} lines;

/* Every line of path, parsed (NULL for a line that is not JSON). */
static void lines_read(const char *path, lines *l) {
    char *text = NULL;
    size_t len = 0;
    memset(l, 0, sizeof *l);
    if (ms_file_read_all(path, &text, &len) != MS_OK) return;
    for (char *s = text, *next; s && *s && l->n < MAX_LINES; s = next) {
        next = strchr(s, '\n');
        if (next) *next++ = 0;
        l->o[l->n++] = cJSON_Parse(s);
    }
    free(text);
}

static void lines_free(lines *l) {
    for (int i = 0; i < l->n; i++)
        cJSON_Delete(l->o[i]);
}

static const char *str_of(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double num_of(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* "s3 v3 c3 k ..." : one word per line (s: step, v: validation, c: ckpt,
 * k: config) with its step, to compare a file's shape in one string. */
static void shape_of(const lines *l, char *buf, size_t n) {
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < l->n && off < n; i++) {
        const cJSON *o = l->o[i];
        const char *type = str_of(o, "type");
        char w = !strcmp(type, "config")                           ? 'k'
                 : !strcmp(type, "ckpt")                           ? 'c'
                 : cJSON_GetObjectItemCaseSensitive(o, "val_loss") ? 'v'
                                                                   : 's';
        if (w == 'k')
            off += (size_t)snprintf(buf + off, n - off, "%sk", i ? " " : "");
        else
            off +=
                (size_t)snprintf(buf + off, n - off, "%s%c%g", i ? " " : "", w, num_of(o, "step"));
    }
}

static mon_step step_at(int step) {
    mon_step s = {.step = step, .steps = 8, .loss = 3.5f - 0.25f * (float)step, .lr = 1e-3f};
    s.sec = 0.01, s.tok_s = 6400, s.wall_s = 1796115200.0 + step;
    return s;
}

static mon_ckpt ckpt_at(int step, double stall_ms) {
    mon_ckpt c = {.step = step,
                  .bytes = 1000000 + step,
                  .stall_ms = stall_ms,
                  .persist_ms = 812.5,
                  .wall_s = 1796115260.125};
    return c;
}

/* A fresh run: 6 steps, a validation at 4, commits of 3 and 6 (6 with an
 * unknown stall), written through a record whose progress sink has no
 * on_ckpt. */
static void test_lines(const char *path) {
    mon_record *r = NULL;
    mon_sink m;
    T_OK(mon_record_create(&r) == MS_OK);
    T_OK(mon_record_add(r, mon_sink_progress(0)) == MS_OK);
    T_OK(mon_sink_metrics(&m, path, 0, "{\"options\":{\"steps\":8}}") == MS_OK);
    T_OK(m.on_ckpt != NULL);
    T_OK(mon_record_add(r, m) == MS_OK);
    for (int k = 1; k <= 6; k++) {
        mon_step s = step_at(k);
        T_OK(mon_record_step(r, &s) == MS_OK);
        if (k == 4) {
            mon_val v = {.step = 4, .val_loss = 2.5f, .sec = 0.02, .wall_s = 1796115204.5};
            T_OK(mon_record_val(r, &v) == MS_OK);
            mon_ckpt c = ckpt_at(3, 41.2); /* noticed a step after it was taken */
            T_OK(mon_record_ckpt(r, &c) == MS_OK);
        }
    }
    mon_ckpt c6 = ckpt_at(6, NAN);
    T_OK(mon_record_ckpt(r, &c6) == MS_OK);
    mon_record_destroy(r);

    lines l;
    char shape[512];
    lines_read(path, &l);
    shape_of(&l, shape, sizeof shape);
    T_OK(!strcmp(shape, "k s1 s2 s3 s4 v4 c3 s5 s6 c6"));
    if (strcmp(shape, "k s1 s2 s3 s4 v4 c3 s5 s6 c6")) fprintf(stderr, "shape: %s\n", shape);
    /* the exact text of a ckpt line: key order, rounding, null for NaN */
    char *text = NULL;
    size_t len = 0;
    T_OK(ms_file_read_all(path, &text, &len) == MS_OK);
    T_STR_CONTAINS(text, "\n{\"type\":\"ckpt\",\"step\":3,\"bytes\":1000003,\"stall_ms\":41.2,"
                         "\"persist_ms\":812.5,\"wall\":1796115260.125}\n");
    T_STR_CONTAINS(text, "{\"type\":\"ckpt\",\"step\":6,\"bytes\":1000006,\"stall_ms\":null,");
    free(text);
    const cJSON *c = l.n > 6 ? l.o[6] : NULL;
    T_OK(c && !cJSON_GetObjectItemCaseSensitive(c, "loss")); /* readers of steps skip it */
    lines_free(&l);
}

/* Resume at step 4 (the commit of step 3 is kept, 6 and the steps after
 * 4 are dropped), then steps 5..8 with the commit of 8. */
static void test_resume(const char *path) {
    mon_sink m;
    T_OK(mon_sink_metrics(&m, path, 4, "{\"options\":{\"steps\":8}}") == MS_OK);
    for (int k = 5; k <= 8; k++) {
        mon_step s = step_at(k);
        T_OK(m.on_step(m.ctx, &s) == MS_OK);
    }
    mon_ckpt c8 = ckpt_at(8, 40);
    T_OK(m.on_ckpt(m.ctx, &c8) == MS_OK);
    m.close(m.ctx);

    lines l;
    char shape[512];
    const char *want = "k s1 s2 s3 s4 v4 c3 k s5 s6 s7 s8 c8";
    lines_read(path, &l);
    shape_of(&l, shape, sizeof shape);
    T_OK(!strcmp(shape, want));
    if (strcmp(shape, want)) fprintf(stderr, "shape: %s\nwant:  %s\n", shape, want);
    T_NEAR(l.n > 7 ? num_of(l.o[7], "resume_step") : -1, 4, 0);
    T_NEAR(l.n > 6 ? num_of(l.o[6], "bytes") : -1, 1000003, 0);
    T_NEAR(l.n > 6 ? num_of(l.o[6], "stall_ms") : -1, 41.2, 1e-9);
    lines_free(&l);

    /* resumed at the commit of step 6 (the file has no line of it: the
     * run died before noticing): nothing is kept twice */
    T_OK(mon_sink_metrics(&m, path, 6, NULL) == MS_OK);
    m.close(m.ctx);
    lines_read(path, &l);
    shape_of(&l, shape, sizeof shape);
    want = "k s1 s2 s3 s4 v4 c3 k s5 s6 k";
    T_OK(!strcmp(shape, want));
    if (strcmp(shape, want)) fprintf(stderr, "shape: %s\nwant:  %s\n", shape, want);
    lines_free(&l);
}

/* A peak as the start-up probe leaves it: `probes` probes, all run here,
 * of the full size (2048^3 on a CPU). */
static void peak_probed(mon_peak *p, double flops, int probes) {
    p->from_probe = 1;
    p->probe_n = 2048;
    p->flops = p->probed = flops;
    p->probes = p->probes_run = probes;
    p->cached = 0;
}

/* Eight processes save p at once (released together through a pipe): how
 * many wrote, and how many failed (-1). */
static int save_at_once(const mon_peak *p, const be_backend *be, int *failed) {
    int gate[2], wrote = 0;
    pid_t kids[8];
    *failed = 0;
    if (pipe(gate) != 0) return -1;
    for (int i = 0; i < 8; i++)
        if ((kids[i] = fork()) == 0) {
            char c;
            close(gate[1]);
            while (read(gate[0], &c, 1) > 0) { /* until the parent closes it */
            }
            int rc = mon_peak_cache_save(p, be);
            _exit(rc == 1 ? 1 : rc == 0 ? 0 : 2);
        }
    close(gate[0]);
    close(gate[1]); /* go */
    for (int i = 0; i < 8; i++) {
        int st = 0;
        if (kids[i] > 0 && waitpid(kids[i], &st, 0) == kids[i] && WIFEXITED(st)) {
            wrote += WEXITSTATUS(st) == 1;
            *failed += WEXITSTATUS(st) == 2;
        } else {
            (*failed)++;
        }
    }
    return wrote;
}

static int cache_entries(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (ms_file_read_all(path, &text, &len) != MS_OK) return -1;
    cJSON *o = cJSON_Parse(text);
    free(text);
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "entries"));
    cJSON_Delete(o);
    return n;
}

static void test_peak_cache(const char *dir) {
    be_backend *be = NULL, *be2 = NULL;
    T_OK(be_cpu_create(&be, 1) == MS_OK && be_cpu_create(&be2, 2) == MS_OK);
    if (!be || !be2) goto out;
    mon_peak p, q;
    memset(&p, 0, sizeof p);
    T_OK(!mon_peak_cache_load(&p, be, NULL) && !p.cache_path[0]); /* no cache dir: off */
    T_OK(mon_peak_cache_save(&p, be) == 0);
    T_OK(!mon_peak_cache_load(&p, be, dir) && strstr(p.cache_path, "/peak-")); /* none yet */
    char path[sizeof p.cache_path];
    snprintf(path, sizeof path, "%s", p.cache_path);

    /* the ranks of a host start at once: one writes (a peak of a device too
     * slow for the full probe: its size is kept) */
    peak_probed(&p, 5e10, 1);
    p.probe_n = 512;
    int failed = 0, wrote = save_at_once(&p, be, &failed);
    T_EQ_INT(wrote, 1);
    T_EQ_INT(failed, 0);
    T_EQ_INT(cache_entries(path), 1);

    /* a restart reads it: the same peak, from the probes, not probed again */
    memset(&q, 0, sizeof q);
    T_OK(mon_peak_cache_load(&q, be, dir) == 1);
    T_OK(q.flops == 5e10 && q.probed == 5e10 && q.from_probe && q.cached && q.probes == 1 &&
         q.probes_run == 0);
    T_STR_CONTAINS(q.source, "cached in ");
    T_EQ_INT(q.probe_n, 512);
    T_STR_CONTAINS(q.source, "(512^3, fp32)");
    T_OK(mon_peak_cache_save(&q, be) == 0); /* it ran no probe: nothing to write */

    /* the warm-up's three probes replace the one; then there is nothing new */
    peak_probed(&p, 6e10, MON_PEAK_PROBES);
    T_EQ_INT(mon_peak_cache_save(&p, be), 1);
    T_EQ_INT(mon_peak_cache_save(&p, be), 0);
    memset(&q, 0, sizeof q);
    T_OK(mon_peak_cache_load(&q, be, dir) == 1 && q.flops == 6e10 && q.probes == MON_PEAK_PROBES);
    T_EQ_INT(q.probe_n, 2048);
    mon_peak_reprobe(&q, be); /* a full cached peak is not probed again */
    T_OK(q.probes == MON_PEAK_PROBES && q.probes_run == 0 && q.cached && q.flops == 6e10);
    /* another rank of the host, its probes at a busy moment (a lower peak), writes after:
     * the entry keeps the higher peak (the lower one replaced it: the next start's MFU
     * doubled at the same speed); a higher one replaces it */
    peak_probed(&p, 3e10, MON_PEAK_PROBES);
    mon_peak_cache_save(&p, be);
    memset(&q, 0, sizeof q);
    T_OK(mon_peak_cache_load(&q, be, dir) == 1 && q.flops == 6e10);
    peak_probed(&p, 7e10, MON_PEAK_PROBES);
    T_EQ_INT(mon_peak_cache_save(&p, be), 1);
    memset(&q, 0, sizeof q);
    T_OK(mon_peak_cache_load(&q, be, dir) == 1 && q.flops == 7e10);
    T_EQ_INT(cache_entries(path), 1);

    /* another key (2 threads) misses, and its entry is kept beside the first */
    memset(&q, 0, sizeof q);
    T_OK(mon_peak_cache_load(&q, be2, dir) == 0 && !q.from_probe);
    peak_probed(&q, 9e10, 1);
    T_EQ_INT(mon_peak_cache_save(&q, be2), 1);
    T_EQ_INT(cache_entries(path), 2);
    memset(&q, 0, sizeof q);
    T_OK(mon_peak_cache_load(&q, be, dir) == 1 && q.flops == 7e10);
    memset(&q, 0, sizeof q);
    T_OK(mon_peak_cache_load(&q, be2, dir) == 1 && q.flops == 9e10);

    /* corrupt, or not a cache: ignored (a probe), then rewritten */
    const char *bad[] = {"{\"format\": \"megascale-peak-cache\", \"version\": 1, \"entr",
                         "{\"format\": \"other\", \"version\": 1, \"entries\": []}",
                         "{\"format\": \"megascale-peak-cache\", \"version\": 1, \"entries\": "
                         "[{\"key\": {}, \"flops\": -1, \"probes\": 1, \"fp32_flops\": 0, "
                         "\"written\": \"x\"}]}"};
    for (int i = 0; i < 3; i++) {
        T_OK(ms_file_write_atomic(path, bad[i], strlen(bad[i])) == MS_OK);
        memset(&q, 0, sizeof q);
        T_OK(mon_peak_cache_load(&q, be, dir) == 0);
        peak_probed(&q, 7e10, 1);
        T_EQ_INT(mon_peak_cache_save(&q, be), 1);
        memset(&q, 0, sizeof q);
        T_OK(mon_peak_cache_load(&q, be, dir) == 1 && q.flops == 7e10);
        T_EQ_INT(cache_entries(path), 1);
    }
out:
    if (be) be_destroy(be);
    if (be2) be_destroy(be2);
}

int main(void) {
    if (!ms_tmpdir_make("metrics")) return 1;
    const char *path = tpath("m.jsonl");
    char p[512];
    snprintf(p, sizeof p, "%s", path);
    test_lines(p);
    test_resume(p);
    test_peak_cache(tmpdir);
    if (!ms_t_fail) ms_tmpdir_remove();
    return ms_test_summary("test_metrics");
}
