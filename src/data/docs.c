/* docs.c - documents from plain files and JSON Lines. */
#include "data/docs.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/fileio.h"
#include "base/log.h"
#include "data/shard.h"

struct data_docs {
    char *const *paths;
    int n_paths, next_file;
    const char *field;
    int skip_bad;
    const char *path; /* the file mapped now, or "" */
    const char *map;  /* NULL: none mapped */
    size_t map_len, pos;
    int jsonl;
    uint64_t line;    /* JSONL: lines read from this file */
    cJSON *json;      /* the object the last JSONL document lives in */
    uint64_t pending; /* input bytes read since the last document */
    uint64_t skipped;
    uint64_t surrogates; /* lines whose lone surrogate escapes were read as U+FFFD */
    char first_bad[600];
    struct stat id; /* the mapped file's identity when it was mapped */
};

ms_status data_docs_open(data_docs **out, char *const *paths, int n, const char *field,
                         int skip_bad) {
    data_docs *d = calloc(1, sizeof *d);
    *out = d;
    if (!d) return ms_error(MS_ERR_NOMEM, "out of memory");
    d->paths = paths;
    d->n_paths = n;
    d->field = field && *field ? field : "text";
    d->skip_bad = skip_bad;
    d->path = "";
    return MS_OK;
}

static void unmap(data_docs *d) {
    if (d->map) ms_file_unmap(d->map, d->map_len);
    d->map = NULL;
    d->map_len = d->pos = 0;
}

/* unmap, once the file's text was read: a file rewritten in place meanwhile (the same size:
 * no SIGBUS) is an error, not shards of old and new text mixed (it was prepared, exit 0) */
static ms_status unmap_checked(data_docs *d) {
    int mapped = d->map != NULL;
    unmap(d);
    struct stat now;
    if (!mapped || !d->path[0]) return MS_OK;
    if (stat(d->path, &now) != 0 || now.st_dev != d->id.st_dev || now.st_ino != d->id.st_ino ||
        now.st_size != d->id.st_size || now.st_mtim.tv_sec != d->id.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != d->id.st_mtim.tv_nsec) /* not ctime: a chmod changes no byte */
        return ms_error(MS_ERR_IO,
                        "%s: the file changed on disk while it was read (rewritten, replaced or "
                        "removed): its tokens would mix old and new text; leave the inputs alone "
                        "while they are read",
                        d->path);
    return MS_OK;
}

void data_docs_close(data_docs *d) {
    if (!d) return;
    if (d->surrogates > 1) /* the first was named as it was read */
        ms_warn("%llu JSONL lines in all held lone UTF-16 surrogate escapes, read as U+FFFD",
                (unsigned long long)d->surrogates);
    cJSON_Delete(d->json);
    unmap(d);
    free(d);
}

const char *data_docs_path(const data_docs *d) {
    return d->path;
}

uint64_t data_docs_skipped(const data_docs *d, const char **first) {
    *first = d->first_bad;
    return d->skipped;
}

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

/* The compression format whose magic bytes p[0, n) start with, or NULL. */
static const char *compressed(const unsigned char *p, size_t n) {
    if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) return "gzip";
    if (n >= 4 && !memcmp(p, "\x28\xb5\x2f\xfd", 4)) return "zstd";
    if (n >= 6 && !memcmp(p,
                          "\xfd"
                          "7zXZ\0",
                          6))
        return "xz";
    if (n >= 10 && !memcmp(p, "BZh", 3) && p[3] >= '1' && p[3] <= '9' &&
        !memcmp(p + 4, "\x31\x41\x59\x26\x53\x59", 6))
        return "bzip2";
    return NULL;
}

