/* tokenizer.c - tokenizer tables (byte string -> id, pair -> merged id), the
 * versioned tokenizer file (load with full validation, atomic save) and the
 * accessors.  Encoding lives in tokenizer_encode.c, training in
 * tokenizer_train.c.  See tokenizer.h for the format. */
#include "data/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/crc32c.h"
#include "base/fileio.h"

#ifndef MS_DATA_DIR
#define MS_DATA_DIR "data"
#endif

#define TOK_MAGIC "MSTOKBPE"
#define TOK_VERSION 1
#define TOK_HEADER 64

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) {
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

ms_status tok_compile(const char *src, const char *pattern, pcre2_code **re, int *jit) {
    int err;
    PCRE2_SIZE erroff;
    *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                        &erroff, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ms_error(MS_ERR_FORMAT, "%s: bad pre-tokenisation pattern at offset %zu: %s", src,
                        (size_t)erroff, (const char *)msg);
    }
    /* Without JIT (an unsupported CPU) the interpreter is used instead. */
    *jit = pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE) == 0;
    return MS_OK;
}

/* Fill bmap, byte_id and the pair table; checks the token table. */
static ms_status build_tables(data_tokenizer *t, const char *src) {
    uint32_t nt = t->n_tokens;
    t->bmask = pow2_at_least(2 * (uint64_t)nt) - 1;
    t->bmap = calloc(t->bmask + 1, sizeof *t->bmap);
    if (!t->bmap) return ms_error(MS_ERR_NOMEM, "%s: out of memory for %u tokens", src, nt);
    uint64_t n_pairs = 0;
    for (uint32_t id = 0; id < nt; id++) {
        const uint8_t *p = t->bytes + t->off[id];
        uint64_t n = t->off[id + 1] - t->off[id];
        if (n == 0) return ms_error(MS_ERR_FORMAT, "%s: token %u is empty", src, id);
        uint32_t dup = tok_lookup(t, p, n);
        if (dup != TOK_NONE)
            return ms_error(MS_ERR_FORMAT, "%s: token %u has the same bytes as token %u", src, id,
                            dup);
        uint64_t i = tok_hash(p, n) & t->bmask;
        while (t->bmap[i])
            i = (i + 1) & t->bmask;
        t->bmap[i] = id + 1;
        n_pairs += n - 1;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_id[b] = tok_lookup(t, &c, 1);
        if (t->byte_id[b] == TOK_NONE)
            return ms_error(MS_ERR_FORMAT, "%s: byte 0x%02x has no token (not byte-level)", src, b);
    }
    /* Every split of a token into two tokens is a pair that merges into it. */
    t->pmask = pow2_at_least(2 * n_pairs) - 1;
    t->pkey = malloc((t->pmask + 1) * sizeof *t->pkey);
    t->pval = malloc((t->pmask + 1) * sizeof *t->pval);
    if (!t->pkey || !t->pval)
        return ms_error(MS_ERR_NOMEM, "%s: out of memory for the pair table", src);
    memset(t->pkey, 0xff, (t->pmask + 1) * sizeof *t->pkey);
    for (uint32_t id = 0; id < nt; id++) {
        const uint8_t *p = t->bytes + t->off[id];
        uint64_t n = t->off[id + 1] - t->off[id];
        for (uint64_t k = 1; k < n; k++) {
            uint32_t a = tok_lookup(t, p, k), b = tok_lookup(t, p + k, n - k);
            if (a == TOK_NONE || b == TOK_NONE) continue;
            uint64_t key = (uint64_t)a << 32 | b;
            uint64_t i = tok_pair_hash(key) & t->pmask;
            while (t->pkey[i] != UINT64_MAX)
                i = (i + 1) & t->pmask;
            t->pkey[i] = key;
            t->pval[i] = id;
        }
    }
    t->eot = -1;
    for (uint32_t s = 0; s < t->n_special; s++) {
        uint32_t id = nt + s;
        uint64_t n = t->off[id + 1] - t->off[id];
        if (n == 0) return ms_error(MS_ERR_FORMAT, "%s: special token %u is empty", src, id);
        for (uint32_t o = nt; o < id; o++)
            if (t->off[o + 1] - t->off[o] == n &&
                memcmp(t->bytes + t->off[o], t->bytes + t->off[id], n) == 0)
                return ms_error(MS_ERR_FORMAT, "%s: special tokens %u and %u are the same", src, o,
                                id);
        if (n == strlen(TOK_EOT_TEXT) && memcmp(t->bytes + t->off[id], TOK_EOT_TEXT, n) == 0)
            t->eot = (int)id;
    }
    return MS_OK;
}

