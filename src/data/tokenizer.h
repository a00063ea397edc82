/* tokenizer.h - byte-level BPE tokenizer: GPT-2's vocabulary (imported from
 * js-tiktoken's ranks and shipped as data/gpt2.tok), training of new
 * vocabularies, encode (serial and parallel) and decode.
 *
 * Callers: `megascale data` (text -> token shards, tokenizer training),
 * `megascale sample` (decode), tests and bench/tokenize.
 *
 * Model (tiktoken's): a vocabulary is N ordinary tokens, each a distinct byte
 * string whose id is also its merge rank (lower merges first), of which the
 * 256 single bytes are always part, plus special tokens with ids N, N+1, ...
 * (GPT-2: 50,256 ordinary tokens, <|endoftext|> = 50256).  Encoding first
 * splits the text into pieces with the vocabulary's pre-tokenisation regex
 * (PCRE2, UTF + UCP, JIT), then runs BPE on each piece: repeatedly merge the
 * adjacent pair whose concatenation is the token of lowest rank (leftmost on
 * a tie) until no adjacent pair forms a token.
 *
 * Invalid UTF-8: the text is cut into maximal valid UTF-8 runs (RFC 3629: no
 * overlong forms, surrogates or code points above U+10FFFF) and single
 * invalid bytes.  The regex runs over each valid run on its own (the run's end
 * acts as the end of the text, e.g. for GPT-2's `\s+(?!\S)`); each invalid
 * byte is a piece of its own, encoded as its byte token.  Text between regex
 * matches (none for GPT-2's pattern, which matches every character) is
 * encoded as a piece too.  So decode(encode(x)) == x for any bytes x, and on
 * valid UTF-8 the ids are tiktoken's.  (js-tiktoken uses JavaScript's `\s`,
 * which differs from Unicode White_Space - what PCRE2 and tiktoken's Rust
 * core use - in U+0085 and U+FEFF only; we follow Unicode.)
 *
 * Thread safety: a loaded tokenizer is immutable; encode, decode and the
 * accessors may be called from any number of threads at once.  load/train
 * return a new object owned by the caller (data_tok_free); encode/decode
 * return buffers owned by the caller (free()).
 *
 * File format (version 1, little-endian; every field is checked on load, and
 * any inconsistency is MS_ERR_FORMAT naming the file and the problem):
 *   0  char[8] magic "MSTOKBPE"
 *   8  u32 version (1)           12 u32 header size (64)
 *  16  u32 n_tokens (ordinary)   20 u32 n_special
 *  24  u32 name_len              28 u32 pattern_len
 *  32  u64 token_bytes           40 u64 special_bytes
 *  48  u64 file_size (must equal the file's real size)
 *  56  u32 CRC32C of bytes [64, file_size)
 *  60  u32 CRC32C of bytes [0, 60)
 *  64  name[name_len], pattern[pattern_len] (UTF-8, no NUL),
 *      n_tokens x u16 token length, the token bytes (token_bytes in all,
 *      in id order), n_special x (u32 id, u32 length), the special bytes.
 * Ordinary tokens must be distinct, non-empty and include all 256 bytes;
 * special ids must be exactly n_tokens .. n_tokens+n_special-1.
 */
#ifndef DATA_TOKENIZER_H
#define DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct data_tokenizer data_tokenizer;

/* GPT-2's pre-tokenisation pattern, used by data_tok_train. */
#define DATA_TOK_GPT2_PATTERN                                                                      \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* Load a tokenizer.  "gpt2" is the shipped GPT-2 vocabulary, read from
 * DATA_DIR/gpt2.tok, where DATA_DIR is data_dir (megascale's --data-dir, env
 * MS_DATA_DIR) or, when that is NULL or "", the repository's data/
 * directory compiled in (the MS_DATA_DIR macro); anything else is the path
 * of a tokenizer file.  *out is the caller's (data_tok_free). */
