/* plan_cluster.c - cluster files: read, validate, write (docs/formats.md,
 * "Cluster files").  One JSON object, "format": "megascale-cluster",
 * "version": 1; every key below is required except "source", "cores",
 * "threads", "opt_ns_per_param", "transc_gbps", "ln_bwd_passes" and "overlap_exposed"
 * (absent: 0);
 * an unknown key is an error (a misspelt key would
 * otherwise silently keep a default). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/fileio.h"
#include "plan/plan.h"

#define CLUSTER_FORMAT "megascale-cluster"
#define CLUSTER_VERSION 1
#define CLUSTER_MAX_BYTES (1 << 20)

/* A number key of the top level or of a link: where it goes and its range
 * (lo < x <= hi, or lo <= x when lo_incl). */
typedef struct {
    const char *key;
    size_t off;
    double lo, hi;
    int lo_incl, optional;
} num_key;

#define F(k, field, lo, hi, incl, opt)                                                             \
    { k, offsetof(plan_cluster, field), lo, hi, incl, opt }
static const num_key top_keys[] = {
    F("peak_tflops", peak_flops, 1e-6, 1e6, 1, 0), /* (1e-30 planned a step of 1.4e30 s) */
    F("mem_gb", mem_gb, 0, 1e6, 0, 0),
    F("reserved_gb", reserved_gb, 0, 1e6, 1, 0),
    F("hbm_gbps", hbm_gbps, 0, 1e6, 0, 0),
    F("hbm_eff", hbm_eff, 0, 1, 0, 0),
    F("attn_eff", attn_eff, 0, 1, 0, 0),
    F("opt_ns_per_param", opt_ns_per_param, 0, 1e6, 1, 1),
    F("transc_gbps", transc_gbps, 0, 1e6, 1, 1),
    F("ln_bwd_passes", ln_bwd_passes, 0, 1e3, 1, 1),
    F("launch_us", launch_us, 0, 1e6, 1, 0),
    F("act_bytes", act_bytes, 0, 8, 0, 0),
    F("grad_bytes", grad_bytes, 0, 8, 0, 0),
    F("cores", cores, 0, 1e6, 1, 1),
    F("threads", threads, 0, 1e6, 1, 1),
    F("data_ms", data_ms, 0, 1e6, 1, 0),
    F("step_ms", step_ms, 0, 1e6, 1, 0),
    F("pcie_gbps", pcie_gbps, 0, 1e6, 0, 0),
    F("storage_gbps", storage_gbps, 0, 1e6, 0, 0),
    F("store_op_us", store_op_us, 0, 1e9, 0, 0),
    F("comm_init_ms", comm_init_ms, 0, 1e9, 1, 0),
    F("overlap_exposed", overlap_exposed, 0, 1, 1, 1),
};
#undef F
#define N_TOP ((int)(sizeof top_keys / sizeof top_keys[0]))
static const char *other_keys[] = {"format",        "version", "name", "source",
                                   "gpus_per_node", "gemm",    "links"};

static double *num_at(plan_cluster *c, size_t off) {
    return (double *)((char *)c + off);
}

static ms_status bad(const char *what, const char *fmt, const char *key) {
    return ms_error(MS_ERR_FORMAT, "%s: %s %s", what, key, fmt);
}

static ms_status check_num(const char *what, const char *key, double x, double lo, double hi,
                           int incl) {
    if (!isfinite(x) || (incl ? x < lo : x <= lo) || x > hi)
        return ms_error(MS_ERR_FORMAT, "%s: \"%s\" is %g, outside %s%g, %g]", what, key, x,
                        incl ? "[" : "(", lo, hi);
    return MS_OK;
}

static ms_status check_link(const char *what, const char *name, const plan_link *l) {
    char k[64];
    snprintf(k, sizeof k, "links.%s.gbps", name);
    MS_TRY(check_num(what, k, l->gbps, 0, 1e6, 0));
    snprintf(k, sizeof k, "links.%s.lat_us", name);
    MS_TRY(check_num(what, k, l->lat_us, 0, 1e9, 1));
    snprintf(k, sizeof k, "links.%s.eff", name);
    return check_num(what, k, l->eff, 0, 1, 0);
}

