/* ckpt_manifest.c - the JSON of checkpoints: manifest.json (built by rank 0
 * from every rank's part, parsed and cross-checked by the loader), the
 * model and trainer-state objects shared with the /dev/shm snapshots. */
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/crc32c.h"
#include "base/fileio.h"
#include "ckpt/ckpt_internal.h"

/* ---- small JSON helpers ---------------------------------------------------- */

static int add_num(cJSON *o, const char *k, double v) {
    return cJSON_AddNumberToObject(o, k, v) != NULL;
}

static cJSON *int_array(const int64_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *x = cJSON_CreateNumber((double)v[i]);
        if (!x || !cJSON_AddItemToArray(a, x)) {
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* An integral number in [lo, hi] at o[key]. */
static ms_status get_i64(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *v,
                         const char *where) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = 0;
    if (!cJSON_IsNumber(x))
        return ms_error(MS_ERR_FORMAT, "%s: field '%s' is missing or not a number", where, key);
    double d = x->valuedouble;
    if (d != floor(d) || d < (double)lo || d > (double)hi)
        return ms_error(MS_ERR_FORMAT,
                        "%s: field '%s' = %.17g is out of range [%" PRId64 ", %" PRId64 "]", where,
                        key, d, lo, hi);
    *v = (int64_t)d;
    return MS_OK;
}

static ms_status get_int(const cJSON *o, const char *key, int lo, int hi, int *v,
                         const char *where) {
    int64_t x = 0;
    *v = 0;
    MS_TRY(get_i64(o, key, lo, hi, &x, where));
    *v = (int)x;
    return MS_OK;
}

static ms_status get_u64(const cJSON *o, const char *key, uint64_t *v, const char *where) {
    int64_t x = 0;
    *v = 0;
    MS_TRY(get_i64(o, key, 0, (int64_t)1 << 53, &x, where));
    *v = (uint64_t)x;
    return MS_OK;
}

static ms_status get_double(const cJSON *o, const char *key, double *v, const char *where) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = 0;
    if (!cJSON_IsNumber(x))
        return ms_error(MS_ERR_FORMAT, "%s: field '%s' is missing or not a number", where, key);
    *v = x->valuedouble;
    return MS_OK;
}

static ms_status get_str(const cJSON *o, const char *key, const char **v, const char *where) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = "";
    if (!cJSON_IsString(x))
        return ms_error(MS_ERR_FORMAT, "%s: field '%s' is missing or not a string", where, key);
    *v = x->valuestring;
    return MS_OK;
}

static ms_status get_obj(const cJSON *o, const char *key, const cJSON **v, const char *where) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = NULL;
    if (!cJSON_IsObject(x))
        return ms_error(MS_ERR_FORMAT, "%s: field '%s' is missing or not an object", where, key);
    *v = x;
    return MS_OK;
}

/* ---- model and trainer state ----------------------------------------------- */