/* Map the next file; *more 0 when there is none. */
static ms_status next_file(data_docs *d, int *more) {
    *more = d->next_file < d->n_paths;
    if (!*more) return MS_OK;
    d->path = d->paths[d->next_file++];
    const void *m;
    MS_TRY(ms_file_map(d->path, &m, &d->map_len));
    d->map = m;
    if (stat(d->path, &d->id) != 0) memset(&d->id, 0, sizeof d->id);
    d->pos = 0;
    d->line = 0;
    d->jsonl = ends_with(d->path, ".jsonl");
    const char *z = compressed((const unsigned char *)d->map, d->map_len);
    if (z)
        return ms_error(MS_ERR_FORMAT,
                        "%s: a %s-compressed file: megascale data (prepare, tokenizer-train) reads "
                        "plain text and JSONL, not compressed files; decompress it first",
                        d->path, z);
    int32_t magic = 0; /* a token shard (an earlier prepare's output in the input directory) */
    if (d->map_len >= sizeof magic) memcpy(&magic, d->map, sizeof magic);
    if (magic == DATA_SHARD_MAGIC || magic == DATA_SHARD_MAGIC_LLAMA3)
        return ms_error(MS_ERR_FORMAT,
                        "%s: a token shard (magic %d), not text: megascale data (prepare, "
                        "tokenizer-train) reads plain text and JSONL; leave the shards out of "
                        "--input (a directory's shards are read as text otherwise)",
                        d->path, (int)magic);
    return MS_OK;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

static const char *json_kind(const cJSON *j) {
    return cJSON_IsNumber(j)   ? "a number"
           : cJSON_IsBool(j)   ? "a boolean"
           : cJSON_IsNull(j)   ? "null"
           : cJSON_IsArray(j)  ? "an array"
           : cJSON_IsObject(j) ? "an object"
           : cJSON_IsString(j) ? "a string"
                               : "not a string";
}

/* A bad line: the error, or with skip_bad a count (and the first reason). */
static ms_status bad_line(data_docs *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ms_status bad_line(data_docs *d, const char *fmt, ...) {
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (!d->skip_bad)
        return ms_error(MS_ERR_FORMAT, "%s:%llu: %s", d->path, (unsigned long long)d->line, why);
    if (d->skipped++ == 0)
        snprintf(d->first_bad, sizeof d->first_bad, "%s:%llu: %s", d->path,
                 (unsigned long long)d->line, why);
    return MS_OK;
}

/* The object's last member named `field` (NULL: none): a key given twice is the last
 * one's, as Python's json and most readers take it (cJSON's lookup gives the first). */
static const cJSON *last_member(const cJSON *o, const char *field) {
    const cJSON *found = NULL;
    for (const cJSON *c = cJSON_IsObject(o) ? o->child : NULL; c; c = c->next)
        if (c->string && !strcmp(c->string, field)) found = c;
    return found;
}

/* Whether the member `field` of the valid JSON object s[0, n), whose parsed
 * string is len bytes long, really holds more: a NUL character (\u0000)
 * ends cJSON's string there, the rest of the text silently lost.  Checked
 * by parsing again with each \u0000 as \u0001 (the same length), only for
 * a line holding one. */
static int nul_cuts_text(const char *s, size_t n, const char *field, size_t len) {
    char *c = NULL;
    int in_str = 0, found = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in_str || s[i] == '"') {
            in_str ^= s[i] == '"';
            continue;
        }
        if (s[i] != '\\') continue;
        if (i + 5 < n && s[i + 1] == 'u' && !memcmp(s + i + 2, "0000", 4)) {
            if (!c && !(c = malloc(n))) return 1; /* no memory: refuse rather than cut */
            if (!found) memcpy(c, s, n);
            found = 1;
            c[i + 5] = '1';
        }
        i++; /* the escaped character */
    }
    if (!found) return 0;
    cJSON *j = cJSON_ParseWithLength(c, n);
    const cJSON *f = last_member(j, field);
    int cut = !cJSON_IsString(f) || strlen(f->valuestring) != len;
    cJSON_Delete(j);
    free(c);
    return cut;
}

/* The value of the \uXXXX escape at s[0, 6) (s[0] is the backslash), or -1. */
static int u_escape(const char *s, size_t room) {
    if (room < 6 || s[0] != '\\' || s[1] != 'u') return -1;
    int v = 0;
    for (int k = 2; k < 6; k++) {
        char c = s[k];
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Whether the JSON text s[0..at) opens more than cJSON's CJSON_NESTING_LIMIT arrays and
 * objects inside each other (valid JSON the parser refuses: said so, not "not valid"). */
static int nested_too_deep(const char *s, size_t at) {
    size_t depth = 0;
    int in_str = 0;
    for (size_t i = 0; i < at; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > CJSON_NESTING_LIMIT) return 1;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return 0;
}

/* A copy of the line s[0, n) with each lone UTF-16 surrogate escape (\ud800 without its
 * \udc00.. pair, or the second half alone) written \ufffd, the replacement character: the
 * same length, so byte positions stay.  JSON allows them and Python's json reads them (web
 * text holds them: a string cut inside a pair); cJSON refuses the line, and tiktoken encodes
 * them as U+FFFD.  NULL when the line holds none (or no memory); *count: how many. */
static char *lone_surrogates_fixed(const char *s, size_t n, size_t *count, size_t *first_at) {
    char *c = NULL;
    int in_str = 0;
    *count = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in_str || s[i] == '"') {
            in_str ^= s[i] == '"';
            continue;
        }
        if (s[i] != '\\') continue;
        int v = u_escape(s + i, n - i);
        if (v >= 0xD800 && v <= 0xDBFF) {
            int lo = u_escape(s + i + 6, n - i - 6);
            if (lo >= 0xDC00 && lo <= 0xDFFF) { /* a pair: one character */
                i += 11;
                continue;
            }
        }
        if (v >= 0xD800 && v <= 0xDFFF) {
            if (!c && !(c = malloc(n))) return NULL;
            if (!*count) memcpy(c, s, n), *first_at = i;
            memcpy(c + i + 2, "fffd", 4);
            (*count)++;
            i += 5;
            continue;
        }
        i++; /* the escaped character */
    }
    return c;
}

/* The next document of the mapped JSONL file into d->json, or *text NULL at
 * the file's end. */