ms_status plan_cluster_check(const plan_cluster *c, const char *what) {
    if (c->gpus_per_node < 1 || c->gpus_per_node > 1 << 20)
        return ms_error(MS_ERR_FORMAT, "%s: \"gpus_per_node\" is %d, outside [1, 2^20]", what,
                        c->gpus_per_node);
    plan_cluster tmp = *c;
    tmp.peak_flops /= 1e12; /* the file's unit */
    for (int i = 0; i < N_TOP; i++)
        MS_TRY(check_num(what, top_keys[i].key, *num_at(&tmp, top_keys[i].off), top_keys[i].lo,
                         top_keys[i].hi, top_keys[i].lo_incl));
    /* the runtime's share must leave room for the model; the trainer keeps activations and
     * the 16-bit weight copy in bf16 or fp32, nothing else */
    if (c->reserved_gb >= c->mem_gb)
        return ms_error(MS_ERR_FORMAT,
                        "%s: \"reserved_gb\" is %g, not below \"mem_gb\" %g (it is the part of "
                        "a GPU's memory the runtime takes)",
                        what, c->reserved_gb, c->mem_gb);
    if (c->act_bytes != 2 && c->act_bytes != 4)
        return ms_error(MS_ERR_FORMAT, "%s: \"act_bytes\" is %g, must be 2 (bf16) or 4 (fp32)",
                        what, c->act_bytes);
    if (c->grad_bytes != 2 && c->grad_bytes != 4) /* (3 was taken) */
        return ms_error(MS_ERR_FORMAT, "%s: \"grad_bytes\" is %g, must be 2 (bf16) or 4 (fp32)",
                        what, c->grad_bytes);
    if (c->n_gemm < 1 || c->n_gemm > PLAN_GEMM_POINTS)
        return ms_error(MS_ERR_FORMAT, "%s: \"gemm\" needs 1 to %d [n, efficiency] points (has %d)",
                        what, PLAN_GEMM_POINTS, c->n_gemm);
    for (int i = 0; i < c->n_gemm; i++) {
        if (!(c->gemm_n[i] >= 1) || !(c->gemm_eff[i] > 0) || !(c->gemm_eff[i] <= 1))
            return ms_error(MS_ERR_FORMAT,
                            "%s: \"gemm\" point %d is [%g, %g]: n must be >= 1 and the efficiency "
                            "in (0, 1]",
                            what, i, c->gemm_n[i], c->gemm_eff[i]);
        if (i && !(c->gemm_n[i] > c->gemm_n[i - 1]))
            return ms_error(MS_ERR_FORMAT,
                            "%s: \"gemm\" points must have increasing n (%g after %g)", what,
                            c->gemm_n[i], c->gemm_n[i - 1]);
    }
    MS_TRY(check_link(what, "intra", &c->intra));
    return check_link(what, "inter", &c->inter);
}

static ms_status read_link(const char *what, const cJSON *links, const char *name, plan_link *l) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(links, name);
    if (!cJSON_IsObject(o)) return ms_error(MS_ERR_FORMAT, "%s: missing \"links.%s\"", what, name);
    const char *keys[3] = {"gbps", "lat_us", "eff"};
    double *dst[3] = {&l->gbps, &l->lat_us, &l->eff};
    for (const cJSON *it = o->child; it; it = it->next) {
        int k = 0;
        while (k < 3 && strcmp(it->string, keys[k]))
            k++;
        if (k == 3)
            return ms_error(MS_ERR_FORMAT,
                            "%s: unknown key \"links.%s.%s\" (known: gbps, lat_us, "
                            "eff)",
                            what, name, it->string);
    }
    for (int k = 0; k < 3; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[k]);
        if (!cJSON_IsNumber(v))
            return ms_error(MS_ERR_FORMAT, "%s: \"links.%s.%s\" missing or not a number", what,
                            name, keys[k]);
        *dst[k] = v->valuedouble;
    }
    return MS_OK;
}

static ms_status read_gemm(const char *what, const cJSON *g, plan_cluster *c) {
    if (!cJSON_IsArray(g))
        return bad(what, "missing or not an array of [n, efficiency]", "\"gemm\"");
    c->n_gemm = 0;
    for (const cJSON *p = g->child; p; p = p->next) {
        if (c->n_gemm == PLAN_GEMM_POINTS)
            return ms_error(MS_ERR_FORMAT, "%s: \"gemm\" has more than %d points", what,
                            PLAN_GEMM_POINTS);
        if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) != 2 ||
            !cJSON_IsNumber(cJSON_GetArrayItem(p, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(p, 1)))
            return ms_error(MS_ERR_FORMAT, "%s: \"gemm\" point %d is not [n, efficiency]", what,
                            c->n_gemm);
        c->gemm_n[c->n_gemm] = cJSON_GetArrayItem(p, 0)->valuedouble;
        c->gemm_eff[c->n_gemm++] = cJSON_GetArrayItem(p, 1)->valuedouble;
    }
    return MS_OK;
}

