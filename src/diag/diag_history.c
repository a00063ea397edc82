/* diag_history.c - this node's past results (a JSON-lines file): the median
 * a check is compared with, and the atomic append of a passing result (see
 * diag.h, "History"). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/jsonstr.h"
#include "base/fileio.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "diag/diag_internal.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The most a device can do, far past any made (a GEMM: 100 PFLOP/s; memory: 1 PB/s): a
 * value beyond it is a damaged entry.  (A history line of 1e308 GFLOP/s made every later run
 * SLOW, and a failed run is not appended: the node failed for good.) */
static double plausible_max(const char *check) {
    return !strcmp(check, "gemm") ? 1e8 : !strcmp(check, "memory") ? 1e6 : INFINITY;
}

/* 1 if the object o is an entry of key k, its value in *v; -1 if it is one of k whose value
 * cannot be a result (not a number, not positive, beyond any device: *why says which);
 * else 0. */
static int entry_matches(const cJSON *o, const diag_hist_key *k, double *v, const char **why) {
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(o, "check");
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(o, "device");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(o, "size");
    const cJSON *lr = cJSON_GetObjectItemCaseSensitive(o, "local_rank");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(o, "value");
    if (!cJSON_IsString(ch) || strcmp(ch->valuestring, k->check)) return 0;
    if (!cJSON_IsString(dev) || strcmp(dev->valuestring, k->device)) return 0;
    if (!cJSON_IsNumber(size) || size->valueint != k->size) return 0;
    if (cJSON_IsNumber(lr) && lr->valueint != k->local_rank) return 0;
    *why = !cJSON_IsNumber(val)                         ? "its value is not a number"
           : !(val->valuedouble > 0)                    ? "its value is not positive"
           : val->valuedouble > plausible_max(k->check) ? "its value is beyond any device"
                                                        : NULL;
    if (*why) return -1;
    *v = val->valuedouble;
    return 1;
}

/* 1 if line lineno of path was said already by this process, else marks it (each check
 * reads the file: the warnings came twice).  The lines of one file, the history's newest
 * DIAG_HISTORY_KEEP and a few more; a line past them is said each time. */
static int warned_once(const char *path, int lineno) {
    static char last[4096];
    static unsigned char said[4096 / 8];
    if (strcmp(last, path)) {
        snprintf(last, sizeof last, "%s", path);
        memset(said, 0, sizeof said);
    }
    if (lineno < 0 || lineno >= (int)sizeof said * 8) return 0;
    unsigned char bit = (unsigned char)(1u << (lineno % 8));
    if (said[lineno / 8] & bit) return 1;
    said[lineno / 8] |= bit;
    return 0;
}

ms_status diag_history_median(const char *path, const diag_hist_key *k, double *median, int *n) {
    char *text = NULL;
    size_t len = 0;
    double vals[DIAG_HISTORY_MEDIAN];
    int nv = 0, seen = 0, lineno = 0;
    *median = 0;
    *n = 0;
    ms_status st = ms_file_read_all(path, &text, &len);
    if (st == MS_ERR_NOTFOUND) return MS_OK; /* the first run */
    MS_TRY(st);
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        if (!line[strspn(line, " \t\r")]) continue;
        cJSON *o = cJSON_Parse(line);
        double v = 0;
        const char *why = NULL;
        int m = cJSON_IsObject(o) ? entry_matches(o, k, &v, &why) : 0;
        if (!cJSON_IsObject(o) && !warned_once(path, lineno))
            ms_warn("diag: %s:%d: not a JSON object; line skipped", path, lineno);
        else if (m < 0 && !warned_once(path, lineno))
            ms_warn("diag: %s:%d: a %s entry whose %s; line skipped", path, lineno, k->check,
                    why + 4);
        else if (m > 0)
            vals[seen++ % DIAG_HISTORY_MEDIAN] = v; /* a ring: the newest entries */
        cJSON_Delete(o);
    }
    free(text);
    nv = seen < DIAG_HISTORY_MEDIAN ? seen : DIAG_HISTORY_MEDIAN;
    if (!nv) return MS_OK;
    qsort(vals, (size_t)nv, sizeof vals[0], cmp_double);
    *median = nv % 2 ? vals[nv / 2] : 0.5 * (vals[nv / 2 - 1] + vals[nv / 2]);
    *n = nv;
    return MS_OK;
}

/* 1 if o is a diag entry: a check, a device and a value (what
 * diag_history_append writes; the other keys are not needed). */
static int is_entry(const cJSON *o) {
    /* (a value that is no number is a damaged entry, skipped by the reader with a warning
     * naming its line: before, it refused the whole file without saying where) */
    return cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "check")) &&
           cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "device")) &&
           cJSON_GetObjectItemCaseSensitive(o, "value");
}

/* Whether text (len bytes, NUL-terminated: ms_file_read_*) can be a history:
 * empty, or no NUL byte, a diag entry on one of its lines and no JSON object
 * that is not one (a line that is no JSON at all, a torn write, is skipped
 * by the reader).  Before, any JSON object passed, and the append, which
 * keeps the newest lines only, cut a corpus or a metrics file given by
 * mistake to its last 2000 lines.  *why: what is wrong. */