cJSON *ckpt_json_model(const gpt_config *c) {
    cJSON *o = cJSON_CreateObject();
    int ok = o && add_num(o, "n_layer", c->n_layer) && add_num(o, "n_head", c->n_head) &&
             add_num(o, "n_embd", c->n_embd) && add_num(o, "vocab_size", c->vocab) &&
             add_num(o, "n_positions", c->seq_max) &&
             cJSON_AddStringToObject(o, "block", gpt_block_name(c->block)) &&
             add_num(o, "attn_window", c->attn_window);
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

ms_status ckpt_json_model_parse(const cJSON *j, gpt_config *c, const char *where) {
    const char *blk;
    memset(c, 0, sizeof *c);
    MS_TRY(get_int(j, "n_layer", 1, 100000, &c->n_layer, where));
    MS_TRY(get_int(j, "n_head", 1, 100000, &c->n_head, where));
    MS_TRY(get_int(j, "n_embd", 1, 1 << 20, &c->n_embd, where));
    MS_TRY(get_int(j, "vocab_size", 1, 1 << 30, &c->vocab, where));
    MS_TRY(get_int(j, "n_positions", 1, 1 << 30, &c->seq_max, where));
    MS_TRY(get_int(j, "attn_window", 0, 1 << 30, &c->attn_window, where));
    MS_TRY(get_str(j, "block", &blk, where));
    ms_status st = gpt_block_parse(blk, &c->block);
    if (st == MS_OK) st = gpt_config_validate(c);
    if (st != MS_OK) return ms_error_wrap(MS_ERR_FORMAT, "%s: model", where);
    return MS_OK;
}

cJSON *ckpt_json_trainer(const ckpt_train_state *s) {
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, s->seed);
    cJSON *o = cJSON_CreateObject(), *rng, *cur, *lr;
    int ok = o && add_num(o, "step", s->step) && add_num(o, "opt_steps", s->opt_steps) &&
             cJSON_AddStringToObject(o, "seed", seed) && add_num(o, "batch", s->batch) &&
             add_num(o, "seq", s->seq) && add_num(o, "tokens", (double)s->tokens) &&
             (rng = cJSON_AddObjectToObject(o, "rng")) &&
             cJSON_AddStringToObject(rng, "kind", "philox-counter") &&
             cJSON_AddStringToObject(rng, "seed", seed) &&
             (cur = cJSON_AddObjectToObject(o, "data_cursor")) &&
             add_num(cur, "epoch", (double)s->cursor.epoch) &&
             add_num(cur, "shard", (double)s->cursor.shard) &&
             add_num(cur, "pos", (double)s->cursor.pos) &&
             (lr = cJSON_AddObjectToObject(o, "lr_schedule")) &&
             cJSON_AddStringToObject(lr, "kind",
                                     s->sched.kind == OPT_SCHED_COSINE ? "cosine" : "constant") &&
             add_num(lr, "lr", s->sched.lr) && add_num(lr, "warmup", s->sched.warmup) &&
             add_num(lr, "total", s->sched.total) && add_num(lr, "floor", s->sched.floor);
    cJSON *opt = ok && s->optimizer[0] ? cJSON_AddObjectToObject(o, "optimizer") : NULL;
    if (opt)
        ok = cJSON_AddStringToObject(opt, "name", s->optimizer) &&
             add_num(opt, "beta1", s->beta1) && add_num(opt, "beta2", s->beta2) &&
             add_num(opt, "eps", s->eps) && add_num(opt, "weight_decay", s->weight_decay) &&
             add_num(opt, "grad_clip", s->grad_clip);
    cJSON *data =
        ok && (s->train_data[0] || s->val_data[0]) ? cJSON_AddObjectToObject(o, "data") : NULL;
    if (data)
        ok = cJSON_AddStringToObject(data, "train", s->train_data) &&
             cJSON_AddStringToObject(data, "val", s->val_data) &&
             (!s->data_order[0] || cJSON_AddStringToObject(data, "order", s->data_order)) &&
             (!s->data_shards || (add_num(data, "shards", (double)s->data_shards) &&
                                  add_num(data, "tokens", (double)s->data_tokens))) &&
             (!s->val_batches || add_num(data, "val_batches", s->val_batches));
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

ms_status ckpt_json_trainer_parse(const cJSON *j, ckpt_train_state *s, const char *where) {
    const cJSON *cur, *lr;
    const char *seed, *kind;
    double d;
    memset(s, 0, sizeof *s);
    MS_TRY(get_int(j, "step", 0, INT32_MAX, &s->step, where));
    MS_TRY(get_int(j, "opt_steps", 0, INT32_MAX, &s->opt_steps, where));
    MS_TRY(get_int(j, "batch", 0, INT32_MAX, &s->batch, where));
    MS_TRY(get_int(j, "seq", 0, INT32_MAX, &s->seq, where));
    if (cJSON_GetObjectItemCaseSensitive(j, "tokens")) /* absent in older commits */
        MS_TRY(get_u64(j, "tokens", &s->tokens, where));
    MS_TRY(get_str(j, "seed", &seed, where));
    char *end = NULL;
    s->seed = strtoull(seed, &end, 10);
    if (!*seed || *end)
        return ms_error(MS_ERR_FORMAT, "%s: seed '%s' is not a number", where, seed);
    MS_TRY(get_obj(j, "data_cursor", &cur, where));
    MS_TRY(get_u64(cur, "epoch", &s->cursor.epoch, where));
    MS_TRY(get_u64(cur, "shard", &s->cursor.shard, where));
    MS_TRY(get_u64(cur, "pos", &s->cursor.pos, where));
    MS_TRY(get_obj(j, "lr_schedule", &lr, where));
    MS_TRY(get_str(lr, "kind", &kind, where));
    if (opt_sched_parse(kind, &s->sched.kind) != MS_OK) /* a damaged file, not a usage error */
        return ms_error_wrap(MS_ERR_FORMAT, "%s: lr_schedule", where);
    MS_TRY(get_double(lr, "lr", &d, where));
    s->sched.lr = (float)d;
    MS_TRY(get_double(lr, "floor", &d, where));
    s->sched.floor = (float)d;
    MS_TRY(get_int(lr, "warmup", 0, INT32_MAX, &s->sched.warmup, where));
    MS_TRY(get_int(lr, "total", 0, INT32_MAX, &s->sched.total, where));
    /* optional (commits before they were recorded have neither) */
    s->beta1 = s->beta2 = s->eps = s->weight_decay = s->grad_clip = NAN;
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
    if (opt) {
        const char *name;
        MS_TRY(get_str(opt, "name", &name, where));
        snprintf(s->optimizer, sizeof s->optimizer, "%s", name);
        MS_TRY(get_double(opt, "beta1", &s->beta1, where));
        MS_TRY(get_double(opt, "beta2", &s->beta2, where));
        MS_TRY(get_double(opt, "eps", &s->eps, where));
        MS_TRY(get_double(opt, "weight_decay", &s->weight_decay, where));
        MS_TRY(get_double(opt, "grad_clip", &s->grad_clip, where));
    }
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    if (data) {
        const char *tr, *va;
        MS_TRY(get_str(data, "train", &tr, where));
        MS_TRY(get_str(data, "val", &va, where));
        snprintf(s->train_data, sizeof s->train_data, "%s", tr);
        snprintf(s->val_data, sizeof s->val_data, "%s", va);
        if (cJSON_GetObjectItemCaseSensitive(data, "order")) { /* absent in older commits */
            const char *order;
            MS_TRY(get_str(data, "order", &order, where));
            snprintf(s->data_order, sizeof s->data_order, "%s", order);
        }
        if (cJSON_GetObjectItemCaseSensitive(data, "shards")) { /* the same */
            MS_TRY(get_u64(data, "shards", &s->data_shards, where));
            MS_TRY(get_u64(data, "tokens", &s->data_tokens, where));
        }
        if (cJSON_GetObjectItemCaseSensitive(data, "val_batches")) /* absent before 2026-12-06 */
            MS_TRY(get_int(data, "val_batches", 1, INT32_MAX, &s->val_batches, where));
    }
    return MS_OK;
}

/* ---- one rank's part ------------------------------------------------------- */

cJSON *ckpt_json_part(const char *file, int rank, uint64_t bytes, const ckpt_tensor_info *tensors,
                      const ckpt_run *runs, int n_runs, const uint32_t *crcs) {
    cJSON *o = cJSON_CreateObject(), *f, *sl;
    int ok = o && (f = cJSON_AddObjectToObject(o, "file")) &&
             cJSON_AddStringToObject(f, "name", file) && add_num(f, "rank", rank) &&
             add_num(f, "bytes", (double)bytes) && (sl = cJSON_AddArrayToObject(o, "slices"));
    for (int i = 0; ok && i < n_runs; i++) {
        const ckpt_run *r = &runs[i];
        const ckpt_tensor_info *t = &tensors[r->tensor];
        int64_t range[2] = {(int64_t)r->begin, (int64_t)r->end};
        for (int k = 0; ok && k < CKPT_NKINDS; k++) {
            char key[96];
            ckpt_run_key(key, sizeof key, t->name, k, r);
            cJSON *s = cJSON_CreateObject();
            if (!s || !cJSON_AddItemToArray(sl, s)) {
                cJSON_Delete(s);
                ok = 0;
                break;
            }
            ok = cJSON_AddStringToObject(s, "tensor", t->name) &&
                 cJSON_AddStringToObject(s, "state", ckpt_kind_name(k)) &&
                 cJSON_AddStringToObject(s, "file", file) &&
                 cJSON_AddStringToObject(s, "key", key) &&
                 cJSON_AddItemToObject(s, "offset", int_array(r->box_off, t->ndim)) &&
                 cJSON_AddItemToObject(s, "shape", int_array(r->box_shape, t->ndim)) &&
                 cJSON_AddItemToObject(s, "range", int_array(range, 2)) &&
                 add_num(s, "crc32c", crcs[3 * i + k]);
        }
    }
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

/* ---- the manifest ------------------------------------------------------------ */

/* The manifest's checksum (version 2 on): "manifest_crc32c" holds 8 hex
 * digits, the CRC32C of the file's bytes with those digits read as
 * "00000000".  Over the text, not the parsed values: an edit of any field
 * (a step, the data cursor) fails it, and any tool can recompute it. */
#define SUM_KEY "\"manifest_crc32c\""

/* The 8 digits of the checksum's value in text[0, len): NULL unless the
 * key occurs exactly once (as a key: a quote inside a JSON string is
 * escaped) with a string of 8 hex digits after it. */
static char *sum_digits(char *text, size_t len) {
    size_t kl = strlen(SUM_KEY);
    char *at = NULL;
    for (size_t i = 0; i + kl <= len; i++)
        if (!memcmp(text + i, SUM_KEY, kl)) {
            if (at) return NULL;
            at = text + i;
        }
    if (!at) return NULL;
    char *p = at + kl, *end = text + len;
    while (p < end && strchr(" \t\r\n", *p))
        p++;
    if (p >= end || *p++ != ':') return NULL;
    while (p < end && strchr(" \t\r\n", *p))
        p++;
    if (end - p < 10 || p[0] != '"' || p[9] != '"') return NULL;
    for (int i = 1; i <= 8; i++)
        if (!strchr("0123456789abcdefABCDEF", p[i])) return NULL;
    return p + 1;
}

/* CRC32C of text with the checksum's digits (at d) as zeros. */
static uint32_t sum_of(const char *text, size_t len, const char *d) {
    size_t at = (size_t)(d - text);
    uint32_t crc = ms_crc32c(0, text, at);
    crc = ms_crc32c(crc, "00000000", 8);
    return ms_crc32c(crc, text + at + 8, len - at - 8);
}

char *ckpt_manifest_seal(char *text) {
    char *d = text ? sum_digits(text, strlen(text)) : NULL;
    if (!d) return text;
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", sum_of(text, strlen(text), d));
    memcpy(d, hex, 8);
    return text;
}

/* A version-2 manifest's checksum against its text (MS_ERR_FORMAT naming
 * the file when it is missing or does not match). */
static ms_status check_sum(char *text, size_t len, const char *path) {
    char *d = sum_digits(text, len);
    if (!d)
        return ms_error(MS_ERR_FORMAT,
                        "%s: no valid 'manifest_crc32c' (8 hex digits, once), which a version-%d "
                        "manifest has (damaged or edited)",
                        path, CKPT_VERSION);
    char want[9];
    memcpy(want, d, 8);
    want[8] = 0;
    uint32_t got = sum_of(text, len, d);
    if (got != (uint32_t)strtoul(want, NULL, 16))
        return ms_error(MS_ERR_FORMAT,
                        "%s: its text has CRC32C %08x, but its manifest_crc32c says %s: the "
                        "manifest was edited or damaged after the commit (its fields, such as the "
                        "step, the optimizer steps or the data cursor, cannot be trusted)",
                        path, got, want);
    return MS_OK;
}

char *ckpt_manifest_text(const ckpt_commit_info *ci, cJSON *const *parts, int n_parts) {
    return ckpt_manifest_text_layout(ci, parts, n_parts, 1, 1, 1);
}

char *ckpt_manifest_text_layout(const ckpt_commit_info *ci, cJSON *const *parts, int n_parts,
                                int tp, int pp, int vpp) {
    cJSON *o = cJSON_CreateObject(), *lay, *ts, *fs, *sl;
    int ok = o && cJSON_AddStringToObject(o, "format", CKPT_FORMAT) &&
             add_num(o, "version", CKPT_VERSION) &&
             cJSON_AddStringToObject(o, "manifest_crc32c", "00000000") && /* sealed below */
             add_num(o, "step", ci->step) && add_num(o, "created", (double)time(NULL)) &&
             (lay = cJSON_AddObjectToObject(o, "layout")) && add_num(lay, "world", ci->world) &&
             add_num(lay, "dp", ci->dp) && add_num(lay, "tp", tp) && add_num(lay, "pp", pp) &&
             add_num(lay, "vpp", vpp) && add_num(lay, "zero", ci->dp > 1 ? 2 : 0) &&
             cJSON_AddItemToObject(o, "model", ckpt_json_model(ci->model)) &&
             cJSON_AddStringToObject(o, "optimizer", ci->optimizer) &&
             cJSON_AddItemToObject(o, "trainer", ckpt_json_trainer(ci->trainer)) &&
             (ts = cJSON_AddObjectToObject(o, "tensors"));
    for (int i = 0; ok && i < ci->n_tensors; i++) {
        cJSON *t = cJSON_AddObjectToObject(ts, ci->tensors[i].name);
        ok = t &&
             cJSON_AddItemToObject(t, "shape",
                                   int_array(ci->tensors[i].shape, ci->tensors[i].ndim)) &&
             cJSON_AddStringToObject(t, "dtype", "F32");
    }
    ok = ok && (fs = cJSON_AddArrayToObject(o, "files")) &&
         (sl = cJSON_AddArrayToObject(o, "slices"));
    for (int r = 0; ok && r < n_parts; r++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(parts[r], "file"), *s;
        ok = f && cJSON_AddItemToArray(fs, cJSON_Duplicate(f, 1));
        cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(parts[r], "slices")) {
            if (ok) ok = cJSON_AddItemToArray(sl, cJSON_Duplicate(s, 1));
        }
    }
    char *text = ok ? ckpt_manifest_seal(cJSON_Print(o)) : NULL;
    cJSON_Delete(o);
    return text;
}

void ckpt_manifest_free(ckpt_manifest *mf) {
    if (!mf) return;
    free(mf->tensors);
    free(mf->files);
    free(mf->slices);
    memset(mf, 0, sizeof *mf);
}

/* Array of n integers at o[key] into v. */
static ms_status get_ints(const cJSON *o, const char *key, int n, int64_t *v, const char *where) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key), *x;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return ms_error(MS_ERR_FORMAT, "%s: field '%s' is not an array of %d integers", where, key,
                        n);
    int i = 0;
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble > 9007199254740992.0)
            return ms_error(MS_ERR_FORMAT, "%s: field '%s' holds a bad value", where, key);
        v[i++] = (int64_t)x->valuedouble;
    }
    return MS_OK;
}

