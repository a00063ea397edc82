/* sup_beat.c - the heartbeat message parser (sup_beat_parse).
 *
 * A beat is one line of at most MON_HB_LINE_MAX bytes holding a JSON
 * object (docs/formats.md, "Heartbeats").  Nothing in a message is ever
 * executed or used as a path: the driver only stores numbers and copies
 * the host and error strings (bounded) into its events.  Strict: version
 * 1, the job's token (compared in constant time), every required field
 * with its JSON type and range, no unknown field, no NUL byte (raw, or
 * escaped as \u0000 in a string: cJSON's string would end there).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/jsonstr.h"
#include "base/node.h"
#include "supervisor/sup.h"

static const char *const known[] = {
    "v",          "token",       "rank",           "world",       "pid",         "host",
    "node",       "seq",         "step",           "phase",       "step_ms",     "loss",
    "grad_norm",  "comm_bytes",  "compute_ms",     "redone",      "ckpt_commit", "ckpt_failed",
    "ckpt_error", "error",       "stage",          "comm_wait_s", "usage",       "dumps",
    "nan_step",   "nan_ranks",   "stop_here",      "skipped",     "skip_step",   "start",
    "attempt",    "ckpt_warned", "ckpt_warn_step", "ckpt_warning"};

static int is_known(const char *k) {
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(k, known[i])) return 1;
    return 0;
}

/* An integer field in [lo, hi]; 0 on success. */
static int get_int(const cJSON *o, const char *k, double lo, double hi, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) ||
        x->valuedouble != floor(x->valuedouble) || x->valuedouble < lo || x->valuedouble > hi)
        return -1;
    *v = x->valuedouble;
    return 0;
}

/* An optional number (null or absent: NaN). */
static int get_opt_num(const cJSON *o, const char *k, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    *v = NAN;
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) return -1;
    *v = x->valuedouble;
    return 0;
}

/* A string field of at most n-1 printable bytes. */
static int get_str(const cJSON *o, const char *k, char *dst, size_t n, int required) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    dst[0] = 0;
    if (!x) return required ? -1 : 0;
    if (!cJSON_IsString(x) || strlen(x->valuestring) >= n) return -1;
    for (const unsigned char *p = (const unsigned char *)x->valuestring; *p; p++)
        if (*p < 0x20 && *p != '\t') return -1;
    snprintf(dst, n, "%s", x->valuestring);
    return 0;
}

int sup_token_eq(const char *got, const char *token) {
    size_t a = strlen(got), b = strlen(token);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < b; i++) /* constant time in the token's length */
        diff |= (unsigned)(unsigned char)(i < a ? got[i] : 0) ^ (unsigned char)token[i];
    return diff == 0;
}

static int token_ok(const cJSON *o, const char *token) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "token");
    return cJSON_IsString(x) && sup_token_eq(x->valuestring, token);
}

/* A node name: empty (not sent) or [A-Za-z0-9._-]{1,63} (base/node.h). */
static int node_ok(const char *n) {
    return !*n || ms_node_name_ok(n);
}

static int phase_ok(const char *p) {
    static const char *const ph[] = {"start", "train", "val", "ckpt", "done", "stopped", "error"};
    for (size_t i = 0; i < sizeof ph / sizeof ph[0]; i++)
        if (!strcmp(p, ph[i])) return 1;
    return 0;
}

