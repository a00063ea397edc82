/* prepare.h - text to token shards: `megascale data prepare`.
 *
 * Every input file is one document.  Documents are encoded in order (large
 * ones in blocks cut where the tokenisation cannot change, on all threads)
 * and an end-of-text token follows each document when the tokenizer has one.
 * The first val_fraction of the input bytes go to NAME_val_000000.bin (a
 * document that straddles the boundary is cut at the next line break), the
 * rest to NAME_train_NNNNNN.bin shards of at most shard_tokens tokens.
 * Shards use version 1 (uint16) when every id fits, version 2 (uint32)
 * otherwise.  Each shard is written atomically, so a failure never leaves a
 * half-written shard under its final name.  Shards of NAME already in the
 * directory (NAME_train_*.bin, NAME_val_*.bin: another data set, which the
 * new shards would partly overwrite and partly mix with) are refused before
 * anything is read, unless force: then those the run does not rewrite are
 * removed once every new shard is committed.  Progress (bytes, MB/s, ETA) goes
 * to stderr about once a second.  Not thread-safe (uses its own threads).
 */
#ifndef DATA_PREPARE_H
#define DATA_PREPARE_H

#include <stdint.h>

#include "base/status.h"
#include "data/tokenizer.h"

typedef struct {
    char **inputs; /* files, in order */
    int n_inputs;
    const data_tokenizer *tok; /* NULL: bytes (one token per byte, vocab 256) */
    const char *out_dir;
    const char *name;
    double val_fraction;
    uint64_t shard_tokens;
    int threads;
    int quiet; /* no progress lines */
    int force; /* replace NAME's shards already in out_dir (0: refuse) */
} data_prepare_config;

typedef struct {
    int documents;
    uint64_t bytes, tokens, train_tokens, val_tokens;
    int shards;
    int stale_removed; /* force: old shards of NAME that were not rewritten */
    double seconds;
} data_prepare_stats;

ms_status data_prepare(const data_prepare_config *cfg, data_prepare_stats *stats);

#endif