static int history_text_ok(char *text, size_t len, const char **why) {
    int entries = 0, others = 0;
    *why = "holds a NUL byte";
    if (len == 0) return 1;
    if (memchr(text, 0, len)) return 0;
    for (char *line = text, *next; !others && line && *line; line = next) {
        next = strchr(line, '\n');
        char c = next ? *next : 0;
        if (next) *next = 0;
        cJSON *o = cJSON_Parse(line);
        if (cJSON_IsObject(o)) is_entry(o) ? entries++ : others++;
        cJSON_Delete(o);
        if (next) *next++ = c;
    }
    *why = others ? "holds JSON objects that are not diag entries (check, device, value)"
                  : "holds no diag entry (a JSON object with check, device and value)";
    return entries && !others;
}

static ms_status history_refused(const char *path, const char *why) {
    return ms_error(MS_ERR_ARG,
                    "--history %s %s: not a diag history (JSON lines); it is left as it is (an "
                    "append keeps only the newest %d lines)",
                    path, why, DIAG_HISTORY_KEEP);
}

ms_status diag_history_check(const char *path) {
    char *text = NULL;
    size_t len = 0;
    ms_status st = ms_file_read_max(path, DIAG_HISTORY_MAX_BYTES, &text, &len);
    if (st == MS_ERR_NOTFOUND) return MS_OK; /* the first run */
    if (st == MS_ERR_FORMAT) {
        char why[64];
        snprintf(why, sizeof why, "is larger than %d MB", DIAG_HISTORY_MAX_BYTES >> 20);
        return history_refused(path, why);
    }
    MS_TRY(st);
    const char *why = "";
    int ok = history_text_ok(text, len, &why);
    free(text);
    return ok ? MS_OK : history_refused(path, why);
}

/* The start of the newest `keep` lines of text (len bytes). */
static size_t keep_tail(const char *text, size_t len, int keep) {
    int lines = 0;
    for (size_t i = len; i > 0; i--)
        if (text[i - 1] == '\n' && i != len && ++lines == keep) return i;
    return 0;
}

static ms_status append_locked(const char *path, const char *line) {
    char *text = NULL;
    size_t len = 0;
    ms_status st = ms_file_read_all(path, &text, &len);
    if (st == MS_ERR_NOTFOUND) st = MS_OK, len = 0;
    if (st != MS_OK) return st;
    const char *why = "";
    if (text && !history_text_ok(text, len, &why)) {
        free(text);
        return history_refused(path, why);
    }
    size_t from = text ? keep_tail(text, len, DIAG_HISTORY_KEEP - 1) : 0;
    ms_atomic_file af;
    st = ms_atomic_open(&af, path);
    if (st == MS_OK && len > from) st = ms_atomic_write(&af, text + from, len - from);
    if (st == MS_OK && len > from && text[len - 1] != '\n') st = ms_atomic_write(&af, "\n", 1);
    if (st == MS_OK) st = ms_atomic_printf(&af, "%s\n", line);
    if (st == MS_OK) st = ms_atomic_commit(&af);
    if (st != MS_OK) ms_atomic_abort(&af);
    free(text);
    return st;
}

ms_status diag_history_append(const char *path, const diag_hist_key *k, double value,
                              const char *host) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    cJSON_AddStringToObject(o, "check", k->check);
    cJSON_AddNumberToObject(o, "value", value);
    cJSON_AddStringToObject(o, "unit", k->unit);
    cJSON_AddStringToObject(o, "device", k->device);
    cJSON_AddNumberToObject(o, "size", k->size);
    cJSON_AddNumberToObject(o, "local_rank", k->local_rank);
    cJSON_AddStringToObject(o, "host", host);
    cJSON_AddNumberToObject(o, "time", ms_wall_now());
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!line) return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    ms_utf8_fix(line); /* a JSON line every reader takes, whatever bytes a path had */
    char lock[4200];
    snprintf(lock, sizeof lock, "%s.lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ms_status st = MS_OK;
    if (fd < 0)
        st = ms_error(MS_ERR_IO, "%s: open: %s", lock, strerror(errno));
    else if (flock(fd, LOCK_EX) != 0)
        st = ms_error(MS_ERR_IO, "%s: flock: %s", lock, strerror(errno));
    if (st == MS_OK) st = append_locked(path, line);
    if (fd >= 0) close(fd); /* releases the lock */
    free(line);
    return st;
}

int diag_history_judge(const diag_config *c, const diag_hist_key *k, diag_result *r) {
    if (!c->history || !*c->history) {
        diag_detail(r, "no history (--history FILE)");
        return 1;
    }
    double med = 0;
    int n = 0;
    if (diag_history_median(c->history, k, &med, &n) != MS_OK) {
        diag_detail(r, "history unreadable, not compared: %s", ms_errmsg());
        return 1;
    }
    if (!n) {
        diag_detail(r, "no comparable history yet in %s", c->history);
        return 1;
    }
    if (n < DIAG_HISTORY_MIN) { /* one earlier run may have been a busy moment */
        diag_detail(r, "%.2f x the median %.4g %s of %d run(s) in %s: not judged (fewer than %d)",
                    r->value / med, med, k->unit, n, c->history, DIAG_HISTORY_MIN);
        return 1;
    }
    double floor = c->slow_factor * med;
    if (!r->has_limit || floor > r->limit) r->has_limit = 1, r->limit = floor, r->limit_is_max = 0;
    if (r->value < floor) {
        diag_detail(r, "SLOW: %.4g %s < %.2f x median %.4g %s of %d run(s) in %s", r->value,
                    k->unit, c->slow_factor, med, k->unit, n, c->history);
        return 0;
    }
    diag_detail(r, "%.2f x the median %.4g %s of %d run(s) in %s", r->value / med, med, k->unit, n,
                c->history);
    return 1;
}