static ms_status known_key(const char *what, const char *k) {
    for (int i = 0; i < N_TOP; i++)
        if (!strcmp(k, top_keys[i].key)) return MS_OK;
    for (size_t i = 0; i < sizeof other_keys / sizeof other_keys[0]; i++)
        if (!strcmp(k, other_keys[i])) return MS_OK;
    return ms_error(MS_ERR_FORMAT, "%s: unknown key \"%s\" (docs/formats.md, Cluster files)", what,
                    k);
}

static ms_status parse(const char *what, const cJSON *o, plan_cluster *c) {
    if (!cJSON_IsObject(o)) return ms_error(MS_ERR_FORMAT, "%s: not a JSON object", what);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CLUSTER_FORMAT))
        return ms_error(MS_ERR_FORMAT, "%s: \"format\" must be \"%s\"", what, CLUSTER_FORMAT);
    if (!cJSON_IsNumber(ver) || ver->valuedouble != CLUSTER_VERSION)
        return ms_error(MS_ERR_FORMAT, "%s: \"version\" must be %d (this program reads version %d)",
                        what, CLUSTER_VERSION, CLUSTER_VERSION);
    for (const cJSON *it = o->child; it; it = it->next)
        MS_TRY(known_key(what, it->string));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name) || !*name->valuestring || strlen(name->valuestring) >= PLAN_NAME_MAX)
        return ms_error(MS_ERR_FORMAT, "%s: \"name\" missing or not a string of 1..%d characters",
                        what, PLAN_NAME_MAX - 1);
    snprintf(c->name, sizeof c->name, "%s", name->valuestring);
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "source");
    if (cJSON_IsString(src)) snprintf(c->source, sizeof c->source, "%s", src->valuestring);
    const cJSON *gpn = cJSON_GetObjectItemCaseSensitive(o, "gpus_per_node");
    /* the value's range before the cast (an out-of-range double to int is undefined) */
    if (!cJSON_IsNumber(gpn) || gpn->valuedouble != floor(gpn->valuedouble))
        return bad(what, "missing or not an integer", "\"gpus_per_node\"");
    if (fabs(gpn->valuedouble) > (1 << 30)) /* as the range check below says it */
        return ms_error(MS_ERR_FORMAT, "%s: \"gpus_per_node\" is %g, outside [1, 2^20]", what,
                        gpn->valuedouble);
    c->gpus_per_node = (int)gpn->valuedouble;
    for (int i = 0; i < N_TOP; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, top_keys[i].key);
        if (!v && top_keys[i].optional) continue;
        if (!cJSON_IsNumber(v))
            return ms_error(MS_ERR_FORMAT, "%s: \"%s\" missing or not a number", what,
                            top_keys[i].key);
        *num_at(c, top_keys[i].off) = v->valuedouble;
    }
    c->peak_flops *= 1e12;
    MS_TRY(read_gemm(what, cJSON_GetObjectItemCaseSensitive(o, "gemm"), c));
    const cJSON *links = cJSON_GetObjectItemCaseSensitive(o, "links");
    if (!cJSON_IsObject(links)) return bad(what, "missing (intra, inter)", "\"links\"");
    for (const cJSON *it = links->child; it; it = it->next)
        if (strcmp(it->string, "intra") && strcmp(it->string, "inter"))
            return ms_error(MS_ERR_FORMAT, "%s: unknown link class \"links.%s\" (intra, inter)",
                            what, it->string);
    MS_TRY(read_link(what, links, "intra", &c->intra));
    MS_TRY(read_link(what, links, "inter", &c->inter));
    return plan_cluster_check(c, what);
}

/* Line and column (from 1) of text + off. */
static void line_col(const char *text, size_t off, int *line, int *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < off; i++)
        if (text[i] == '\n')
            ++*line, *col = 1;
        else
            ++*col;
}

/* The first key that an object in o (at any depth) holds twice; NULL if none. */
static const char *repeated_key(const cJSON *o) {
    for (const cJSON *it = o ? o->child : NULL; it; it = it->next) {
        if (cJSON_IsObject(o) && it->string)
            for (const cJSON *j = o->child; j != it; j = j->next)
                if (j->string && !strcmp(j->string, it->string)) return it->string;
        const char *r = repeated_key(it);
        if (r) return r;
    }
    return NULL;
}

/* text as one JSON value with nothing but white space after it and no key
 * twice in an object (cJSON takes the first of two and ignores the text
 * after a value: a key added at the end of a file to change it was
 * ignored), a syntax error named by its line and column. */
