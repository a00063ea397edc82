/* tokenizer_internal.h - what tokenizer.c (tables, file format),
 * tokenizer_encode.c (pre-tokenisation, BPE, decode) and tokenizer_train.c
 * share.  Not part of the data module's interface. */
#ifndef DATA_TOKENIZER_INTERNAL_H
#define DATA_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <string.h>

#include "data/tokenizer.h"

#define TOK_NONE UINT32_MAX
#define TOK_MAX_TOKENS (1u << 24) /* ids fit in 24 bits; pair keys never collide with empty */
#define TOK_MAX_SPECIAL 4096
#define TOK_EOT_TEXT "<|endoftext|>"

struct data_tokenizer {
    char *name;
    char *pattern;
    pcre2_code *re;
    int jit;      /* 1 when re is JIT-compiled (pcre2_jit_match is usable) */
    int gpt2_cut; /* the pattern is GPT-2's: text may be cut at data_tok_next_cut's places */
    uint32_t n_tokens, n_special;
    uint64_t *off;  /* n_tokens + n_special + 1 offsets into bytes; specials last */
    uint8_t *bytes; /* every token's byte string, in id order */
    uint32_t byte_id[256];
    uint32_t *bmap; /* byte string -> ordinary id: open addressing, slot = id + 1, 0 empty */
    uint64_t bmask;
    uint64_t *pkey; /* (left id << 32 | right id) -> id of the concatenation; empty UINT64_MAX */
    uint32_t *pval;
    uint64_t pmask;
    int eot;
};

/* Build a tokenizer from its token table.  Takes ownership of name, pattern,
 * off and bytes (also on failure).  `src` names the origin (a file path) for
 * error messages; bad content is MS_ERR_FORMAT. */
ms_status tok_create(const char *src, char *name, char *pattern, uint32_t n_tokens,
                     uint32_t n_special, uint64_t *off, uint8_t *bytes, data_tokenizer **out);

/* Compile a pre-tokenisation pattern (UTF + UCP, JIT when available). */
ms_status tok_compile(const char *src, const char *pattern, pcre2_code **re, int *jit);

/* Cut text[0, len) into pieces (see tokenizer.h: valid UTF-8 runs through
 * the regex, invalid bytes alone, unmatched text as its own piece) and call
 * fn on each in order; a non-OK status from fn stops and is returned. */
typedef ms_status (*tok_piece_fn)(void *ctx, const uint8_t *p, size_t n);
ms_status tok_split(const pcre2_code *re, int jit, const char *text, size_t len, tok_piece_fn fn,
                    void *ctx);

/* Hash of a byte string (for the tables here and in training). */
static inline uint64_t tok_hash(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n, w;
    while (n >= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

static inline uint64_t tok_pair_hash(uint64_t key) {
    key *= 0x9e3779b97f4a7c15ull;
    return key ^ (key >> 31);
}

/* Id of the ordinary token with bytes p[0, n), or TOK_NONE. */
static inline uint32_t tok_lookup(const data_tokenizer *t, const uint8_t *p, size_t n) {
    for (uint64_t i = tok_hash(p, n) & t->bmask;; i = (i + 1) & t->bmask) {
        uint32_t s = t->bmap[i];
        if (!s) return TOK_NONE;
        uint32_t id = s - 1;
        if (t->off[id + 1] - t->off[id] == n && memcmp(t->bytes + t->off[id], p, n) == 0) return id;
    }
}

/* Id (= rank) of the token that is the concatenation of tokens a and b, or
 * TOK_NONE. */
static inline uint32_t tok_pair(const data_tokenizer *t, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (uint64_t i = tok_pair_hash(key) & t->pmask;; i = (i + 1) & t->pmask) {
        if (t->pkey[i] == key) return t->pval[i];
        if (t->pkey[i] == UINT64_MAX) return TOK_NONE;
    }
}

#endif
