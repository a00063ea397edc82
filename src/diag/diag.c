/* diag.c - the node self-test: runs the checks in order and renders the
 * report as a text table or one JSON object (see diag.h). */
#include "diag/diag.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/jsonstr.h"
#include "base/ctx.h"
#include "base/fileio.h"
#include "diag/diag_internal.h"

ms_status diag_config_check(const diag_config *c) {
    if (c->gemm_n < 1 || c->gemm_n > 4096)
        return ms_error(MS_ERR_ARG, "--gemm-n %d: expected 1..4096", c->gemm_n);
    if (c->gemm_speed_n < 0 || c->gemm_speed_n > 32768)
        return ms_error(MS_ERR_ARG, "--gemm-speed-n %d: expected 0 (auto) or 1..32768",
                        c->gemm_speed_n);
    if (!(c->slow_factor >= 0 && c->slow_factor <= 1))
        return ms_error(MS_ERR_ARG, "--slow-factor %g: expected 0..1", c->slow_factor);
    if (c->mem_mb < 1 || c->mem_mb > 65536)
        return ms_error(MS_ERR_ARG, "--mem-mb %d: expected 1..65536", c->mem_mb);
    if (!(c->min_mem_gbps >= 0))
        return ms_error(MS_ERR_ARG, "--min-mem-gbps %g: expected >= 0", c->min_mem_gbps);
    if (!(c->comm_timeout > 0 && c->comm_timeout <= 1e6))
        return ms_error(MS_ERR_ARG, "--comm-timeout %g: expected > 0 and at most 1e6 seconds",
                        c->comm_timeout);
    if (c->storage_mb < 1 || c->storage_mb > 1048576)
        return ms_error(MS_ERR_ARG, "--storage-mb %d: expected 1..1048576", c->storage_mb);
    if (c->threads < 0) return ms_error(MS_ERR_ARG, "--threads %d: expected >= 0", c->threads);
    if (c->history && *c->history && c->history_dir && *c->history_dir)
        return ms_error(MS_ERR_ARG,
                        "--history %s and --history-dir %s: give one (a file, or a directory "
                        "with a file per node)",
                        c->history, c->history_dir);
    struct stat sb; /* what cannot be used: said at once, not after the checks */
    if (c->history && *c->history && stat(c->history, &sb) == 0 && S_ISDIR(sb.st_mode))
        return ms_error(MS_ERR_ARG,
                        "--history %s is a directory: --history takes a file (JSON lines), "
                        "--history-dir DIR one file a node in DIR",
                        c->history);
    ms_status st = c->history && *c->history ? ms_path_check_replaceable(c->history) : MS_OK;
    if (st != MS_OK) /* its directory missing: passing results would not be kept */
        return ms_error_wrap(st, "--history");
    if (c->history && *c->history) MS_TRY(diag_history_check(c->history));
    st = c->history_dir && *c->history_dir ? ms_path_check_writable(c->history_dir, 1) : MS_OK;
    if (st != MS_OK) /* a file, or under one: a usage error, not a failed disk */
        return ms_error_wrap(st, "--history-dir");
    if (c->storage_dir && *c->storage_dir && stat(c->storage_dir, &sb) == 0 &&
        !S_ISDIR(sb.st_mode)) /* a usage error, not a failed disk */
        return ms_error(MS_ERR_ARG, "--storage-dir %s is a file, not a directory", c->storage_dir);
    if (c->node && *c->node && !ms_node_name_ok(c->node))
        return ms_error(MS_ERR_ARG, "node name '%s': expected 1 to %d characters of [A-Za-z0-9._-]",
                        c->node, MS_NODE_NAME_MAX - 1);
    return MS_OK;
}

void diag_detail(diag_result *r, const char *fmt, ...) {
    size_t len = strlen(r->detail);
    if (len + 3 >= sizeof r->detail) return;
    if (len) len += (size_t)snprintf(r->detail + len, sizeof r->detail - len, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail + len, sizeof r->detail - len, fmt, ap);
    va_end(ap);
}

void diag_fail_slow(diag_result *r) {
    r->slow = r->ok || r->slow;
    r->ok = 0;
}

int diag_fault(const diag_config *c, const char *kind, int rank) {
    return ms_fault_find(c->faults, kind, -1, rank) || ms_fault_find(c->faults, kind, 1, rank);
}

/* --history-dir: this node's history file DIR/NODE.jsonl in cc->history
 * (path: its buffer); DIR is created if missing. */
static ms_status node_history(diag_config *cc, const char *node, char *path, size_t n) {
    if (!cc->history_dir || !*cc->history_dir) return MS_OK;
    ms_status st = ms_mkdirs(cc->history_dir);
    if (st != MS_OK) return ms_error_wrap(st, "--history-dir %s", cc->history_dir);
    if ((size_t)snprintf(path, n, "%s/%s.jsonl", cc->history_dir, node) >= n)
        return ms_error(MS_ERR_ARG, "--history-dir %s: path too long", cc->history_dir);
    cc->history = path;
    return MS_OK;
}

