/* prepare.h - text to token shards: `megascale data prepare`.
 *
 * Documents come from one or more inputs, each a list of files read by
 * data/docs.h (a plain file is one document, a .jsonl file one document per
 * line).  Documents are encoded on all threads (small ones a batch at a
 * time, data/docbatch.h; large ones in blocks cut where the tokenisation
 * cannot change) and emitted in order, an end-of-text token after each
 * when the tokenizer has one.
 *
 * Several inputs: without weights their documents follow one another (input
 * 1's, then input 2's, ...).  With weights they are blended: the next
 * document always comes from the input whose tokens so far, divided by its
 * weight, are the fewest (ties to the earlier input), so every prefix of the
 * output holds the inputs' tokens in proportion to the weights, to within a
 * document each.  Each input's documents stay in order; nothing is repeated:
 * an input that runs out stops contributing and the others go on, in
 * proportion among themselves, until all are used up.  No randomness: the
 * same inputs give byte-identical shards.
 *
 * Validation split: val_fraction of the input bytes (the files' sizes)
 * marks the split.  NAME_val_NNNNNN.bin (shards of at most shard_tokens, as
 * the training ones) take the first documents of the output in whole, up to
 * the mark: a document that crosses it goes to the
 * side that holds more of its bytes.  A crossing document larger than the
 * whole val share (one big file) is cut instead, in its token stream: val
 * takes its tokens up to the first token boundary at or past the mark, train
 * the rest, so val + train hold exactly the document's own tokens (cutting
 * the text would re-tokenise both sides: "\n\n" would become "\n" "\n").
 * The rest goes to NAME_train_NNNNNN.bin shards of at most shard_tokens.
 *
 * Shards use version 1 (uint16) when every id fits, version 2 (uint32)
 * otherwise.  Each shard is written atomically under a hidden staged name
 * (".NAME_train_000000.bin.staged"); only when the whole run has succeeded
 * do they take their final names, so a failed run leaves out_dir as it was
 * (its staged shards removed, the directories it made for out_dir too).
 * One run at a time writes NAME's shards in out_dir (a lock file,
 * .NAME.prepare.lock, there while it runs); the staged files of a run
 * killed part way are removed by the next.  Shards of NAME already in the
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

#define DATA_PREPARE_MAX_INPUTS 64

typedef struct {
    char **paths; /* its files, in order (borrowed) */
    int n_paths;
    const char *name; /* as the user gave it (--input), for messages */
    double weight;    /* > 0: blend by tokens; 0: no blending (all inputs alike) */
} data_prepare_input;

typedef struct {
    const data_prepare_input *inputs; /* 1 .. DATA_PREPARE_MAX_INPUTS */
    int n_inputs;
    const char *jsonl_field;   /* the JSONL member holding the text (NULL: "text") */
    int jsonl_skip_bad;        /* 1: skip and count bad JSONL lines (0: an error) */
    const data_tokenizer *tok; /* NULL: bytes (one token per byte, vocab 256) */
    const char *out_dir;
    const char *name;
    double val_fraction;
    uint64_t shard_tokens;
    int threads; /* encoding threads (<= 0: all cores) */
    int quiet;   /* no progress lines */
    int force;   /* replace NAME's shards already in out_dir (0: refuse) */
} data_prepare_config;

typedef struct {
    uint64_t documents, tokens, bytes;
    uint64_t skipped;        /* bad JSONL lines skipped */
    char first_skipped[600]; /* the first one's reason */
    uint64_t mixed_tokens;   /* its tokens when the first input ran out */
} data_prepare_input_stats;

typedef struct {
    uint64_t documents;
    uint64_t bytes;      /* of the input files */
    uint64_t text_bytes; /* of the documents (less than bytes for JSONL) */
    uint64_t tokens, train_tokens, val_tokens;
    uint64_t val_documents; /* whole documents in val (a cut one not counted) */
    int val_cut;            /* 1: a document was cut between val and train */
    uint64_t mixed_tokens;  /* output tokens when the first input ran out */
    int first_out;          /* the input that ran out first (-1: none yet) */
    int shards;
    int stale_removed;     /* force: old shards of NAME that were not rewritten */
    int leftovers_removed; /* staged shards of NAME a killed run left in out_dir */
    double seconds;
    data_prepare_input_stats in[DATA_PREPARE_MAX_INPUTS];
} data_prepare_stats;

ms_status data_prepare(const data_prepare_config *cfg, data_prepare_stats *stats);

#endif