static ms_status parse_tensors(const cJSON *root, ckpt_manifest *mf, const char *where) {
    const cJSON *ts, *t;
    MS_TRY(get_obj(root, "tensors", &ts, where));
    mf->n_tensors = cJSON_GetArraySize(ts);
    mf->tensors = calloc((size_t)mf->n_tensors + 1, sizeof *mf->tensors);
    if (!mf->tensors) return ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
    int i = 0;
    cJSON_ArrayForEach(t, ts) {
        ckpt_tensor_info *ti = &mf->tensors[i++];
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
        const char *dt;
        snprintf(ti->name, sizeof ti->name, "%s", t->string);
        ti->ndim = cJSON_GetArraySize(sh);
        if (ti->ndim < 1 || ti->ndim > CKPT_MAX_DIMS)
            return ms_error(MS_ERR_FORMAT, "%s: tensor '%s' has a bad shape", where, ti->name);
        MS_TRY(get_ints(t, "shape", ti->ndim, ti->shape, where));
        MS_TRY(get_str(t, "dtype", &dt, where));
        if (strcmp(dt, "F32"))
            return ms_error(MS_ERR_FORMAT, "%s: tensor '%s' has dtype %s (only F32)", where,
                            ti->name, dt);
    }
    return MS_OK;
}

