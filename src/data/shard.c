/* shard.c - llm.c token shards (see shard.h): validated memory-mapped
 * reader, and a streaming writer that commits atomically.
 *
 * Header: 256 little-endian int32; [0] magic 20240520, [1] version (1: uint16
 * tokens, 2: uint32 tokens), [2] token count; the rest zero.  llm.c's
 * llama-3 shards (magic 20240801, version 7, uint32 tokens) are read too.
 * Tokens are read
 * in place from the map, which assumes a little-endian host (checked at
 * compile time).
 */
#include "data/shard.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "token shards assume a little-endian host");

#define SHARD_HEADER_BYTES (DATA_SHARD_HEADER_INTS * 4)
#define SHARD_MAX_TOKENS ((uint64_t)INT32_MAX) /* header[2] is an int32 */

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Validate the mapped file in s (map, map_len, path set): magic, version,
 * exact size; fills version, n_tokens and tokens. */
static ms_status shard_validate(data_shard *s) {
    const uint8_t *p = s->map;
    uint32_t magic, version, count;
    uint64_t want;
    if (s->map_len < SHARD_HEADER_BYTES)
        return ms_error(MS_ERR_FORMAT,
                        "%s: truncated: file has %zu bytes, less than the %d-byte "
                        "header: not a token shard",
                        s->path, s->map_len, SHARD_HEADER_BYTES);
    magic = le32(p);
    version = le32(p + 4);
    count = le32(p + 8);
    if (magic != DATA_SHARD_MAGIC && magic != DATA_SHARD_MAGIC_LLAMA3)
        return ms_error(MS_ERR_FORMAT,
                        "%s: bad magic %" PRId32 " (expected %d, or %d for llm.c's llama-3 "
                        "shards): not a token shard",
                        s->path, (int32_t)magic, DATA_SHARD_MAGIC, DATA_SHARD_MAGIC_LLAMA3);
    if (magic == DATA_SHARD_MAGIC && version != 1 && version != 2)
        return ms_error(MS_ERR_FORMAT, "%s: unsupported version %" PRId32 " (expected 1 or 2)",
                        s->path, (int32_t)version);
    if (magic == DATA_SHARD_MAGIC_LLAMA3 && version != DATA_SHARD_VERSION_LLAMA3)
        return ms_error(MS_ERR_FORMAT,
                        "%s: unsupported version %" PRId32 " of a llama-3 shard (expected %d)",
                        s->path, (int32_t)version, DATA_SHARD_VERSION_LLAMA3);
    int bytes = magic == DATA_SHARD_MAGIC && version == 1 ? 2 : 4;
    if (count > SHARD_MAX_TOKENS)
        return ms_error(MS_ERR_FORMAT, "%s: bad token count %" PRId32 " in header", s->path,
                        (int32_t)count);
    want = SHARD_HEADER_BYTES + (uint64_t)count * (uint64_t)bytes;
    if (s->map_len < want)
        return ms_error(MS_ERR_FORMAT,
                        "%s: truncated: header says %" PRIu32 " tokens (%" PRIu64
                        " bytes) but file has %zu bytes",
                        s->path, count, want, s->map_len);
    if (s->map_len > want)
        return ms_error(MS_ERR_FORMAT,
                        "%s: size mismatch: header says %" PRIu32 " tokens (%" PRIu64
                        " bytes) but file has %zu bytes (trailing data)",
                        s->path, count, want, s->map_len);
    s->magic = magic;
    s->version = (int)version;
    s->token_bytes = bytes;
    s->n_tokens = count;
    s->tokens = p + SHARD_HEADER_BYTES;
    return MS_OK;
}

ms_status data_shard_open(data_shard *s, const char *path) {
    ms_status rc;
    memset(s, 0, sizeof *s);
    if (strlen(path) >= sizeof s->path)
        return ms_error(MS_ERR_ARG, "%.64s...: path longer than %zu bytes", path,
                        sizeof s->path - 1);
    strcpy(s->path, path);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) /* not "not a regular file" (exit 4) */
        return ms_error(MS_ERR_ARG,
                        "%s is a directory, not a token shard (give its shards, e.g. '%s/*.bin')",
                        path, path);
    /* the identity the reads check against is the mapped file's: the same
     * before and after the map, or the file was replaced in between (its
     * identity would be the new one's over the old one's tokens) */
    for (int tries = 0;; tries++) {
        struct stat before;
        int had = stat(path, &before) == 0;
        rc = ms_file_map(path, &s->map, &s->map_len);
        if (rc == MS_OK && stat(path, &sb) != 0)
            rc = ms_error(MS_ERR_IO, "%s: stat: %s", path, strerror(errno));
        if (rc != MS_OK ||
            (had && before.st_dev == sb.st_dev && before.st_ino == sb.st_ino &&
             before.st_mtim.tv_sec == sb.st_mtim.tv_sec &&
             before.st_mtim.tv_nsec == sb.st_mtim.tv_nsec && (uint64_t)sb.st_size == s->map_len))
            break;
        ms_file_unmap(s->map, s->map_len);
        s->map = NULL, s->map_len = 0;
        if (tries == 2) {
            rc = ms_error(MS_ERR_IO, "%s: the file changed on disk while it was opened (3 tries)",
                          path);
            break;
        }
    }
    if (rc == MS_OK) {
        s->dev = (uint64_t)sb.st_dev, s->ino = (uint64_t)sb.st_ino;
        s->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
    }
    if (rc == MS_OK) rc = shard_validate(s);
    if (rc != MS_OK) data_shard_close(s);
    return rc;
}