ms_status data_tok_load(data_tokenizer **out, const char *name_or_path, const char *data_dir);

/* Write t to path atomically (temp file, fsync, rename). */
ms_status data_tok_save(const data_tokenizer *t, const char *path);

void data_tok_free(data_tokenizer *t);

/* Number of ids (ordinary + special). */
int data_tok_vocab_size(const data_tokenizer *t);
/* Id of <|endoftext|>, or -1 if the vocabulary has none. */
int data_tok_eot(const data_tokenizer *t);
/* The vocabulary's name ("gpt2", "bpe4096", ...); owned by t. */
const char *data_tok_name(const data_tokenizer *t);
/* Bytes that id decodes to (a special token: its text); 0 for an id >= the
 * vocabulary size.  Lets a caller cut a token stream at a byte offset. */
size_t data_tok_token_len(const data_tokenizer *t, uint32_t id);

/* Ordinary encoding of text[0, len) (any bytes; special-token text is encoded
 * as ordinary text, like tiktoken's encode_ordinary).  Ids are appended to
 * the growable buffer (*ids, *n, *cap): *ids may be NULL with *cap 0; it is
 * realloc'd as needed and stays the caller's, also on failure (then *n is
 * unchanged). */
ms_status data_tok_encode(const data_tokenizer *t, const char *text, size_t len, uint32_t **ids,
                          size_t *n, size_t *cap);

/* Same ids as data_tok_encode, computed by `threads` threads (OpenMP; <= 0:
 * omp_get_max_threads(), all cores unless OMP_NUM_THREADS says less) on
 * chunks of about 1 MB, cut at data_tok_next_cut's places.  Text without
 * such places (and any text, for a tokenizer whose pattern is not GPT-2's)
 * is encoded in fewer, larger chunks (one). */
ms_status data_tok_encode_parallel(const data_tokenizer *t, const char *text, size_t len,
                                   int threads, uint32_t **ids, size_t *n, size_t *cap);

/* Bytes of ids[0, n) into a malloc'd buffer (*out, *len; a NUL follows, not
 * counted).  Special ids decode to their text.  An id >= vocab size is
 * MS_ERR_RANGE naming the id and its position. */
/* The first place i at or after byte offset `from` where text[0, len) can
 * be cut without changing its ids: encoding text[0, i) and text[i, len)
 * apart gives the ids of the whole.  len when there is none.  For GPT-2's
 * pattern (the shipped and the trained tokenizers) it is just after a '\n'
 * that follows a printable non-space ASCII byte (0x21-0x7e) and precedes
 * another one: there the regex ends a piece at the '\n' and starts one
 * after it, no piece spans the cut and no look-ahead crosses it.  A
 * tokenizer file with another pattern may match across a '\n' (`[^ ]+| +`),
 * so it has no such place (len).  t NULL stands for one token per byte:
 * every place is one (from, or len). */
size_t data_tok_next_cut(const data_tokenizer *t, const char *text, size_t len, size_t from);

ms_status data_tok_decode(const data_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                          size_t *len);

/* Learn a byte-level BPE vocabulary of vocab_size ids from documents (GPT-2's
 * pre-tokenisation of each document alone, so that no piece spans two; pair
 * counts over the unique pieces, updated incrementally): ids 0-255 are the
 * bytes, then one token per merge (the most frequent adjacent pair, ties to
 * the lower pair of ids), then <|endoftext|> as the last id.  The documents
 * are text's bytes [ends[i-1], ends[i]) (ends[-1] = 0; ends[n_docs-1] is
 * text's length).  vocab_size must be >= 257; a corpus with fewer possible
 * merges gives a smaller vocabulary.  progress (may be NULL) is called every
 * few merges and at the end.  The name is "bpe<vocab>". */
ms_status data_tok_train(const char *text, const size_t *ends, size_t n_docs, int vocab_size,
                         data_tokenizer **out,
                         void (*progress)(void *ctx, int merges_done, int merges_total), void *ctx);

#endif