static int find_tensor(const ckpt_manifest *mf, const char *name) {
    for (int i = 0; i < mf->n_tensors; i++)
        if (!strcmp(mf->tensors[i].name, name)) return i;
    return -1;
}

static int find_file(const ckpt_manifest *mf, const char *name) {
    for (int i = 0; i < mf->n_files; i++)
        if (!strcmp(mf->files[i].name, name)) return i;
    return -1;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static ms_status parse_files(const cJSON *root, ckpt_manifest *mf, const char *where) {
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(root, "files"), *f;
    if (!cJSON_IsArray(fs) || cJSON_GetArraySize(fs) < 1)
        return ms_error(MS_ERR_FORMAT, "%s: no 'files' list", where);
    mf->n_files = cJSON_GetArraySize(fs);
    mf->files = calloc((size_t)mf->n_files, sizeof *mf->files);
    if (!mf->files) return ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
    int i = 0;
    cJSON_ArrayForEach(f, fs) {
        ckpt_file_info *fi = &mf->files[i++];
        const char *nm;
        MS_TRY(get_str(f, "name", &nm, where));
        if (!*nm || strchr(nm, '/') || !strcmp(nm, "..") || strlen(nm) >= sizeof fi->name)
            return ms_error(MS_ERR_FORMAT, "%s: bad file name '%s'", where, nm);
        snprintf(fi->name, sizeof fi->name, "%s", nm);
        MS_TRY(get_int(f, "rank", 0, INT32_MAX, &fi->rank, where));
        MS_TRY(get_u64(f, "bytes", &fi->bytes, where));
    }
    /* a file listed twice: its slices, CRCs and size would be checked against one entry
     * (verify passed such a manifest) */
    const char **names = malloc((size_t)mf->n_files * sizeof *names);
    if (!names) return ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
    for (int k = 0; k < mf->n_files; k++)
        names[k] = mf->files[k].name;
    qsort(names, (size_t)mf->n_files, sizeof *names, cmp_name);
    for (int k = 1; k < mf->n_files; k++)
        if (!strcmp(names[k], names[k - 1])) {
            ms_status st =
                ms_error(MS_ERR_FORMAT, "%s: file '%s' is listed twice", where, names[k]);
            free(names);
            return st;
        }
    free(names);
    return MS_OK;
}

static ms_status parse_slice(const cJSON *s, ckpt_manifest *mf, ckpt_slice *sl, const char *where) {
    const char *tn, *kind, *file, *key;
    int64_t range[2], crc;
    MS_TRY(get_str(s, "tensor", &tn, where));
    MS_TRY(get_str(s, "state", &kind, where));
    MS_TRY(get_str(s, "file", &file, where));
    MS_TRY(get_str(s, "key", &key, where));
    if ((sl->tensor = find_tensor(mf, tn)) < 0)
        return ms_error(MS_ERR_FORMAT, "%s: slice of unknown tensor '%s'", where, tn);
    if ((sl->kind = ckpt_kind_parse(kind)) < 0)
        return ms_error(MS_ERR_FORMAT, "%s: tensor '%s': unknown state '%s'", where, tn, kind);
    if ((sl->file = find_file(mf, file)) < 0)
        return ms_error(MS_ERR_FORMAT, "%s: tensor '%s': slice in unlisted file '%s'", where, tn,
                        file);
    if (strlen(key) >= sizeof sl->key)
        return ms_error(MS_ERR_FORMAT, "%s: tensor '%s': key too long", where, tn);
    snprintf(sl->key, sizeof sl->key, "%s", key);
    int nd = mf->tensors[sl->tensor].ndim;
    MS_TRY(get_ints(s, "offset", nd, sl->box_off, where));
    MS_TRY(get_ints(s, "shape", nd, sl->box_shape, where));
    MS_TRY(get_ints(s, "range", 2, range, where));
    MS_TRY(get_i64(s, "crc32c", 0, UINT32_MAX, &crc, where));
    sl->begin = (uint64_t)range[0];
    sl->end = (uint64_t)range[1];
    sl->crc = (uint32_t)crc;
    return MS_OK;
}

static ms_status parse_root(const cJSON *root, ckpt_manifest *mf, const char *where) {
    const char *fmt, *opt;
    const cJSON *lay, *model, *tr, *sl, *s;
    MS_TRY(get_str(root, "format", &fmt, where));
    if (strcmp(fmt, CKPT_FORMAT))
        return ms_error(MS_ERR_FORMAT, "%s: format '%s' is not '%s'", where, fmt, CKPT_FORMAT);
    MS_TRY(get_int(root, "version", 0, INT32_MAX, &mf->version, where));
    if (mf->version < 1 || mf->version > CKPT_VERSION) /* 1: before the checksum */
        return ms_error(MS_ERR_FORMAT, "%s: version %d; this build reads versions 1 to %d", where,
                        mf->version, CKPT_VERSION);
    MS_TRY(get_int(root, "step", 0, INT32_MAX, &mf->step, where));
    MS_TRY(get_double(root, "created", &mf->created, where));
    MS_TRY(get_obj(root, "layout", &lay, where));
    MS_TRY(get_int(lay, "world", 1, 1 << 24, &mf->world, where));
    MS_TRY(get_int(lay, "dp", 1, 1 << 24, &mf->dp, where));
    MS_TRY(get_int(lay, "tp", 1, 1 << 24, &mf->tp, where));
    MS_TRY(get_int(lay, "pp", 1, 1 << 24, &mf->pp, where));
    int64_t dt = (int64_t)mf->dp * mf->tp; /* (each at most 2^24: dt and dt x pp fit) */
    if (dt > mf->world || dt * mf->pp != mf->world)
        return ms_error(MS_ERR_FORMAT, "%s: layout: world %d is not dp %d x tp %d x pp %d", where,
                        mf->world, mf->dp, mf->tp, mf->pp);
    mf->vpp = 1; /* absent in older commits: no interleaving */
    if (cJSON_GetObjectItemCaseSensitive(lay, "vpp"))
        MS_TRY(get_int(lay, "vpp", 1, 1 << 24, &mf->vpp, where));
    MS_TRY(get_obj(root, "model", &model, where));
    MS_TRY(ckpt_json_model_parse(model, &mf->model, where));
    MS_TRY(get_str(root, "optimizer", &opt, where));
    snprintf(mf->optimizer, sizeof mf->optimizer, "%s", opt);
    MS_TRY(get_obj(root, "trainer", &tr, where));
    MS_TRY(ckpt_json_trainer_parse(tr, &mf->trainer, where));
    if (mf->trainer.step != mf->step)
        return ms_error(MS_ERR_FORMAT, "%s: trainer step %d differs from step %d", where,
                        mf->trainer.step, mf->step);
    MS_TRY(parse_tensors(root, mf, where));
    MS_TRY(parse_files(root, mf, where));
    sl = cJSON_GetObjectItemCaseSensitive(root, "slices");
    if (!cJSON_IsArray(sl)) return ms_error(MS_ERR_FORMAT, "%s: no 'slices' list", where);
    mf->n_slices = cJSON_GetArraySize(sl);
    mf->slices = calloc((size_t)mf->n_slices + 1, sizeof *mf->slices);
    if (!mf->slices) return ms_error(MS_ERR_NOMEM, "%s: out of memory", where);
    int i = 0;
    cJSON_ArrayForEach(s, sl) MS_TRY(parse_slice(s, mf, &mf->slices[i++], where));
    return MS_OK;
}

/* The most a manifest beside n_files shard files can hold: 1 MiB, and 16
 * MiB for each (some 64k slices of 250 bytes a rank: a 48-layer model's
 * tensors, params and moments, hold 2k).  Bounded by the commit's own
 * files: a 10k-rank manifest passes 1 GiB, and 8 GB of anything else was
 * read whole before it was refused. */
#define MANIFEST_BASE_BYTES ((size_t)1 << 20)
#define MANIFEST_FILE_BYTES ((size_t)16 << 20)

/* The shard files (shard-*.safetensors) in dir. */
static size_t count_shards(const char *dir) {
    DIR *d = opendir(dir);
    size_t n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        n += !strncmp(e->d_name, "shard-", 6) && l > 12 &&
             !strcmp(e->d_name + l - 12, ".safetensors");
    }
    closedir(d);
    return n;
}