static ms_status parse_text(const char *path, const char *text, size_t len, cJSON **out) {
    const char *end = NULL;
    *out = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int line, col;
    if (!o) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : len;
        line_col(text, off, &line, &col);
        return ms_error(MS_ERR_FORMAT,
                        "%s:%d:%d: not valid JSON here (a cluster file, docs/formats.md)", path,
                        line, col);
    }
    while (end && end < text + len && strchr(" \t\r\n", *end) && *end)
        end++;
    if (end && end < text + len) {
        line_col(text, (size_t)(end - text), &line, &col);
        cJSON_Delete(o);
        return ms_error(MS_ERR_FORMAT,
                        "%s:%d:%d: text after the JSON object (a cluster file is one object)", path,
                        line, col);
    }
    const char *dup = repeated_key(o);
    if (dup) {
        ms_status st = ms_error(MS_ERR_FORMAT,
                                "%s: the key \"%s\" is given twice in one object (which one is "
                                "meant?)",
                                path, dup);
        cJSON_Delete(o);
        return st;
    }
    *out = o;
    return MS_OK;
}

ms_status plan_cluster_load(const char *path, plan_cluster *c) {
    memset(c, 0, sizeof *c);
    char *text = NULL;
    size_t len = 0;
    ms_status st = ms_file_read_max(path, CLUSTER_MAX_BYTES, &text, &len);
    if (st != MS_OK) return ms_error_wrap(st, "cluster file");
    cJSON *o = NULL;
    st = parse_text(path, text, len, &o);
    free(text);
    if (st != MS_OK) return st;
    st = parse(path, o, c);
    cJSON_Delete(o);
    return st;
}

ms_status plan_cluster_find(const char *name_or_file, const char *dir, plan_cluster *c) {
    if (!name_or_file || !*name_or_file)
        return ms_error(MS_ERR_ARG, "--cluster: give a cluster file or a shipped name");
    struct stat sb; /* a file in the working directory, "mycluster", is that file */
    int found = stat(name_or_file, &sb) == 0;
    if (found && S_ISDIR(sb.st_mode))
        return ms_error(MS_ERR_ARG,
                        "--cluster %s is a directory, not a cluster file (JSON, docs/formats.md) "
                        "or a shipped name (%s/*.json)",
                        name_or_file, dir);
    if (strchr(name_or_file, '/') || strstr(name_or_file, ".json") || found)
        return plan_cluster_load(name_or_file, c);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.json", dir, name_or_file);
    uint64_t size;
    if (ms_file_size(path, &size) != MS_OK)
        return ms_error(MS_ERR_NOTFOUND,
                        "--cluster %s: no such file, and no shipped cluster %s (see %s/*.json)",
                        name_or_file, path, dir);
    return plan_cluster_load(path, c);
}

static void add_link(cJSON *links, const char *name, const plan_link *l) {
    cJSON *o = cJSON_AddObjectToObject(links, name);
    cJSON_AddNumberToObject(o, "gbps", l->gbps);
    cJSON_AddNumberToObject(o, "lat_us", l->lat_us);
    cJSON_AddNumberToObject(o, "eff", l->eff);
}

ms_status plan_cluster_save(const plan_cluster *c, const char *path) {
    MS_TRY(plan_cluster_check(c, path));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", CLUSTER_FORMAT);
    cJSON_AddNumberToObject(o, "version", CLUSTER_VERSION);
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "source", c->source);
    cJSON_AddNumberToObject(o, "gpus_per_node", c->gpus_per_node);
    plan_cluster tmp = *c;
    tmp.peak_flops /= 1e12;
    for (int i = 0; i < N_TOP; i++)
        cJSON_AddNumberToObject(o, top_keys[i].key, *num_at(&tmp, top_keys[i].off));
    cJSON *g = cJSON_AddArrayToObject(o, "gemm");
    for (int i = 0; i < c->n_gemm; i++) {
        double pt[2] = {c->gemm_n[i], c->gemm_eff[i]};
        cJSON_AddItemToArray(g, cJSON_CreateDoubleArray(pt, 2));
    }
    cJSON *links = cJSON_AddObjectToObject(o, "links");
    add_link(links, "intra", &c->intra);
    add_link(links, "inter", &c->inter);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return ms_error(MS_ERR_NOMEM, "%s: formatting the cluster file", path);
    size_t n = strlen(text);
    text[n] = '\n'; /* cJSON_Print's buffer ends with the terminator: overwrite, write n + 1 */
    ms_status st = ms_file_write_atomic(path, text, n + 1);
    free(text);
    return st;
}