static ms_status next_line(data_docs *d, const char **text, size_t *len) {
    *text = NULL;
    while (d->pos < d->map_len) {
        const char *s = d->map + d->pos;
        size_t rest = d->map_len - d->pos;
        size_t look = rest < DATA_DOCS_MAX_LINE + 1 ? rest : DATA_DOCS_MAX_LINE + 1;
        const char *nl = memchr(s, '\n', look);
        size_t n = nl ? (size_t)(nl - s) : look;
        d->line++;
        if (n > DATA_DOCS_MAX_LINE) {
            MS_TRY(bad_line(d,
                            "a line of more than %zu MiB (a JSONL document is one line of at "
                            "most %zu MiB)",
                            DATA_DOCS_MAX_LINE >> 20, DATA_DOCS_MAX_LINE >> 20));
            nl = memchr(s, '\n', rest); /* skipped: on to its real end */
            n = nl ? (size_t)(nl - s) : rest;
            d->pos += n + (nl != NULL);
            d->pending += n + (nl != NULL);
            continue;
        }
        d->pos += n + (nl != NULL);
        d->pending += n + (nl != NULL);
        if (d->line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) /* a byte-order mark */
            s += 3, n -= 3;
        if (blank(s, n)) continue;
        if (memchr(s, 0, n)) { /* cJSON keeps a raw NUL in a string: the text would end there */
            MS_TRY(bad_line(d, "a NUL byte (at byte %zu of the line; not JSON text: a file "
                               "zeroed by a crash?)",
                            (size_t)((const char *)memchr(s, 0, n) - s) + 1));
            continue;
        }
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
        char *fixed = NULL; /* the line with its lone surrogates as U+FFFD */
        size_t lone = 0, lone_at = 0;
        if (!j && (fixed = lone_surrogates_fixed(s, n, &lone, &lone_at)) != NULL) {
            j = cJSON_ParseWithLengthOpts(fixed, n, &end, 0);
            end = end ? s + (end - fixed) : NULL;
        }
        if (!j || !blank(end, (size_t)(s + n - end))) {
            size_t at = end && end >= s && end <= s + n ? (size_t)(end - s) : 0;
            cJSON_Delete(j);
            free(fixed);
            if (nested_too_deep(s, at + 1 < n ? at + 1 : n))
                MS_TRY(bad_line(d,
                                "arrays and objects nested more than %d deep (at byte %zu of the "
                                "line: the JSON parser's limit)",
                                CJSON_NESTING_LIMIT, at + 1));
            else
                MS_TRY(bad_line(d, "not valid JSON (at byte %zu of the line)", at + 1));
            continue;
        }
        const cJSON *f = last_member(j, d->field);
        /* the text parsed: whether a \u0000 in it cut the member short */
        int cut = f && cJSON_IsString(f) &&
                  nul_cuts_text(fixed ? fixed : s, n, d->field, strlen(f->valuestring));
        free(fixed);
        if (!cJSON_IsObject(j) || !f || !cJSON_IsString(f)) {
            const char *kind = json_kind(f ? f : j);
            ms_status st = !cJSON_IsObject(j) ? bad_line(d, "%s, not a JSON object", kind)
                           : !f ? bad_line(d, "no member \"%s\" (--jsonl-field)", d->field)
                                : bad_line(d, "member \"%s\" is %s, not a string", d->field, kind);
            cJSON_Delete(j);
            MS_TRY(st);
            continue;
        }
        size_t l = strlen(f->valuestring);
        if (cut) {
            cJSON_Delete(j);
            MS_TRY(bad_line(d,
                            "member \"%s\" holds \\u0000 (a NUL character), where the text "
                            "would end: the rest of it would be lost",
                            d->field));
            continue;
        }
        if (l == 0) {
            cJSON_Delete(j);
            continue;
        }
        if (lone && d->surrogates++ == 0) /* said of a document taken, not of one skipped */
            ms_warn("%s:%llu: a lone UTF-16 surrogate escape (\\u%.4s at byte %zu of the line; "
                    "no character), read as U+FFFD as tiktoken encodes it; others are counted "
                    "at the end",
                    d->path, (unsigned long long)d->line, s + lone_at + 2, lone_at + 1);
        d->json = j;
        *text = f->valuestring;
        *len = l;
        return MS_OK;
    }
    return MS_OK;
}

ms_status data_docs_next(data_docs *d, const char **text, size_t *len, uint64_t *consumed) {
    cJSON_Delete(d->json);
    d->json = NULL;
    *text = NULL;
    *len = 0;
    *consumed = 0;
    for (;;) {
        if (d->map && d->jsonl) {
            MS_TRY(next_line(d, text, len));
            if (*text) break;
        }
        MS_TRY(unmap_checked(d)); /* a plain file's document, or a JSONL file read to its end */
        int more;
        MS_TRY(next_file(d, &more));
        if (!more) break;
        if (!d->jsonl) {
            d->pending += d->map_len;
            if (d->map_len == 0) continue;
            *text = d->map;
            *len = d->map_len;
            break;
        }
    }
    *consumed = d->pending;
    d->pending = 0;
    return MS_OK;
}