/* Values no trainer writes, read from a manifest whose checksum holds (a buggy writer, or a
 * hand edit with its checksum redone; a hand edit alone is named by the checksum): before,
 * `ckpt verify` said ok, and a resume advised `--data-order random`, itself refused, or only
 * said that a beta of 7 differed from the option's.  The ranges are the trainer's own.
 * (opt_steps is not held to the step: it is the optimizer's own count, which the unit tests'
 * fixtures carry past it.) */
static ms_status check_values(const ckpt_manifest *mf, const char *path) {
    const ckpt_train_state *s = &mf->trainer;
    opt_kind k;
    data_order o;
    if (opt_kind_parse(mf->optimizer, &k) != MS_OK)
        return ms_error_wrap(MS_ERR_FORMAT, "%s: optimizer", path);
    if (s->optimizer[0] && opt_kind_parse(s->optimizer, &k) != MS_OK)
        return ms_error_wrap(MS_ERR_FORMAT, "%s: trainer optimizer", path);
    if (s->optimizer[0] && (!(s->beta1 >= 0 && s->beta1 < 1) || !(s->beta2 >= 0 && s->beta2 < 1) ||
                            !(s->eps > 0 && isfinite(s->eps)) ||
                            !(s->weight_decay >= 0 && isfinite(s->weight_decay)) ||
                            !(s->grad_clip >= 0 && isfinite(s->grad_clip))))
        return ms_error(MS_ERR_FORMAT,
                        "%s: trainer optimizer: beta1 %g, beta2 %g, eps %g, weight_decay %g, "
                        "grad_clip %g: expected betas in [0,1), eps > 0, the others >= 0",
                        path, s->beta1, s->beta2, s->eps, s->weight_decay, s->grad_clip);
    if (s->data_order[0] && data_order_parse(s->data_order, &o) != MS_OK)
        return ms_error_wrap(MS_ERR_FORMAT, "%s: trainer data", path);
    return MS_OK;
}

