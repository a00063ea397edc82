/* safetensors.c - safetensors reader and writer (see safetensors.h).
 *
 * File layout: u64 little-endian N, N bytes of JSON header, data section.
 * Each header entry is "name": {"dtype", "shape", "data_offsets": [b, e]}
 * with offsets relative to the data section; "__metadata__" is an optional
 * string -> string map.
 *
 * Reader: the file is mapped, the header parsed with cJSON (the tree is kept:
 * tensor names and metadata point into it) and every entry validated before
 * ckpt_st_open returns.  Tensors are listed in header order.
 *
 * Writer: the header lists tensors in insertion order.  The data section is
 * laid out like the reference implementation (huggingface/safetensors):
 * gap-free, larger element sizes first (ties in insertion order), after a
 * header padded with spaces so the data section starts 8-aligned.  That makes
 * every tensor aligned to its element size and keeps the file loadable by the
 * reference reader, which rejects gaps between tensors.
 */
#include "ckpt/safetensors.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "ckpt/llmc.h"
#include "data/shard.h"

#define ST_MAX_HEADER 100000000ull /* the reference reader's limit */
#define ST_META_KEY "__metadata__"

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {{"F32", 4}, {"BF16", 2}, {"F16", 2}, {"I32", 4}, {"I64", 8}, {"U8", 1}};
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

size_t ckpt_st_dtype_size(ckpt_st_dtype dt) {
    return (int)dt >= 0 && (int)dt < ST_NDTYPES ? st_dtypes[dt].size : 0;
}

const char *ckpt_st_dtype_name(ckpt_st_dtype dt) {
    return (int)dt >= 0 && (int)dt < ST_NDTYPES ? st_dtypes[dt].name : "unknown";
}

/* ---- reader ----------------------------------------------------------- */

struct ckpt_st_file {
    char *path;
    const void *map;
    size_t map_len;
    cJSON *root;
    const cJSON *meta; /* "__metadata__" object, or NULL */
    int n;
    ckpt_st_tensor *t; /* header order */
    int *by_name;      /* indices of t sorted by name, for ckpt_st_find */
};

/* Span of one tensor in the data section, for the overlap check. */
typedef struct {
    uint64_t begin, end;
    int idx;
} st_span;

/* A JSON number that is a non-negative integer exactly representable in a
 * double (< 2^53); 0 otherwise. */
static int json_uint(const cJSON *v, uint64_t *out) {
    double d;
    if (!cJSON_IsNumber(v)) return 0;
    d = v->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Parse the dtype and shape of entry `e` named `nm` into *t. */
static ms_status st_parse_type(const char *path, const char *nm, const cJSON *e,
                               ckpt_st_tensor *t) {
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *d;
    int k = 0;
    if (!dt) return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": missing \"dtype\"", path, nm);
    if (!cJSON_IsString(dt))
        return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": \"dtype\" is not a string", path, nm);
    for (k = 0; k < ST_NDTYPES && strcmp(dt->valuestring, st_dtypes[k].name) != 0; k++) {
    }
    if (k == ST_NDTYPES)
        return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", path, nm,
                        dt->valuestring);
    t->dtype = (ckpt_st_dtype)k;
    if (!shape) return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": missing \"shape\"", path, nm);
    if (!cJSON_IsArray(shape))
        return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": \"shape\" is not an array", path, nm);
    if (cJSON_GetArraySize(shape) > CKPT_ST_MAX_DIMS)
        return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": %d dimensions (at most %d supported)",
                        path, nm, cJSON_GetArraySize(shape), CKPT_ST_MAX_DIMS);
    t->ndim = 0;
    cJSON_ArrayForEach(d, shape) {
        uint64_t v;
        if (cJSON_IsNumber(d) && d->valuedouble < 0)
            return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": negative dimension %g in shape",
                            path, nm, d->valuedouble);
        if (!json_uint(d, &v))
            return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": shape entry %d is not an integer",
                            path, nm, t->ndim);
        t->shape[t->ndim++] = (int64_t)v;
    }
    return MS_OK;
}