ms_status diag_run(const diag_config *c0, diag_report *r) {
    const ms_ctx *ctx = ms_ctx_get();
    comm_world *w = NULL;
    memset(r, 0, sizeof *r);
    gethostname(r->host, sizeof r->host - 1);
    r->rank = ctx->rank;
    r->world = ctx->world;
    snprintf(r->device, sizeof r->device, "%s", c0->device);
    if (c0->node && *c0->node)
        snprintf(r->node, sizeof r->node, "%s", c0->node);
    else
        MS_TRY(ms_node_of(NULL, r->rank, r->world, r->node, "node")); /* the host name */
    diag_config cfg = *c0, *c = &cfg;
    char hist[4200];
    MS_TRY(node_history(c, r->node, hist, sizeof hist));
    MS_TRY(diag_check_gemm(c, r, &r->checks[r->n++]));
    diag_check_memory(c, r, &r->checks[r->n++]);
    diag_check_comm(c, r, &r->checks[r->n++], &w);
    diag_check_storage(c, r, &r->checks[r->n++]);
    r->ok = 1;
    for (int i = 0; i < r->n; i++)
        r->ok &= r->checks[i].ok;
    ms_status st = c->emit ? c->emit(r, c->emit_arg) : MS_OK;
    diag_comm_close(w); /* a barrier: no rank exits before every report is out */
    return st;
}

/* "12.3 GFLOP/s" with a precision that suits the magnitude. */
static void fmt_value(char *buf, size_t n, double v, const char *unit) {
    if (v >= 100 || v == 0)
        snprintf(buf, n, "%.0f %s", v, unit);
    else if (v >= 1)
        snprintf(buf, n, "%.2f %s", v, unit);
    else
        snprintf(buf, n, "%.3g %s", v, unit);
}

static const char *verdict(const diag_result *c) {
    return c->skipped ? "SKIP" : c->ok ? "PASS" : "FAIL";
}

void diag_report_print(const diag_report *r, FILE *f) {
    fprintf(f, "diag on %s, node %s (rank %d of %d), device %s\n", r->host, r->node, r->rank,
            r->world, r->device);
    fprintf(f, "%-8s  %-18s  %-22s  %s\n", "check", "value", "limit", "verdict");
    for (int i = 0; i < r->n; i++) {
        const diag_result *c = &r->checks[i];
        char val[48] = "-", lim[48] = "-", l[40];
        if (!c->skipped) fmt_value(val, sizeof val, c->value, c->unit);
        if (c->has_limit) {
            fmt_value(l, sizeof l, c->limit, c->unit);
            snprintf(lim, sizeof lim, "%s %s", c->limit_is_max ? "<=" : ">=", l);
        }
        fprintf(f, "%-8s  %-18s  %-22s  %s\n", c->name, val, lim, verdict(c));
    }
    for (int i = 0; i < r->n; i++)
        fprintf(f, "  %s: %s\n", r->checks[i].name, r->checks[i].detail);
    char failed[128] = "";
    size_t len = 0;
    for (int i = 0; i < r->n; i++)
        if (!r->checks[i].ok)
            len += (size_t)snprintf(failed + len, sizeof failed - len, "%s%s", len ? ", " : "",
                                    r->checks[i].name);
    if (r->ok)
        fprintf(f, "diag: PASS\n");
    else
        fprintf(f, "diag: FAIL (%s)\n", failed);
}

static cJSON *check_json(const diag_result *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddBoolToObject(o, "ok", c->ok);
    cJSON_AddBoolToObject(o, "slow", !c->ok && c->slow);
    cJSON_AddBoolToObject(o, "skipped", c->skipped);
    if (c->skipped)
        cJSON_AddNullToObject(o, "value");
    else
        cJSON_AddNumberToObject(o, "value", c->value);
    cJSON_AddStringToObject(o, "unit", c->unit);
    if (c->has_limit)
        cJSON_AddNumberToObject(o, "limit", c->limit);
    else
        cJSON_AddNullToObject(o, "limit");
    cJSON_AddStringToObject(o, "limit_kind", c->limit_is_max ? "max" : "min");
    for (int i = 0; i < DIAG_MAX_AUX; i++)
        if (c->aux_name[i] && !c->skipped) cJSON_AddNumberToObject(o, c->aux_name[i], c->aux[i]);
    cJSON_AddStringToObject(o, "detail", c->detail);
    return o;
}

char *diag_report_json(const diag_report *r) {
    cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateArray();
    char *text = NULL;
    if (!o || !a) goto out;
    cJSON_AddStringToObject(o, "host", r->host);
    cJSON_AddStringToObject(o, "node", r->node);
    cJSON_AddNumberToObject(o, "rank", r->rank);
    cJSON_AddNumberToObject(o, "world", r->world);
    cJSON_AddStringToObject(o, "device", r->device);
    for (int i = 0; i < r->n; i++) {
        cJSON *c = check_json(&r->checks[i]);
        if (!c) goto out;
        cJSON_AddItemToArray(a, c);
    }
    cJSON_AddItemToObject(o, "checks", a);
    a = NULL;
    cJSON_AddBoolToObject(o, "ok", r->ok);
    text = cJSON_PrintUnformatted(o);
    if (text) ms_utf8_fix(text); /* a path's bytes (--storage-dir, --history) as they were */
out:
    cJSON_Delete(a);
    cJSON_Delete(o);
    return text;
}
