/* tokenizer_encode.c - pre-tokenisation (valid UTF-8 runs, then GPT-2's pattern
 * by tokenizer_gpt2.c or another one through PCRE2), BPE on each piece, serial
 * and parallel encode, decode.  See tokenizer.h for the rules.
 *
 * BPE follows tiktoken: the rank of two adjacent parts is the id of their
 * concatenation (the pair table), the lowest rank merges first, the leftmost
 * on a tie.  Short pieces use tiktoken's scan (O(n^2), n <= 64); longer ones
 * a heap of (rank, position) over a linked list of parts, O(n log n), with
 * stale heap entries recognised by recomputing the pair's rank.  All scratch
 * memory is per call, so any number of threads can encode at once. */
#include "data/tokenizer_internal.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define SMALL_PIECE 64
#define PAR_CHUNK (1u << 20)
#define MAX_PIECE (1ull << 31) /* positions are 32-bit in the heap */

/* Length of the longest valid UTF-8 prefix of s[0, n) (RFC 3629, which is
 * also what PCRE2 accepts). */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        if (c >= 0xc2 && c <= 0xdf)
            k = 1;
        else if (c >= 0xe0 && c <= 0xef)
            k = 2;
        else if (c >= 0xf0 && c <= 0xf4)
            k = 3;
        else
            return i;
        if (k >= n - i) return i;
        for (size_t j = 1; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return i;
        uint8_t c1 = s[i + 1];
        if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) || (c == 0xf0 && c1 < 0x90) ||
            (c == 0xf4 && c1 > 0x8f))
            return i;
        i += k + 1;
    }
    return n;
}

/* Byte length of the UTF-8 character starting at s[0] (s is valid). */
static size_t utf8_char_len(uint8_t c) {
    return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

/* PCRE2's matches of re over one valid UTF-8 run s[0, n), with the text
 * between them, as pieces.  md, mc: match data and context for re; *js: the
 * large JIT stack, made on the first match that needs it (NULL until then). */
static ms_status split_regex(const pcre2_code *re, int jit, pcre2_match_data *md,
                             pcre2_match_context *mc, pcre2_jit_stack **js, const uint8_t *s,
                             size_t n, size_t pos, tok_piece_fn fn, void *ctx) {
    ms_status rc = MS_OK;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t off = 0, gap = 0; /* [gap, off): text no match has covered yet */
    while (off < n && rc == MS_OK) {
        int m = jit ? pcre2_jit_match(re, s, n, off, 0, md, mc)
                    : pcre2_match(re, s, n, off, PCRE2_NO_UTF_CHECK, md, mc);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m == PCRE2_ERROR_JIT_STACKLIMIT && jit && !*js) {
            *js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
            if (!*js) return ms_error(MS_ERR_NOMEM, "tokenizer: out of memory for the regex stack");
            pcre2_jit_stack_assign(mc, NULL, *js);
            continue; /* the same match again */
        }
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return ms_error(MS_ERR_INTERNAL, "tokenizer: regex match failed at byte %zu: %s",
                            pos + off, (const char *)msg);
        }
        size_t b = ov[0], e = ov[1];
        if (e == b) { /* an empty match: that character joins the gap */
            if (b >= n) break;
            off = b + utf8_char_len(s[b]);
            continue;
        }
        if (b > gap) rc = fn(ctx, s + gap, b - gap);
        if (rc == MS_OK) rc = fn(ctx, s + b, e - b);
        gap = off = e;
    }
    if (rc == MS_OK && gap < n) rc = fn(ctx, s + gap, n - gap);
    return rc;
}