ms_status ckpt_manifest_read(const char *dir, ckpt_manifest *mf) {
    char path[4200];
    char *text = NULL;
    size_t len = 0;
    memset(mf, 0, sizeof *mf);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST);
    size_t files = count_shards(dir);
    size_t max = files < (SIZE_MAX / 4 - MANIFEST_BASE_BYTES) / MANIFEST_FILE_BYTES
                     ? MANIFEST_BASE_BYTES + files * MANIFEST_FILE_BYTES
                     : SIZE_MAX / 4;
    uint64_t size = 0;
    ms_status st = ms_file_size(path, &size);
    if (st == MS_OK && size > max)
        return ms_error(MS_ERR_FORMAT,
                        "%s: larger than a manifest of %zu shard file(s) can be (%" PRIu64
                        " bytes; at most %zu: 1 MiB and 16 MiB a shard): damaged, or not a "
                        "manifest",
                        path, files, size, max);
    if (st == MS_OK) st = ms_file_read_max(path, max, &text, &len);
    if (st == MS_ERR_NOTFOUND)
        return ms_error(MS_ERR_NOTFOUND, "%s: no %s: not a committed checkpoint", dir,
                        CKPT_MANIFEST);
    if (st != MS_OK) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        st = ms_error(MS_ERR_FORMAT, "%s: not valid JSON (truncated or damaged)", path);
    } else {
        /* the fields first (their errors are the more precise), then the
         * checksum of what they were read from */
        st = parse_root(root, mf, path);
        if (st == MS_OK && mf->version >= 2) st = check_sum(text, len, path);
        if (st == MS_OK) st = check_values(mf, path);
    }
    cJSON_Delete(root);
    free(text);
    if (st != MS_OK) ckpt_manifest_free(mf);
    return st;
}