ms_status tok_create(const char *src, char *name, char *pattern, uint32_t n_tokens,
                     uint32_t n_special, uint64_t *off, uint8_t *bytes, data_tokenizer **out) {
    ms_status rc;
    data_tokenizer *t = calloc(1, sizeof *t);
    *out = NULL;
    if (!t) {
        free(name);
        free(pattern);
        free(off);
        free(bytes);
        return ms_error(MS_ERR_NOMEM, "%s: out of memory", src);
    }
    t->name = name;
    t->pattern = pattern;
    t->n_tokens = n_tokens;
    t->n_special = n_special;
    t->off = off;
    t->bytes = bytes;
    t->gpt2 = !strcmp(pattern, DATA_TOK_GPT2_PATTERN);
    if (n_tokens < 256 || n_tokens > TOK_MAX_TOKENS || n_special > TOK_MAX_SPECIAL) {
        rc = ms_error(MS_ERR_FORMAT, "%s: %u tokens + %u special is out of range", src, n_tokens,
                      n_special);
        goto fail;
    }
    if (!t->gpt2 && (rc = tok_compile(src, pattern, &t->re, &t->jit)) != MS_OK) goto fail;
    if ((rc = build_tables(t, src)) != MS_OK) goto fail;
    *out = t;
    return MS_OK;
fail:
    data_tok_free(t);
    return rc;
}

void data_tok_free(data_tokenizer *t) {
    if (!t) return;
    pcre2_code_free(t->re);
    free(t->name);
    free(t->pattern);
    free(t->off);
    free(t->bytes);
    free(t->bmap);
    free(t->pkey);
    free(t->pval);
    free(t);
}

int data_tok_vocab_size(const data_tokenizer *t) {
    return (int)(t->n_tokens + t->n_special);
}
int data_tok_eot(const data_tokenizer *t) {
    return t->eot;
}
const char *data_tok_name(const data_tokenizer *t) {
    return t->name;
}
size_t data_tok_token_len(const data_tokenizer *t, uint32_t id) {
    return id < t->n_tokens + t->n_special ? (size_t)(t->off[id + 1] - t->off[id]) : 0;
}