ms_status tok_split(const pcre2_code *re, int jit, const char *text, size_t len, tok_piece_fn fn,
                    void *ctx) {
    ms_status rc = MS_OK;
    const uint8_t *s = (const uint8_t *)text;
    pcre2_match_data *md = NULL;
    pcre2_match_context *mc = NULL;
    /* JIT matches run on PCRE2's default 32 KiB stack; a match that needs more
     * runs again on an 8 MiB one, made then.  (Made for every call, as before,
     * it was an mmap, page faults and a munmap per document: 3/4 of the time of
     * tokenizer-train and prepare on a JSONL file of short documents.) */
    pcre2_jit_stack *js = NULL;
    if (re) {
        md = pcre2_match_data_create_from_pattern(re, NULL);
        mc = pcre2_match_context_create(NULL);
        if (!md || !mc) {
            rc = ms_error(MS_ERR_NOMEM, "tokenizer: out of memory for PCRE2 match data");
            goto out;
        }
    }
    size_t pos = 0;
    while (pos < len && rc == MS_OK) {
        size_t rl = utf8_valid_prefix(s + pos, len - pos);
        if (rl == 0) { /* an invalid byte: a piece of its own */
            rc = fn(ctx, s + pos, 1);
            pos++;
            continue;
        }
        rc = re ? split_regex(re, jit, md, mc, &js, s + pos, rl, pos, fn, ctx)
                : tok_gpt2_split(s + pos, rl, fn, ctx);
        pos += rl;
    }
out:
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    return rc;
}

/* Per-call encoder state: the output buffer and BPE scratch memory. */
typedef struct {
    const data_tokenizer *t;
    uint32_t *ids; /* output, grown as needed */
    size_t n, cap;
    uint32_t *part;   /* heap BPE: id of the part starting at i, TOK_NONE if merged away */
    uint32_t *next;   /* next part start (n = end) */
    uint32_t *prev;   /* previous part start (UINT32_MAX = none) */
    uint64_t *heap;   /* (rank << 32 | position), min-heap */
    size_t scratch_n; /* capacity of part/next/prev (heap: 3x) */
} enc_state;

static ms_status out_reserve(enc_state *st, size_t more) {
    if (st->n + more <= st->cap) return MS_OK;
    size_t cap = st->cap ? st->cap : 1024;
    while (cap < st->n + more)
        cap *= 2;
    uint32_t *p = realloc(st->ids, cap * sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "tokenizer: out of memory for %zu token ids", cap);
    st->ids = p;
    st->cap = cap;
    return MS_OK;
}

/* tiktoken's scan for a short piece (2 <= n <= SMALL_PIECE). */
static void bpe_small(enc_state *st, const uint8_t *p, size_t n) {
    const data_tokenizer *t = st->t;
    uint32_t id[SMALL_PIECE], rk[SMALL_PIECE];
    for (size_t i = 0; i < n; i++)
        id[i] = t->byte_id[p[i]];
    for (size_t i = 0; i + 1 < n; i++)
        rk[i] = tok_pair(t, id[i], id[i + 1]);
    size_t m = n;
    while (m > 1) {
        uint32_t best = TOK_NONE;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rk[i] < best) {
                best = rk[i];
                bi = i;
            }
        if (best == TOK_NONE) break;
        id[bi] = best;
        memmove(id + bi + 1, id + bi + 2, (m - bi - 2) * sizeof *id);
        memmove(rk + bi + 1, rk + bi + 2, (m - bi - 2) * sizeof *rk);
        m--;
        rk[bi] = bi + 1 < m ? tok_pair(t, id[bi], id[bi + 1]) : TOK_NONE;
        if (bi > 0) rk[bi - 1] = tok_pair(t, id[bi - 1], id[bi]);
    }
    memcpy(st->ids + st->n, id, m * sizeof *id);
    st->n += m;
}

static void heap_push(uint64_t *h, size_t *hn, uint64_t v) {
    size_t i = (*hn)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *hn) {
    uint64_t top = h[0], v = h[--*hn];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = v;
    return top;
}