/* Parse and validate entry `e` (named `nm`) into *t and *span: type, shape,
 * offsets inside the data section of `data_len` bytes, size consistency. */
static ms_status st_parse_entry(const char *path, const char *nm, const cJSON *e,
                                const uint8_t *data, uint64_t data_len, ckpt_st_tensor *t,
                                st_span *span) {
    const cJSON *offs;
    uint64_t b, end, nel = 1, nbytes;
    if (!cJSON_IsObject(e))
        return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": entry is not a JSON object", path, nm);
    MS_TRY(st_parse_type(path, nm, e, t));
    offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!offs)
        return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": missing \"data_offsets\"", path, nm);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_uint(cJSON_GetArrayItem(offs, 0), &b) ||
        !json_uint(cJSON_GetArrayItem(offs, 1), &end))
        return ms_error(
            MS_ERR_FORMAT,
            "%s: tensor \"%s\": \"data_offsets\" is not [begin, end] with integers >= 0", path, nm);
    if (end < b)
        return ms_error(MS_ERR_FORMAT,
                        "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                        "] end before begin",
                        path, nm, b, end);
    if (end > data_len)
        return ms_error(MS_ERR_FORMAT,
                        "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                        "] beyond the data section (%" PRIu64 " bytes): file truncated?",
                        path, nm, b, end, data_len);
    for (int k = 0; k < t->ndim; k++)
        if (__builtin_mul_overflow(nel, (uint64_t)t->shape[k], &nel))
            return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": shape product overflows", path, nm);
    if (__builtin_mul_overflow(nel, (uint64_t)st_dtypes[t->dtype].size, &nbytes))
        return ms_error(MS_ERR_FORMAT, "%s: tensor \"%s\": shape product overflows", path, nm);
    if (nbytes != end - b)
        return ms_error(MS_ERR_FORMAT,
                        "%s: tensor \"%s\": shape has %" PRIu64 " elements of %s (%" PRIu64
                        " bytes) but data_offsets span %" PRIu64 " bytes",
                        path, nm, nel, st_dtypes[t->dtype].name, nbytes, end - b);
    t->data = data + b;
    t->nbytes = (size_t)nbytes;
    span->begin = b;
    span->end = end;
    return MS_OK;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Validate "__metadata__": an object whose values are all strings, no key
 * twice (sorted, so a header with 10^5 keys takes milliseconds, not
 * minutes). */