const char *data_shard_kind(const data_shard *s) {
    return s->magic == DATA_SHARD_MAGIC_LLAMA3 ? "an llm.c llama-3"
           : s->version == 2                   ? "a GPT-2 uint32"
                                               : "a GPT-2 uint16";
}

void data_shard_close(data_shard *s) {
    ms_file_unmap(s->map, s->map_len);
    s->map = NULL;
    s->map_len = 0;
    s->tokens = NULL;
    s->n_tokens = 0;
}

/* dst (n) int32.  MS_ERR_RANGE if [pos, pos+n) is not inside the shard or a
 * token is >= vocab; dst is then partly written. */
ms_status data_shard_read(const data_shard *s, uint64_t pos, size_t n, int32_t *dst, int vocab) {
    if (vocab <= 0) return ms_error(MS_ERR_ARG, "%s: vocab size %d must be > 0", s->path, vocab);
    if (pos > s->n_tokens || n > s->n_tokens - pos)
        return ms_error(MS_ERR_RANGE,
                        "%s: read of %zu tokens at position %" PRIu64 " runs past the end (%" PRIu64
                        " tokens)",
                        s->path, n, pos, s->n_tokens);
    struct stat sb; /* a truncated map page is a SIGBUS: look before reading */
    const char *changed = NULL;
    if (n > 0 && stat(s->path, &sb) != 0)
        changed = strerror(errno);
    else if (n > 0 && ((uint64_t)sb.st_dev != s->dev || (uint64_t)sb.st_ino != s->ino))
        changed = "another file now has its name";
    else if (n > 0 && (uint64_t)sb.st_size != s->map_len)
        changed = "its size changed";
    else if (n > 0 && (int64_t)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec != s->mtime_ns)
        changed = "it was written to: rewritten in place"; /* same file, same size */
    if (changed)
        return ms_error(MS_ERR_IO,
                        "%s: the shard changed on disk while the run read it (%s; it had %zu "
                        "bytes): was it rewritten or truncated? The run stops here; its "
                        "checkpoints are intact",
                        s->path, changed, s->map_len);
    for (size_t i = 0; i < n; i++) {
        uint32_t t = data_shard_token(s, pos + i);
        if (t >= (uint32_t)vocab)
            return ms_error(MS_ERR_RANGE,
                            "%s: token %" PRIu32 " at position %" PRIu64 " is >= vocab size %d",
                            s->path, t, pos + i, vocab);
        dst[i] = (int32_t)t;
    }
    return MS_OK;
}

/* ---- writer ----------------------------------------------------------- */

ms_status data_shard_writer_open(data_shard_writer *w, const char *path, int version) {
    static const uint8_t zeros[SHARD_HEADER_BYTES];
    ms_status rc;
    memset(w, 0, sizeof *w);
    if (version != 1 && version != 2)
        return ms_error(MS_ERR_ARG, "%s: shard version %d (expected 1 or 2)", path, version);
    w->version = version;
    rc = ms_atomic_open(&w->af, path);
    if (rc == MS_OK) rc = ms_atomic_write(&w->af, zeros, sizeof zeros); /* placeholder header */
    return rc;
}

/* tok (n).  Version 1 rejects ids > 65535 with MS_ERR_RANGE before writing
 * anything of this call. */
ms_status data_shard_writer_put(data_shard_writer *w, const uint32_t *tok, size_t n) {
    uint16_t buf[4096];
    if (n > SHARD_MAX_TOKENS - w->n_tokens)
        return ms_error(MS_ERR_RANGE, "%s: more than %" PRIu64 " tokens in one shard", w->af.path,
                        SHARD_MAX_TOKENS);
    if (w->version == 2) {
        MS_TRY(ms_atomic_write(&w->af, tok, n * sizeof *tok));
        w->n_tokens += n;
        return MS_OK;
    }
    for (size_t i = 0; i < n; i++)
        if (tok[i] > UINT16_MAX)
            return ms_error(MS_ERR_RANGE,
                            "%s: token %" PRIu32 " at position %" PRIu64
                            " does not fit a version 1 (uint16) shard; use version 2",
                            w->af.path, tok[i], w->n_tokens + i);
    for (size_t i = 0; i < n;) {
        size_t m = n - i < 4096 ? n - i : 4096;
        for (size_t k = 0; k < m; k++)
            buf[k] = (uint16_t)tok[i + k];
        MS_TRY(ms_atomic_write(&w->af, buf, m * sizeof *buf));
        w->n_tokens += m;
        i += m;
    }
    return MS_OK;
}

/* On failure the temp file is removed here already, so a caller that does
 * not call data_shard_writer_abort after a failed commit leaks nothing. */
ms_status data_shard_writer_commit(data_shard_writer *w) {
    ms_status rc = MS_OK;
    uint8_t hdr[12];
    uint32_t v[3] = {DATA_SHARD_MAGIC, (uint32_t)w->version, (uint32_t)w->n_tokens};
    if (!w->af.f) return ms_error(MS_ERR_ARG, "%s: commit of a closed shard writer", w->af.path);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            hdr[4 * i + k] = (uint8_t)(v[i] >> (8 * k));
    if (fseeko(w->af.f, 0, SEEK_SET) != 0)
        rc = ms_error(MS_ERR_IO, "%s: seek: %s", w->af.tmp, strerror(errno));
    if (rc == MS_OK) rc = ms_atomic_write(&w->af, hdr, sizeof hdr);
    if (rc == MS_OK) rc = ms_atomic_commit(&w->af);
    if (rc != MS_OK) ms_atomic_abort(&w->af);
    return rc;
}

void data_shard_writer_abort(data_shard_writer *w) {
    ms_atomic_abort(&w->af);
}