static char *dup_n(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

/* Parse and validate a whole tokenizer file held in buf[0, len). */
static ms_status parse(const char *path, const uint8_t *buf, size_t len, data_tokenizer **out) {
    char *name = NULL, *pattern = NULL;
    uint64_t *off = NULL;
    uint8_t *bytes = NULL;
    ms_status rc;
    if (len < TOK_HEADER)
        return ms_error(MS_ERR_FORMAT, "%s: truncated: %zu bytes, the header alone is %d", path,
                        len, TOK_HEADER);
    if (memcmp(buf, TOK_MAGIC, 8) != 0)
        return ms_error(MS_ERR_FORMAT, "%s: not a tokenizer file (bad magic)", path);
    uint32_t version = rd32(buf + 8), hsize = rd32(buf + 12);
    if (version != TOK_VERSION)
        return ms_error(MS_ERR_FORMAT, "%s: tokenizer format version %u (this build reads %d)",
                        path, version, TOK_VERSION);
    if (ms_crc32c(0, buf, 60) != rd32(buf + 60))
        return ms_error(MS_ERR_FORMAT, "%s: header checksum mismatch (corrupt header)", path);
    if (hsize != TOK_HEADER)
        return ms_error(MS_ERR_FORMAT, "%s: header size %u, expected %d", path, hsize, TOK_HEADER);
    uint32_t nt = rd32(buf + 16), ns = rd32(buf + 20), name_len = rd32(buf + 24),
             pat_len = rd32(buf + 28);
    uint64_t tok_bytes = rd64(buf + 32), spec_bytes = rd64(buf + 40), fsize = rd64(buf + 48);
    if (fsize != len)
        return ms_error(MS_ERR_FORMAT, "%s: %s: header says %llu bytes, file has %zu", path,
                        fsize > len ? "truncated" : "trailing bytes", (unsigned long long)fsize,
                        len);
    if (nt < 256 || nt > TOK_MAX_TOKENS || ns > TOK_MAX_SPECIAL || name_len > 255 || pat_len == 0 ||
        pat_len > 65536 || tok_bytes > len || spec_bytes > len)
        return ms_error(MS_ERR_FORMAT,
                        "%s: bad sizes (%u tokens, %u special, name %u, pattern %u bytes)", path,
                        nt, ns, name_len, pat_len);
    uint64_t need =
        (uint64_t)TOK_HEADER + name_len + pat_len + 2ull * nt + tok_bytes + 8ull * ns + spec_bytes;
    if (need != len)
        return ms_error(MS_ERR_FORMAT, "%s: sections add up to %llu bytes, file has %zu", path,
                        (unsigned long long)need, len);
    if (ms_crc32c(0, buf + TOK_HEADER, len - TOK_HEADER) != rd32(buf + 56))
        return ms_error(MS_ERR_FORMAT, "%s: body checksum mismatch (corrupt file)", path);

    const uint8_t *p = buf + TOK_HEADER;
    name = dup_n(p, name_len);
    pattern = dup_n(p + name_len, pat_len);
    off = malloc(((uint64_t)nt + ns + 1) * sizeof *off);
    bytes = malloc(tok_bytes + spec_bytes + 1);
    if (!name || !pattern || !off || !bytes) {
        rc = ms_error(MS_ERR_NOMEM, "%s: out of memory for %u tokens", path, nt);
        goto fail;
    }
    if (memchr(name, 0, name_len)) { /* it loaded cut at the NUL, and saved as another name */
        rc = ms_error(MS_ERR_FORMAT, "%s: the name contains a NUL byte", path);
        goto fail;
    }
    if (memchr(pattern, 0, pat_len)) {
        rc = ms_error(MS_ERR_FORMAT, "%s: the pattern contains a NUL byte", path);
        goto fail;
    }
    p += name_len + pat_len;
    const uint8_t *lens = p, *tb = p + 2ull * nt, *spec = tb + tok_bytes, *sb = spec + 8ull * ns;
    uint64_t o = 0;
    for (uint32_t i = 0; i < nt; i++) {
        off[i] = o;
        o += (uint64_t)lens[2 * i] | (uint64_t)lens[2 * i + 1] << 8;
    }
    if (o != tok_bytes) {
        rc = ms_error(MS_ERR_FORMAT, "%s: token lengths add up to %llu bytes, header says %llu",
                      path, (unsigned long long)o, (unsigned long long)tok_bytes);
        goto fail;
    }
    memcpy(bytes, tb, tok_bytes);
    /* Specials may be stored in any order; their ids must be exactly nt..nt+ns-1.
     * slot[id - nt] = index of that special in the file. */
    {
        uint32_t *slot = malloc((ns + 1) * sizeof *slot);
        uint64_t *src_off = malloc((ns + 1) * sizeof *src_off), so = 0;
        if (!slot || !src_off) {
            free(slot);
            free(src_off);
            rc = ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        for (uint32_t s = 0; s < ns; s++)
            slot[s] = UINT32_MAX;
        rc = MS_OK;
        for (uint32_t s = 0; s < ns && rc == MS_OK; s++) {
            uint32_t id = rd32(spec + 8ull * s);
            src_off[s] = so;
            so += rd32(spec + 8ull * s + 4);
            if (id < nt || id - nt >= ns || slot[id - nt] != UINT32_MAX)
                rc = ms_error(MS_ERR_FORMAT,
                              "%s: special token id %u is not one of %u..%u or appears twice", path,
                              id, nt, nt + ns - 1);
            else
                slot[id - nt] = s;
        }
        if (rc == MS_OK && so != spec_bytes)
            rc = ms_error(MS_ERR_FORMAT,
                          "%s: special token lengths add up to %llu bytes, header says %llu", path,
                          (unsigned long long)so, (unsigned long long)spec_bytes);
        o = tok_bytes;
        for (uint32_t k = 0; k < ns && rc == MS_OK; k++) {
            uint32_t s = slot[k], n = rd32(spec + 8ull * s + 4);
            off[nt + k] = o;
            memcpy(bytes + o, sb + src_off[s], n);
            o += n;
        }
        free(slot);
        free(src_off);
        if (rc != MS_OK) goto fail;
    }
    off[nt + ns] = o;
    return tok_create(path, name, pattern, nt, ns, off, bytes, out);
fail:
    free(name);
    free(pattern);
    free(off);
    free(bytes);
    return rc;
}

ms_status data_tok_load(data_tokenizer **out, const char *name_or_path, const char *data_dir) {
    char path[4096];
    char *buf = NULL;
    size_t len;
    *out = NULL;
    if (strcmp(name_or_path, "gpt2") == 0) {
        snprintf(path, sizeof path, "%s/gpt2.tok", data_dir && *data_dir ? data_dir : MS_DATA_DIR);
    } else {
        snprintf(path, sizeof path, "%s", name_or_path);
    }
    MS_TRY(ms_file_read_all(path, &buf, &len));
    ms_status rc = parse(path, (const uint8_t *)buf, len, out);
    free(buf);
    return rc;
}

ms_status data_tok_save(const data_tokenizer *t, const char *path) {
    uint32_t nt = t->n_tokens, ns = t->n_special;
    size_t name_len = strlen(t->name), pat_len = strlen(t->pattern);
    uint64_t tok_bytes = t->off[nt], spec_bytes = t->off[nt + ns] - t->off[nt];
    uint64_t len = TOK_HEADER + name_len + pat_len + 2ull * nt + tok_bytes + 8ull * ns + spec_bytes;
    if (name_len > 255) return ms_error(MS_ERR_ARG, "%s: tokenizer name is too long", path);
    uint8_t *buf = malloc(len), *p;
    if (!buf)
        return ms_error(MS_ERR_NOMEM, "%s: out of memory for %llu bytes", path,
                        (unsigned long long)len);
    memcpy(buf, TOK_MAGIC, 8);
    wr32(buf + 8, TOK_VERSION);
    wr32(buf + 12, TOK_HEADER);
    wr32(buf + 16, nt);
    wr32(buf + 20, ns);
    wr32(buf + 24, (uint32_t)name_len);
    wr32(buf + 28, (uint32_t)pat_len);
    wr64(buf + 32, tok_bytes);
    wr64(buf + 40, spec_bytes);
    wr64(buf + 48, len);
    p = buf + TOK_HEADER;
    memcpy(p, t->name, name_len);
    memcpy(p + name_len, t->pattern, pat_len);
    p += name_len + pat_len;
    for (uint32_t i = 0; i < nt; i++) {
        uint64_t n = t->off[i + 1] - t->off[i];
        MS_CHECK(n <= 65535);
        p[0] = (uint8_t)n;
        p[1] = (uint8_t)(n >> 8);
        p += 2;
    }
    memcpy(p, t->bytes, tok_bytes);
    p += tok_bytes;
    for (uint32_t s = 0; s < ns; s++, p += 8) {
        wr32(p, nt + s);
        wr32(p + 4, (uint32_t)(t->off[nt + s + 1] - t->off[nt + s]));
    }
    memcpy(p, t->bytes + tok_bytes, spec_bytes);
    wr32(buf + 56, ms_crc32c(0, buf + TOK_HEADER, len - TOK_HEADER));
    wr32(buf + 60, ms_crc32c(0, buf, 60));
    ms_status rc = ms_file_write_atomic(path, buf, len);
    free(buf);
    return rc;
}
