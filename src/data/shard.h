/* shard.h - token shard files in llm.c's format.
 *
 * Layout: 256 x int32 little-endian header (header[0] = magic 20240520,
 * header[1] = version, header[2] = token count), then the tokens: uint16 for
 * version 1, uint32 for version 2 (vocabularies above 65,535).
 * data_shard_open memory-maps the file and checks magic, version and that the
 * file size is exactly 1024 + count * token size; every failure names the
 * file and what is wrong.  The writer streams tokens into a temp file and
 * commits it atomically, so a half-written shard never appears under its
 * final name.  Not thread-safe per object; distinct shards are independent.
 */
#ifndef DATA_SHARD_H
#define DATA_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "base/fileio.h"
#include "base/status.h"

#define DATA_SHARD_MAGIC 20240520
#define DATA_SHARD_MAGIC_LLAMA3 20240801 /* llm.c's llama-3 shards: version 7, uint32 tokens */
#define DATA_SHARD_VERSION_LLAMA3 7
#define DATA_SHARD_HEADER_INTS 256

typedef struct {
    char path[4096];
    uint32_t magic;  /* DATA_SHARD_MAGIC or DATA_SHARD_MAGIC_LLAMA3 */
    int version;     /* GPT-2 magic: 1 (uint16 tokens) or 2 (uint32); llama-3: 7 */
    int token_bytes; /* 2 or 4 */
    uint64_t n_tokens;
    const void *map; /* whole file */
    size_t map_len;
    const uint8_t *tokens; /* map + 1024 */
    uint64_t dev, ino;     /* the file mapped: data_shard_read checks it is still that file */
    int64_t mtime_ns;      /* ... and that nothing wrote to it since (a rewrite in place) */
} data_shard;

/* What the header says the shard is, in words with its article: "an llm.c
 * llama-3", "a GPT-2 uint16" or "a GPT-2 uint32". */
const char *data_shard_kind(const data_shard *s);
ms_status data_shard_open(data_shard *s, const char *path);
void data_shard_close(data_shard *s);
/* Token i (i < n_tokens). */
static inline uint32_t data_shard_token(const data_shard *s, uint64_t i) {
    return s->token_bytes == 2 ? ((const uint16_t *)s->tokens)[i]
                               : ((const uint32_t *)s->tokens)[i];
}
/* Copy n tokens from position pos into dst as int32, checking each against
 * vocab (MS_ERR_RANGE naming the file and the position if >= vocab).  It
 * first checks that the file on disk is still the one mapped, at its size
 * and modification time: a shard truncated, replaced or rewritten in place
 * under a running trainer is an MS_ERR_IO naming it, not a SIGBUS on the
 * next read of the map (nor other tokens read silently). */
ms_status data_shard_read(const data_shard *s, uint64_t pos, size_t n, int32_t *dst, int vocab);

typedef struct {
    ms_atomic_file af;
    int version;
    uint64_t n_tokens;
} data_shard_writer;

/* version 1 or 2 */
ms_status data_shard_writer_open(data_shard_writer *w, const char *path, int version);
ms_status data_shard_writer_put(data_shard_writer *w, const uint32_t *tok, size_t n);
/* Rewrites the header with the final count, then commits atomically. */
ms_status data_shard_writer_commit(data_shard_writer *w);
void data_shard_writer_abort(data_shard_writer *w);

#endif