/* Heap BPE for a long piece; same result as bpe_small. */
static ms_status bpe_heap(enc_state *st, const uint8_t *p, size_t n) {
    const data_tokenizer *t = st->t;
    if (n >= MAX_PIECE)
        return ms_error(MS_ERR_RANGE, "tokenizer: a single piece of %zu bytes is too long", n);
    if (n > st->scratch_n) {
        size_t c = n < 4096 ? 4096 : n;
        uint32_t *a = realloc(st->part, c * sizeof *a);
        if (a) st->part = a;
        uint32_t *b = realloc(st->next, c * sizeof *b);
        if (b) st->next = b;
        uint32_t *d = realloc(st->prev, c * sizeof *d);
        if (d) st->prev = d;
        uint64_t *h = realloc(st->heap, 3 * c * sizeof *h);
        if (h) st->heap = h;
        if (!a || !b || !d || !h)
            return ms_error(MS_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte piece", n);
        st->scratch_n = c;
    }
    uint32_t *part = st->part, *next = st->next, *prev = st->prev, nn = (uint32_t)n;
    uint64_t *h = st->heap;
    size_t hn = 0;
    for (uint32_t i = 0; i < nn; i++) {
        part[i] = t->byte_id[p[i]];
        next[i] = i + 1;
        prev[i] = i - 1; /* UINT32_MAX for i = 0 */
    }
    for (uint32_t i = 0; i + 1 < nn; i++) {
        uint32_t r = tok_pair(t, part[i], part[i + 1]);
        if (r != TOK_NONE) heap_push(h, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(h, &hn);
        uint32_t r = (uint32_t)(top >> 32), i = (uint32_t)top;
        if (part[i] == TOK_NONE) continue; /* merged into its left neighbour */
        uint32_t j = next[i];
        if (j >= nn || tok_pair(t, part[i], part[j]) != r) continue; /* stale */
        part[i] = r;
        part[j] = TOK_NONE;
        next[i] = next[j];
        if (next[j] < nn) prev[next[j]] = i;
        if (prev[i] != UINT32_MAX) {
            uint32_t rr = tok_pair(t, part[prev[i]], r);
            if (rr != TOK_NONE) heap_push(h, &hn, (uint64_t)rr << 32 | prev[i]);
        }
        if (next[i] < nn) {
            uint32_t rr = tok_pair(t, r, part[next[i]]);
            if (rr != TOK_NONE) heap_push(h, &hn, (uint64_t)rr << 32 | i);
        }
    }
    for (uint32_t i = 0; i < nn; i = next[i])
        st->ids[st->n++] = part[i];
    return MS_OK;
}

/* One piece -> ids appended to st. */
static ms_status encode_piece(void *ctx, const uint8_t *p, size_t n) {
    enc_state *st = ctx;
    const data_tokenizer *t = st->t;
    MS_TRY(out_reserve(st, n));
    if (n == 1) {
        st->ids[st->n++] = t->byte_id[p[0]];
        return MS_OK;
    }
    uint32_t id = tok_lookup(t, p, n);
    if (id != TOK_NONE) {
        st->ids[st->n++] = id;
        return MS_OK;
    }
    if (n <= SMALL_PIECE) {
        bpe_small(st, p, n);
        return MS_OK;
    }
    return bpe_heap(st, p, n);
}

ms_status data_tok_encode(const data_tokenizer *t, const char *text, size_t len, uint32_t **ids,
                          size_t *n, size_t *cap) {
    enc_state st = {.t = t, .ids = *ids, .n = *n, .cap = *cap};
    ms_status rc = tok_split(t->re, t->jit, text, len, encode_piece, &st);
    free(st.part);
    free(st.next);
    free(st.prev);
    free(st.heap);
    *ids = st.ids; /* the buffer may have moved even on failure */
    *cap = st.cap;
    if (rc == MS_OK) *n = st.n;
    return rc;
}

/* A cut before s[i] (2 <= i < len) where GPT-2's pattern ends a piece: "X\nY" with X, Y
 * printable non-space ASCII. */
static int gpt2_cut(const uint8_t *s, size_t i) {
    return s[i - 1] == '\n' && s[i - 2] > 0x20 && s[i - 2] < 0x7f && s[i] > 0x20 && s[i] < 0x7f;
}

size_t data_tok_next_cut(const data_tokenizer *t, const char *text, size_t len, size_t from) {
    const uint8_t *s = (const uint8_t *)text;
    if (!t) return from < len ? from : len; /* bytes: every place */
    if (!t->gpt2) return len;               /* another pattern may match across a '\n' */
    for (size_t i = from > 2 ? from : 2; i < len; i++)
        if (gpt2_cut(s, i)) return i;
    return len;
}

ms_status data_tok_encode_parallel(const data_tokenizer *t, const char *text, size_t len,
                                   int threads, uint32_t **ids, size_t *n, size_t *cap) {
    if (threads <= 0) threads = omp_get_max_threads();
    if (threads <= 1 || len < 2 * (size_t)PAR_CHUNK || !t->gpt2)
        return data_tok_encode(t, text, len, ids, n, cap);
    /* Chunk k covers [cut[k], cut[k + 1]). */
    size_t n_cut_max = len / PAR_CHUNK + 2, n_chunks = 0;
    size_t *cut = malloc(n_cut_max * sizeof *cut);
    if (!cut) return ms_error(MS_ERR_NOMEM, "tokenizer: out of memory");
    cut[0] = 0;
    for (size_t at = PAR_CHUNK; at < len;) {
        size_t i = data_tok_next_cut(t, text, len, at);
        if (i >= len) break;
        cut[++n_chunks] = i;
        at = i + PAR_CHUNK;
    }
    cut[++n_chunks] = len;
    typedef struct {
        uint32_t *ids;
        size_t n, cap;
        ms_status rc;
        char msg[512];
    } chunk_out;
    chunk_out *co = calloc(n_chunks, sizeof *co);
    if (!co) {
        free(cut);
        return ms_error(MS_ERR_NOMEM, "tokenizer: out of memory");
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t k = 0; k < n_chunks; k++) {
        chunk_out *c = &co[k];
        c->cap = (cut[k + 1] - cut[k]) / 3 + 1024; /* English: ~4 bytes per token */
        c->ids = malloc(c->cap * sizeof *c->ids);
        if (!c->ids) c->cap = 0;
        c->rc = data_tok_encode(t, text + cut[k], cut[k + 1] - cut[k], &c->ids, &c->n, &c->cap);
        if (c->rc != MS_OK) snprintf(c->msg, sizeof c->msg, "%s", ms_errmsg());
    }
    ms_status rc = MS_OK;
    size_t total = 0;
    for (size_t k = 0; k < n_chunks && rc == MS_OK; k++) {
        if (co[k].rc != MS_OK) rc = ms_error(co[k].rc, "%s", co[k].msg);
        total += co[k].n;
    }
    if (rc == MS_OK && *n + total > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *n + total)
            c *= 2;
        uint32_t *p = realloc(*ids, c * sizeof *p);
        if (!p)
            rc = ms_error(MS_ERR_NOMEM, "tokenizer: out of memory for %zu token ids", c);
        else {
            *ids = p;
            *cap = c;
        }
    }
    for (size_t k = 0; k < n_chunks; k++) {
        if (rc == MS_OK) {
            memcpy(*ids + *n, co[k].ids, co[k].n * sizeof **ids);
            *n += co[k].n;
        }
        free(co[k].ids);
    }
    free(co);
    free(cut);
    return rc;
}

ms_status data_tok_decode(const data_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                          size_t *len) {
    uint32_t vocab = t->n_tokens + t->n_special;
    size_t total = 0;
    *out = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= vocab)
            return ms_error(MS_ERR_RANGE,
                            "decode: token id %u at position %zu is out of range (%s has %u ids)",
                            ids[i], i, t->name, vocab);
        total += t->off[ids[i] + 1] - t->off[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf) return ms_error(MS_ERR_NOMEM, "decode: out of memory for %zu bytes", total);
    char *p = buf;
    for (size_t i = 0; i < n; i++) {
        size_t m = t->off[ids[i] + 1] - t->off[ids[i]];
        memcpy(p, t->bytes + t->off[ids[i]], m);
        p += m;
    }
    *p = 0;
    *out = buf;
    *len = total;
    return MS_OK;
}