static ms_status st_check_meta(const char *path, const cJSON *meta) {
    const cJSON *kv;
    if (!cJSON_IsObject(meta))
        return ms_error(MS_ERR_FORMAT, "%s: \"" ST_META_KEY "\" is not a JSON object", path);
    int n = 0;
    cJSON_ArrayForEach(kv, meta) {
        if (!cJSON_IsString(kv))
            return ms_error(MS_ERR_FORMAT,
                            "%s: \"" ST_META_KEY "\" value for key \"%s\" is not a string", path,
                            kv->string);
        n++;
    }
    const char **keys = malloc(sizeof *keys * (size_t)(n > 0 ? n : 1));
    if (!keys) return ms_error(MS_ERR_NOMEM, "%s: out of memory for %d metadata keys", path, n);
    int i = 0;
    cJSON_ArrayForEach(kv, meta) keys[i++] = kv->string;
    qsort(keys, (size_t)n, sizeof *keys, cmp_key);
    ms_status rc = MS_OK;
    for (i = 1; i < n && rc == MS_OK; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            rc = ms_error(MS_ERR_FORMAT, "%s: duplicate \"" ST_META_KEY "\" key \"%s\"", path,
                          keys[i]);
    free(keys);
    return rc;
}

static int cmp_span(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Reject overlapping spans (empty spans overlap nothing).  Sorts `sp`. */
static ms_status st_check_overlap(const ckpt_st_file *f, st_span *sp, int n, uint64_t data_len) {
    const st_span *last = NULL;
    qsort(sp, (size_t)n, sizeof *sp, cmp_span);
    for (int i = 0; i < n; i++) {
        if (sp[i].begin == sp[i].end) continue;
        if (last && sp[i].begin < last->end)
            return ms_error(MS_ERR_FORMAT,
                            "%s: tensors \"%s\" [%" PRIu64 ", %" PRIu64 ") and \"%s\" [%" PRIu64
                            ", %" PRIu64 ") overlap",
                            f->path, f->t[last->idx].name, last->begin, last->end,
                            f->t[sp[i].idx].name, sp[i].begin, sp[i].end);
        /* every byte of the data section is a tensor's (the format's rule, which its
         * reference loader checks): a hole or bytes past the last tensor are no file that
         * a writer made whole (appended to, or a header of another file's tensors) */
        uint64_t at = last ? last->end : 0;
        if (sp[i].begin != at)
            return ms_error(MS_ERR_FORMAT,
                            "%s: data bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor (before "
                            "\"%s\"): every byte of the data section must be a tensor's",
                            f->path, at, sp[i].begin, f->t[sp[i].idx].name);
        last = &sp[i];
    }
    uint64_t end = last ? last->end : 0;
    if (end != data_len)
        return ms_error(MS_ERR_FORMAT,
                        "%s: %" PRIu64 " byte(s) after the last tensor's data (the data section "
                        "is %" PRIu64 " bytes, the tensors end at %" PRIu64
                        "): appended to, or damaged",
                        f->path, data_len - end, data_len, end);
    return MS_OK;
}

/* qsort_r comparator: tensor indices by name. */
static int cmp_by_name(const void *a, const void *b, void *ctx) {
    const ckpt_st_tensor *t = ctx;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

/* Parse the JSON header text (hdr, hlen bytes, not NUL-terminated). */
static ms_status st_parse_json(ckpt_st_file *f, const char *hdr, uint64_t hlen) {
    ms_status rc = MS_OK;
    const char *end = NULL;
    char *buf;
    if (memchr(hdr, '\0', (size_t)hlen))
        return ms_error(MS_ERR_FORMAT, "%s: header contains a NUL byte", f->path);
    buf = malloc((size_t)hlen + 1);
    if (!buf) return ms_error(MS_ERR_NOMEM, "%s: out of memory for the header", f->path);
    memcpy(buf, hdr, (size_t)hlen);
    buf[hlen] = '\0';
    f->root = cJSON_ParseWithLengthOpts(buf, (size_t)hlen + 1, &end, 1);
    if (!f->root)
        rc = ms_error(MS_ERR_FORMAT,
                      "%s: header is not valid JSON (error near byte %td of %" PRIu64 ")", f->path,
                      end ? end - buf : (ptrdiff_t)-1, hlen);
    else if (!cJSON_IsObject(f->root))
        rc = ms_error(MS_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    free(buf);
    return rc;
}

/* Build f->t from the parsed header and validate all entries. */
static ms_status st_load_entries(ckpt_st_file *f, const uint8_t *data, uint64_t data_len) {
    ms_status rc = MS_OK;
    st_span *sp = NULL;
    const cJSON *e;
    int n = 0, i = 0;
    cJSON_ArrayForEach(e, f->root) {
        if (strcmp(e->string, ST_META_KEY) != 0)
            n++;
        else if (f->meta)
            return ms_error(MS_ERR_FORMAT, "%s: duplicate \"" ST_META_KEY "\"", f->path);
        else
            f->meta = e;
    }
    if (f->meta) MS_TRY(st_check_meta(f->path, f->meta));
    f->t = calloc((size_t)n + 1, sizeof *f->t);
    f->by_name = calloc((size_t)n + 1, sizeof *f->by_name);
    sp = calloc((size_t)n + 1, sizeof *sp);
    if (!f->t || !f->by_name || !sp) {
        rc = ms_error(MS_ERR_NOMEM, "%s: out of memory for %d tensors", f->path, n);
        goto out;
    }
    cJSON_ArrayForEach(e, f->root) {
        if (e == f->meta) continue;
        f->t[i].name = e->string;
        rc = st_parse_entry(f->path, e->string, e, data, data_len, &f->t[i], &sp[i]);
        if (rc != MS_OK) goto out;
        sp[i].idx = i;
        f->by_name[i] = i;
        i++;
    }
    f->n = n;
    qsort_r(f->by_name, (size_t)n, sizeof *f->by_name, cmp_by_name, f->t);
    for (i = 1; i < n; i++)
        if (strcmp(f->t[f->by_name[i - 1]].name, f->t[f->by_name[i]].name) == 0) {
            rc = ms_error(MS_ERR_FORMAT, "%s: duplicate tensor \"%s\"", f->path,
                          f->t[f->by_name[i]].name);
            goto out;
        }
    rc = st_check_overlap(f, sp, n, data_len);
out:
    free(sp);
    return rc;
}

/* Why the file of len bytes p (len >= 8), whose first 8 bytes read header
 * length hlen, is no safetensors file: what it looks like when that is
 * known (a token shard's magic, text), else what breaks the format; NULL
 * if it may be one.  A safetensors file: an 8-byte header length, then a
 * JSON header that starts with '{' (the format's rule); one whose length
 * runs past its end but whose header starts so is a truncated one. */
static const char *not_safetensors(const uint8_t *p, size_t len, uint64_t hlen) {
    if (hlen <= ST_MAX_HEADER && (hlen <= len - 8 || len == 8 || p[8] == '{')) return NULL;
    uint32_t w0 =
        (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (w0 == DATA_SHARD_MAGIC) return "it is a token shard (magic 20240520), not weights";
    if (w0 == DATA_SHARD_MAGIC_LLAMA3)
        return "it is an llm.c llama-3 token shard (magic 20240801), not weights";
    if (!memcmp(p, "MSTOKBPE", 8)) return "it is a megascale tokenizer file, not weights";
    if (w0 == CKPT_LLMC_MAGIC + 1) /* llm.c's model files are read by llmc.c */
        return "it is an llm.c training state (magic 20240327: train_gpt2's optimizer state), "
               "not model weights: give its model file (magic 20240326)";
    if (p[0] == '{') return "it looks like a JSON file";
    size_t n = len < 256 ? len : 256, text = 0;
    for (size_t i = 0; i < n; i++)
        text += (p[i] >= 0x20 && p[i] < 0x7f) || p[i] == '\n' || p[i] == '\t' || p[i] == '\r';
    if (text == n) return "it looks like a text file";
    return hlen > ST_MAX_HEADER
               ? "its first 8 bytes, the header length, read more than the 100000000-byte limit"
               : "its header length runs past the end of the file, and no JSON header "
                 "follows it";
}

ms_status ckpt_st_open(ckpt_st_file **out, const char *path) {
    ms_status rc = MS_OK;
    ckpt_st_file *f = calloc(1, sizeof *f);
    const uint8_t *p;
    uint64_t hlen = 0;
    *out = NULL;
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    }
    rc = ms_file_map(path, &f->map, &f->map_len);
    if (rc != MS_OK) goto out;
    p = f->map;
    if (f->map_len < 8) {
        rc = ms_error(MS_ERR_FORMAT,
                      "%s: file is %zu bytes, shorter than the 8-byte header length: "
                      "not a safetensors file",
                      path, f->map_len);
        goto out;
    }
    for (int k = 7; k >= 0; k--)
        hlen = hlen << 8 | p[k];
    const char *why = not_safetensors(p, f->map_len, hlen);
    if (why) {
        rc = ms_error(MS_ERR_FORMAT, "%s: not a safetensors file: %s", path, why);
        goto out;
    }
    if (hlen > f->map_len - 8) {
        rc = ms_error(MS_ERR_FORMAT,
                      "%s: header length %" PRIu64 " runs past the end of the file "
                      "(%zu bytes): file truncated?",
                      path, hlen, f->map_len);
        goto out;
    }
    rc = st_parse_json(f, (const char *)p + 8, hlen);
    if (rc == MS_OK) rc = st_load_entries(f, p + 8 + hlen, f->map_len - 8 - hlen);
out:
    if (rc != MS_OK)
        ckpt_st_close(f);
    else
        *out = f;
    return rc;
}

void ckpt_st_close(ckpt_st_file *f) {
    if (!f) return;
    ms_file_unmap(f->map, f->map_len);
    cJSON_Delete(f->root);
    free(f->t);
    free(f->by_name);
    free(f->path);
    free(f);
}

int ckpt_st_count(const ckpt_st_file *f) {
    return f->n;
}

const ckpt_st_tensor *ckpt_st_get(const ckpt_st_file *f, int i) {
    MS_CHECKF(i >= 0 && i < f->n, "ckpt_st_get: index %d out of range [0, %d)", i, f->n);
    return &f->t[i];
}

const ckpt_st_tensor *ckpt_st_find(const ckpt_st_file *f, const char *name) {
    int lo = 0, hi = f->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->t[f->by_name[mid]].name, name);
        if (c == 0) return &f->t[f->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *ckpt_st_meta(const ckpt_st_file *f, const char *key) {
    const cJSON *v = f->meta ? cJSON_GetObjectItemCaseSensitive(f->meta, key) : NULL;
    return v ? v->valuestring : NULL;
}

const char *ckpt_st_path(const ckpt_st_file *f) {
    return f->path;
}

/* ---- writer ----------------------------------------------------------- */

struct ckpt_st_writer {
    int n, cap;
    ckpt_st_tensor *t; /* insertion order; names owned */
    int nmeta, capmeta;
    char **mkey, **mval; /* owned */
};

ckpt_st_writer *ckpt_st_writer_create(void) {
    return calloc(1, sizeof(ckpt_st_writer));
}

void ckpt_st_writer_destroy(ckpt_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++)
        free(w->t[i].name);
    for (int i = 0; i < w->nmeta; i++) {
        free(w->mkey[i]);
        free(w->mval[i]);
    }
    free(w->t);
    free(w->mkey);
    free(w->mval);
    free(w);
}

/* Check the arguments of ckpt_st_writer_add; computes *nbytes. */
static ms_status st_check_add(const ckpt_st_writer *w, const char *name, ckpt_st_dtype dt, int ndim,
                              const int64_t *shape, const void *data, size_t *nbytes) {
    uint64_t nel = 1, nb;
    if (!name || !name[0]) return ms_error(MS_ERR_ARG, "safetensors writer: empty tensor name");
    if (strcmp(name, ST_META_KEY) == 0)
        return ms_error(MS_ERR_ARG, "safetensors writer: \"%s\" is reserved", name);
    if (ckpt_st_dtype_size(dt) == 0)
        return ms_error(MS_ERR_ARG, "safetensors writer: tensor \"%s\": bad dtype %d", name,
                        (int)dt);
    if (ndim < 0 || ndim > CKPT_ST_MAX_DIMS || (ndim > 0 && !shape))
        return ms_error(MS_ERR_ARG, "safetensors writer: tensor \"%s\": bad ndim %d", name, ndim);
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0)
            return ms_error(MS_ERR_ARG,
                            "safetensors writer: tensor \"%s\": negative dimension %" PRId64, name,
                            shape[k]);
        if (__builtin_mul_overflow(nel, (uint64_t)shape[k], &nel))
            return ms_error(MS_ERR_ARG, "safetensors writer: tensor \"%s\": shape overflows", name);
    }
    if (__builtin_mul_overflow(nel, (uint64_t)ckpt_st_dtype_size(dt), &nb) || nb > SIZE_MAX)
        return ms_error(MS_ERR_ARG, "safetensors writer: tensor \"%s\": size overflows", name);
    if (nb > 0 && !data)
        return ms_error(MS_ERR_ARG, "safetensors writer: tensor \"%s\": NULL data", name);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return ms_error(MS_ERR_ARG, "safetensors writer: duplicate tensor \"%s\"", name);
    *nbytes = (size_t)nb;
    return MS_OK;
}

ms_status ckpt_st_writer_add(ckpt_st_writer *w, const char *name, ckpt_st_dtype dt, int ndim,
                             const int64_t *shape, const void *data) {
    ckpt_st_tensor *t;
    size_t nbytes = 0;
    MS_TRY(st_check_add(w, name, dt, ndim, shape, data, &nbytes));
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        ckpt_st_tensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return ms_error(MS_ERR_NOMEM, "safetensors writer: out of memory");
        w->t = nt;
        w->cap = cap;
    }
    t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return ms_error(MS_ERR_NOMEM, "safetensors writer: out of memory");
    t->dtype = dt;
    t->ndim = ndim;
    for (int k = 0; k < ndim; k++)
        t->shape[k] = shape[k];
    t->data = data;
    t->nbytes = nbytes;
    w->n++;
    return MS_OK;
}

/* Sets key to value; a key set twice keeps the last value. */
ms_status ckpt_st_writer_meta(ckpt_st_writer *w, const char *key, const char *value) {
    char *v;
    int i;
    if (!key || !value)
        return ms_error(MS_ERR_ARG, "safetensors writer: NULL metadata key or value");
    for (i = 0; i < w->nmeta && strcmp(w->mkey[i], key) != 0; i++) {
    }
    if (!(v = strdup(value))) return ms_error(MS_ERR_NOMEM, "safetensors writer: out of memory");
    if (i < w->nmeta) {
        free(w->mval[i]);
        w->mval[i] = v;
        return MS_OK;
    }
    if (w->nmeta == w->capmeta) {
        int cap = w->capmeta ? 2 * w->capmeta : 8;
        char **nk = realloc(w->mkey, (size_t)cap * sizeof *nk);
        if (nk) w->mkey = nk;
        char **nv = nk ? realloc(w->mval, (size_t)cap * sizeof *nv) : NULL;
        if (nv) w->mval = nv;
        if (!nk || !nv) {
            free(v);
            return ms_error(MS_ERR_NOMEM, "safetensors writer: out of memory");
        }
        w->capmeta = cap;
    }
    if (!(w->mkey[w->nmeta] = strdup(key))) {
        free(v);
        return ms_error(MS_ERR_NOMEM, "safetensors writer: out of memory");
    }
    w->mval[w->nmeta++] = v;
    return MS_OK;
}

/* Data order: element size descending, ties in insertion order (stable:
 * the index breaks ties). */
static int cmp_layout(const void *a, const void *b, void *ctx) {
    const ckpt_st_tensor *t = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    size_t si = ckpt_st_dtype_size(t[i].dtype), sj = ckpt_st_dtype_size(t[j].dtype);
    if (si != sj) return si > sj ? -1 : 1;
    return (i > j) - (i < j);
}

/* A cJSON raw array "[v0,v1,...]" of n integers. */
static cJSON *json_int_array(const int64_t *v, int n) {
    char buf[CKPT_ST_MAX_DIMS * 24 + 4];
    size_t off = 0;
    buf[off++] = '[';
    for (int k = 0; k < n; k++)
        off += (size_t)snprintf(buf + off, sizeof buf - off, "%s%" PRId64, k ? "," : "", v[k]);
    buf[off++] = ']';
    buf[off] = '\0';
    return cJSON_CreateRaw(buf);
}

/* The JSON header text (malloc'd, caller frees) for data offsets `off`
 * (pairs, indexed like w->t); NULL on allocation failure. */
static char *st_header_json(const ckpt_st_writer *w, const int64_t *off) {
    cJSON *root = cJSON_CreateObject(), *meta, *e;
    char *s = NULL;
    int ok = root != NULL;
    if (ok && w->nmeta > 0) {
        ok = (meta = cJSON_AddObjectToObject(root, ST_META_KEY)) != NULL;
        for (int i = 0; ok && i < w->nmeta; i++)
            ok = cJSON_AddStringToObject(meta, w->mkey[i], w->mval[i]) != NULL;
    }
    for (int i = 0; ok && i < w->n; i++) {
        ok = (e = cJSON_AddObjectToObject(root, w->t[i].name)) != NULL &&
             cJSON_AddStringToObject(e, "dtype", ckpt_st_dtype_name(w->t[i].dtype)) != NULL &&
             cJSON_AddItemToObject(e, "shape", json_int_array(w->t[i].shape, w->t[i].ndim)) &&
             cJSON_AddItemToObject(e, "data_offsets", json_int_array(off + 2 * i, 2));
    }
    if (ok) s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* Write header and data to an open atomic file; `order` is the data order. */
/* Lay the tensors out (larger element sizes first, ties in insertion order,
 * no gaps) and build the header: 8-byte length, JSON, spaces up to a
 * multiple of align bytes.  *hdr (malloc'd, *len bytes) and *order (the
 * data order, malloc'd) are the caller's on success. */
static ms_status st_plan(ckpt_st_writer *w, size_t align, char **hdr, size_t *len, int **order) {
    ms_status rc = MS_OK;
    int64_t *off = calloc(2 * (size_t)w->n + 2, sizeof *off);
    int *ord = calloc((size_t)w->n + 1, sizeof *ord);
    char *json = NULL;
    int64_t pos = 0;
    *hdr = NULL;
    *len = 0;
    *order = NULL;
    if (align < 8 || (align & (align - 1))) {
        rc = ms_error(MS_ERR_ARG, "safetensors writer: alignment %zu", align);
        goto out;
    }
    if (!off || !ord) {
        rc = ms_error(MS_ERR_NOMEM, "safetensors writer: out of memory");
        goto out;
    }
    for (int i = 0; i < w->n; i++)
        ord[i] = i;
    qsort_r(ord, (size_t)w->n, sizeof *ord, cmp_layout, w->t);
    for (int i = 0; i < w->n; i++) {
        off[2 * ord[i]] = pos;
        pos += (int64_t)w->t[ord[i]].nbytes;
        off[2 * ord[i] + 1] = pos;
    }
    if (!(json = st_header_json(w, off))) {
        rc = ms_error(MS_ERR_NOMEM, "safetensors writer: out of memory building the header");
        goto out;
    }
    size_t jlen = strlen(json), total = (8 + jlen + align - 1) / align * align;
    uint64_t hlen = total - 8;
    if (!(*hdr = malloc(total))) {
        rc = ms_error(MS_ERR_NOMEM, "safetensors writer: out of memory");
        goto out;
    }
    for (int k = 0; k < 8; k++)
        (*hdr)[k] = (char)(uint8_t)(hlen >> (8 * k));
    memcpy(*hdr + 8, json, jlen);
    memset(*hdr + 8 + jlen, ' ', total - 8 - jlen);
    *len = total;
    *order = ord;
    ord = NULL;
out:
    free(json);
    free(ord);
    free(off);
    return rc;
}

ms_status ckpt_st_writer_header(ckpt_st_writer *w, size_t align, char **hdr, size_t *len) {
    int *order = NULL;
    ms_status rc = st_plan(w, align, hdr, len, &order);
    free(order);
    return rc;
}

ms_status ckpt_st_write(ckpt_st_writer *w, const char *path) {
    ms_atomic_file af = {0};
    char *hdr = NULL;
    size_t len = 0;
    int *order = NULL;
    ms_status rc = st_plan(w, 8, &hdr, &len, &order);
    if (rc != MS_OK) return ms_error_wrap(rc, "%s", path);
    rc = ms_atomic_open(&af, path);
    if (rc == MS_OK) rc = ms_atomic_write(&af, hdr, len);
    for (int i = 0; rc == MS_OK && i < w->n; i++)
        rc = ms_atomic_write(&af, w->t[order[i]].data, w->t[order[i]].nbytes);
    if (rc == MS_OK) rc = ms_atomic_commit(&af);
    ms_atomic_abort(&af); /* removes the temp file on failure; no-op after commit */
    free(hdr);
    free(order);
    return rc;
}