static int fill(const cJSON *o, int world, sup_beat *b, const char **why) {
    double v = 0, v2 = 0;
    *why = "bad or missing field";
    if (get_int(o, "v", 1, 1, &v)) return *why = "not version 1", -1;
    if (get_int(o, "rank", 0, world - 1, &v)) return *why = "rank out of range", -1;
    b->rank = (int)v;
    if (get_int(o, "world", world, world, &v)) return *why = "another world size", -1;
    b->world = (int)v;
    if (get_int(o, "pid", 1, 4194304, &v)) return -1;
    b->pid = (int)v;
    if (get_int(o, "seq", 1, 9007199254740991.0, &v)) return -1;
    b->seq = (unsigned long long)v;
    if (get_int(o, "step", 0, 2147483647, &v)) return -1;
    b->step = (int)v;
    if (get_str(o, "host", b->host, sizeof b->host, 1)) return -1;
    if (get_str(o, "phase", b->phase, sizeof b->phase, 1) || !phase_ok(b->phase))
        return *why = "unknown phase", -1;
    if (get_opt_num(o, "step_ms", &b->step_ms) || get_opt_num(o, "loss", &b->loss) ||
        get_opt_num(o, "grad_norm", &b->grad_norm) || get_opt_num(o, "comm_bytes", &b->comm_bytes))
        return -1;
    if (get_str(o, "error", b->error, sizeof b->error, 0)) return -1;
    if (get_str(o, "node", b->node, sizeof b->node, 0) || !node_ok(b->node))
        return *why = "bad node name", -1;
    if (get_opt_num(o, "compute_ms", &b->compute_ms)) return -1;
    if (get_opt_num(o, "comm_wait_s", &b->comm_wait_s) || b->comm_wait_s < 0)
        return *why = "comm_wait_s out of range", -1;
    b->stage = -1;
    if (cJSON_GetObjectItemCaseSensitive(o, "stage")) {
        if (get_int(o, "stage", 0, world - 1, &v)) return *why = "stage out of range", -1;
        b->stage = (int)v;
    }
    b->attempt = 0;
    if (cJSON_GetObjectItemCaseSensitive(o, "attempt")) {
        if (get_int(o, "attempt", 1, 2147483647, &v)) return *why = "attempt out of range", -1;
        b->attempt = (int)v;
    }
    b->start = -1;
    if (cJSON_GetObjectItemCaseSensitive(o, "start")) {
        if (get_int(o, "start", 0, b->step, &v)) return *why = "start out of range", -1;
        b->start = (int)v;
    }
    b->dumps = -1;
    if (cJSON_GetObjectItemCaseSensitive(o, "dumps")) {
        if (get_int(o, "dumps", 0, 2147483647, &v)) return *why = "dumps out of range", -1;
        b->dumps = (int)v;
    }
    b->redone = 0;
    if (cJSON_GetObjectItemCaseSensitive(o, "redone")) {
        if (get_int(o, "redone", 0, 2147483647, &v)) return -1;
        b->redone = (int)v;
    }
    b->skipped = b->skip_step = 0;
    int has_sk = cJSON_GetObjectItemCaseSensitive(o, "skipped") != NULL,
        has_ss = cJSON_GetObjectItemCaseSensitive(o, "skip_step") != NULL;
    if (has_sk != has_ss) return *why = "skipped and skip_step go together", -1;
    if (has_sk) {
        if (get_int(o, "skipped", 1, 2147483647, &v)) return *why = "skipped out of range", -1;
        b->skipped = (int)v;
        if (get_int(o, "skip_step", 1, 2147483647, &v)) return *why = "skip_step out of range", -1;
        b->skip_step = (int)v;
    }
    b->nan_step = b->n_nan_ranks = 0;
    const cJSON *nr = cJSON_GetObjectItemCaseSensitive(o, "nan_ranks");
    if (cJSON_GetObjectItemCaseSensitive(o, "nan_step") || nr) {
        if (get_int(o, "nan_step", 1, 2147483647, &v) || !cJSON_IsArray(nr))
            return *why = "nan_step and nan_ranks go together", -1;
        b->nan_step = (int)v;
        const cJSON *x;
        cJSON_ArrayForEach(x, nr) {
            int n = b->n_nan_ranks;
            if (n == (int)(sizeof b->nan_ranks / sizeof b->nan_ranks[0]) || !cJSON_IsNumber(x) ||
                x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
                x->valuedouble > world - 1)
                return *why = "nan_ranks: at most 8 ranks of the world", -1;
            b->nan_ranks[b->n_nan_ranks++] = (int)x->valuedouble;
        }
    }
    b->ckpt_commit = -1, b->ckpt_failed = 0;
    if (cJSON_GetObjectItemCaseSensitive(o, "ckpt_commit")) {
        if (get_int(o, "ckpt_commit", 0, 2147483647, &v)) return -1;
        b->ckpt_commit = (int)v;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, "ckpt_failed")) {
        if (get_int(o, "ckpt_failed", 0, 2147483647, &v)) return -1;
        b->ckpt_failed = (int)v;
    }
    if (get_str(o, "ckpt_error", b->ckpt_error, sizeof b->ckpt_error, 0)) return -1;
    b->ckpt_warned = b->ckpt_warn_step = 0;
    if (cJSON_GetObjectItemCaseSensitive(o, "ckpt_warned")) {
        if (get_int(o, "ckpt_warned", 1, 2147483647, &v) ||
            get_int(o, "ckpt_warn_step", 0, 2147483647, &v2) ||
            get_str(o, "ckpt_warning", b->ckpt_warning, sizeof b->ckpt_warning, 1))
            return *why = "ckpt_warned, ckpt_warn_step and ckpt_warning go together", -1;
        b->ckpt_warned = (int)v, b->ckpt_warn_step = (int)v2;
    } else if (cJSON_GetObjectItemCaseSensitive(o, "ckpt_warn_step") ||
               cJSON_GetObjectItemCaseSensitive(o, "ckpt_warning")) {
        return *why = "ckpt_warned, ckpt_warn_step and ckpt_warning go together", -1;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (u && (!cJSON_IsBool(u) || strcmp(b->phase, "error")))
        return *why = "usage is true or false, with phase error", -1;
    b->usage = cJSON_IsTrue(u);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "stop_here");
    if (sh && (!cJSON_IsBool(sh) || strcmp(b->phase, "stopped")))
        return *why = "stop_here is true or false, with phase stopped", -1;
    b->stop_here = cJSON_IsTrue(sh);
    return 0;
}

int sup_beat_parse(const char *line, size_t len, const char *token, int world, sup_beat *out,
                   const char **why) {
    memset(out, 0, sizeof *out);
    if (len == 0 || ms_json_has_nul(line, len))
        return *why = "empty line or a NUL byte (raw or \\u0000)", -1;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return *why = "not a JSON object", -1;
    }
    while (end && end < line + len && (*end == ' ' || *end == '\r' || *end == '\t'))
        end++;
    int rc = end == line + len ? 0 : -1;
    if (rc) *why = "text after the object";
    for (const cJSON *it = o->child; rc == 0 && it; it = it->next) {
        if (!it->string || !is_known(it->string)) rc = -1, *why = "unknown field";
        for (const cJSON *j = o->child; rc == 0 && j != it; j = j->next)
            if (!strcmp(j->string, it->string)) rc = -1, *why = "duplicate field";
    }
    if (rc == 0 && !token_ok(o, token)) rc = -1, *why = "wrong token";
    if (rc == 0) rc = fill(o, world, out, why);
    cJSON_Delete(o);
    return rc;
}

const char *sup_beat_admit(const sup_beat *b, int conn_rank, unsigned long long conn_seq,
                           int rank_connected, int attempt) {
    if (b->attempt > 0 && attempt > 0 && b->attempt != attempt)
        return "a rank of another attempt of the job (an earlier start's, left behind)";
    if (conn_rank >= 0 && b->rank != conn_rank) return "another rank on the connection";
    if (b->seq <= conn_seq) return "out of order";
    if (conn_rank < 0 && rank_connected) return "a second connection for the rank";
    return NULL;
}
