/* tokenizer_train.c - learn a byte-level BPE vocabulary (data_tok_train).
 *
 * 1. Pre-tokenise the corpus with GPT-2's pattern (tok_split) and count the
 *    unique pieces ("words"); each word is a sequence of symbols, at first
 *    its bytes (ids 0-255).
 * 2. Count every adjacent symbol pair over the words, weighted by the word's
 *    count, and remember for each pair which words contain it.
 * 3. Repeatedly take the most frequent pair (a max-heap with lazy entries: an
 *    entry whose count is out of date is pushed again with the current
 *    count), give its concatenation an id (or reuse the id of an equal byte
 *    string learnt earlier), rewrite only the words that contain the pair and
 *    apply the net change of their pair counts.
 * Cost per merge is proportional to the words containing the pair, not to
 * the corpus. */
#include "data/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>

#define MAX_TOKEN_LEN 65535 /* token lengths are u16 in the file */

typedef struct {
    int64_t count;
    uint64_t key; /* a << 32 | b */
} heap_ent;

typedef struct {
    uint64_t key;
    int64_t count;
    int64_t delta; /* change of count during the current merge step */
    uint32_t *occ; /* words that contain (or once contained) the pair */
    uint32_t occ_n, occ_cap;
    uint32_t stamp; /* last step that touched it */
    int forbidden;  /* concatenation would be too long */
} pair_info;

typedef struct {
    /* unique pieces */
    uint8_t *pool; /* piece bytes while counting */
    size_t pool_n, pool_cap;
    uint64_t *w_off, *w_count;
    uint32_t *w_len, *w_stamp;
    uint32_t n_words, w_cap;
    uint32_t *wmap; /* piece bytes -> word + 1 */
    uint64_t wmask;
    /* symbols of every word (the word's bytes rewritten in place) */
    uint32_t *sym;
    /* pairs */
    pair_info *pairs;
    uint32_t n_pairs, pairs_cap;
    uint32_t *pmap; /* key -> pair index + 1 */
    uint64_t pmask;
    heap_ent *heap;
    size_t heap_n, heap_cap;
    /* vocabulary learnt so far */
    uint64_t *tok_off;
    uint8_t *tok_bytes;
    size_t tok_bytes_cap;
    uint32_t n_tokens, max_tokens;
    uint32_t *tmap; /* token bytes -> id + 1 */
    uint64_t tmask;
    /* scratch */
    uint32_t *touched;
    uint32_t n_touched, touched_cap;
    uint64_t *dkeys; /* signed pair keys per word rewrite */
    size_t d_cap;
    uint32_t *mpos; /* the merges' positions in the rewritten word */
    size_t mpos_cap;
} trainer;

static ms_status oom(void) {
    return ms_error(MS_ERR_NOMEM, "tokenizer training: out of memory");
}

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return 1;
    uint32_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* ---- step 1: unique pieces ---- */

static ms_status wmap_rehash(trainer *tr, uint64_t size) {
    uint32_t *m = calloc(size, sizeof *m);
    if (!m) return oom();
    for (uint32_t w = 0; w < tr->n_words; w++) {
        uint64_t i = tok_hash(tr->pool + tr->w_off[w], tr->w_len[w]) & (size - 1);
        while (m[i])
            i = (i + 1) & (size - 1);
        m[i] = w + 1;
    }
    free(tr->wmap);
    tr->wmap = m;
    tr->wmask = size - 1;
    return MS_OK;
}

static ms_status count_piece(void *ctx, const uint8_t *p, size_t n) {
    trainer *tr = ctx;
    if (n < 2) return MS_OK; /* no pairs */
    if (n >= (1ull << 31))   /* the encoder's limit: a tokenizer that could not encode its text */
        return ms_error(MS_ERR_RANGE,
                        "tokenizer training: a single piece of %zu bytes (2 GiB or more: no "
                        "encoder could take it)",
                        n);
    uint64_t i = tok_hash(p, n) & tr->wmask;
    for (; tr->wmap[i]; i = (i + 1) & tr->wmask) {
        uint32_t w = tr->wmap[i] - 1;
        if (tr->w_len[w] == n && memcmp(tr->pool + tr->w_off[w], p, n) == 0) {
            tr->w_count[w]++;
            return MS_OK;
        }
    }
    uint32_t w = tr->n_words;
    if (w == UINT32_MAX - 1) return ms_error(MS_ERR_RANGE, "tokenizer training: too many pieces");
    if (w == tr->w_cap) { /* three arrays of w_cap entries */
        uint32_t c = tr->w_cap ? 2 * tr->w_cap : 4096;
        uint64_t *o = realloc(tr->w_off, (size_t)c * sizeof *o);
        if (o) tr->w_off = o;
        uint64_t *k = realloc(tr->w_count, (size_t)c * sizeof *k);
        if (k) tr->w_count = k;
        uint32_t *l = realloc(tr->w_len, (size_t)c * sizeof *l);
        if (l) tr->w_len = l;
        if (!o || !k || !l) return oom();
        tr->w_cap = c;
    }
    if (tr->pool_n + n > tr->pool_cap) {
        size_t c = tr->pool_cap ? tr->pool_cap : 1 << 16;
        while (c < tr->pool_n + n)
            c *= 2;
        uint8_t *q = realloc(tr->pool, c);
        if (!q) return oom();
        tr->pool = q;
        tr->pool_cap = c;
    }
    memcpy(tr->pool + tr->pool_n, p, n);
    tr->w_off[w] = tr->pool_n;
    tr->w_len[w] = (uint32_t)n;
    tr->w_count[w] = 1;
    tr->pool_n += n;
    tr->wmap[i] = w + 1;
    tr->n_words++;
    if (2 * (uint64_t)tr->n_words > tr->wmask) return wmap_rehash(tr, 2 * (tr->wmask + 1));
    return MS_OK;
}

/* ---- pairs ---- */

static ms_status pair_get(trainer *tr, uint64_t key, uint32_t *idx) {
    uint64_t i = tok_pair_hash(key) & tr->pmask;
    for (; tr->pmap[i]; i = (i + 1) & tr->pmask)
        if (tr->pairs[tr->pmap[i] - 1].key == key) {
            *idx = tr->pmap[i] - 1;
            return MS_OK;
        }
    uint32_t p = tr->n_pairs;
    if (!grow((void **)&tr->pairs, &tr->pairs_cap, p + 1, sizeof *tr->pairs)) return oom();
    memset(&tr->pairs[p], 0, sizeof tr->pairs[p]);
    tr->pairs[p].key = key;
    tr->pmap[i] = p + 1;
    tr->n_pairs++;
    *idx = p;
    if (2 * (uint64_t)tr->n_pairs > tr->pmask) { /* rehash */
        uint64_t size = 2 * (tr->pmask + 1);
        uint32_t *m = calloc(size, sizeof *m);
        if (!m) return oom();
        for (uint32_t q = 0; q < tr->n_pairs; q++) {
            uint64_t j = tok_pair_hash(tr->pairs[q].key) & (size - 1);
            while (m[j])
                j = (j + 1) & (size - 1);
            m[j] = q + 1;
        }
        free(tr->pmap);
        tr->pmap = m;
        tr->pmask = size - 1;
    }
    return MS_OK;
}

static ms_status occ_add(pair_info *pi, uint32_t w) {
    if (pi->occ_n && pi->occ[pi->occ_n - 1] == w) return MS_OK;
    if (!grow((void **)&pi->occ, &pi->occ_cap, pi->occ_n + 1, sizeof *pi->occ)) return oom();
    pi->occ[pi->occ_n++] = w;
    return MS_OK;
}

/* Max-heap on (count, then the lower key). */
static int ent_before(heap_ent x, heap_ent y) {
    return x.count > y.count || (x.count == y.count && x.key < y.key);
}

static ms_status heap_push(trainer *tr, int64_t count, uint64_t key) {
    if (tr->heap_n == tr->heap_cap) {
        size_t c = tr->heap_cap ? 2 * tr->heap_cap : 1024;
        heap_ent *h = realloc(tr->heap, c * sizeof *h);
        if (!h) return oom();
        tr->heap = h;
        tr->heap_cap = c;
    }
    heap_ent v = {count, key}, *h = tr->heap;
    size_t i = tr->heap_n++;
    while (i > 0 && ent_before(v, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
    return MS_OK;
}

static heap_ent heap_pop(trainer *tr) {
    heap_ent *h = tr->heap, top = h[0], v = h[--tr->heap_n];
    size_t i = 0, n = tr->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && ent_before(h[c + 1], h[c])) c++;
        if (!ent_before(h[c], v)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = v;
    return top;
}

/* Record a change of `delta` occurrences of pair `key` in word w. */
static ms_status pair_change(trainer *tr, uint64_t key, int64_t delta, uint32_t w, uint32_t step) {
    uint32_t p;
    MS_TRY(pair_get(tr, key, &p));
    pair_info *pi = &tr->pairs[p];
    pi->count += delta * (int64_t)tr->w_count[w];
    if (pi->stamp != step) {
        pi->stamp = step;
        pi->delta = 0;
        if (!grow((void **)&tr->touched, &tr->touched_cap, tr->n_touched + 1, sizeof *tr->touched))
            return oom();
        tr->touched[tr->n_touched++] = p;
    }
    /* weighted by the word's count, as count is: delta > 0 exactly when the
     * count went up this step (unweighted, a gain in a frequent word and a
     * loss in a rare one summed to <= 0, and the risen count got no heap
     * entry; only a merge that reuses an id could do that) */
    pi->delta += delta * (int64_t)tr->w_count[w];
    if (delta > 0) MS_TRY(occ_add(pi, w));
    return MS_OK;
}

/* ---- step 3: merges ---- */

/* Id for the concatenation of tokens a and b: an existing equal byte string
 * or a new token.  *id = TOK_NONE if it would exceed MAX_TOKEN_LEN. */
static ms_status token_for(trainer *tr, uint32_t a, uint32_t b, uint32_t *id) {
    uint64_t la = tr->tok_off[a + 1] - tr->tok_off[a], lb = tr->tok_off[b + 1] - tr->tok_off[b];
    uint64_t end = tr->tok_off[tr->n_tokens];
    *id = TOK_NONE;
    if (la + lb > MAX_TOKEN_LEN) return MS_OK;
    if (end + la + lb > tr->tok_bytes_cap) {
        size_t c = tr->tok_bytes_cap * 2;
        while (c < end + la + lb)
            c *= 2;
        uint8_t *q = realloc(tr->tok_bytes, c);
        if (!q) return oom();
        tr->tok_bytes = q;
        tr->tok_bytes_cap = c;
    }
    uint8_t *dst = tr->tok_bytes + end;
    memmove(dst, tr->tok_bytes + tr->tok_off[a], la);
    memmove(dst + la, tr->tok_bytes + tr->tok_off[b], lb);
    uint64_t i = tok_hash(dst, la + lb) & tr->tmask;
    for (; tr->tmap[i]; i = (i + 1) & tr->tmask) {
        uint32_t t = tr->tmap[i] - 1;
        if (tr->tok_off[t + 1] - tr->tok_off[t] == la + lb &&
            memcmp(tr->tok_bytes + tr->tok_off[t], dst, la + lb) == 0) {
            *id = t;
            return MS_OK;
        }
    }
    *id = tr->n_tokens++;
    tr->tok_off[tr->n_tokens] = end + la + lb;
    tr->tmap[i] = *id + 1;
    return MS_OK;
}

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* Rewrite word w, replacing (a, b) by m left to right, and record the net
 * change of its pairs.  Only the pairs that touch a merge change: the old
 * ones that held a merged a or b, the new ones that hold a merged m (by
 * position: m may be an id the word already held, when it is an earlier
 * token's bytes).  Their keys are collected with a sign bit (old pairs -,
 * new pairs +), sorted and summed, so the cost is one scan of the word and
 * a sort of a few keys a merge (it was a sort of all the word's pairs: a
 * long piece, a line of 200 KB without a space, took minutes). */
static ms_status rewrite_word(trainer *tr, uint32_t w, uint32_t a, uint32_t b, uint32_t m,
                              uint32_t step) {
    uint32_t *s = tr->sym + tr->w_off[w], len = tr->w_len[w];
    uint32_t i, j;
    for (i = 0; i + 1 < len; i++)
        if (s[i] == a && s[i + 1] == b) break;
    if (i + 1 >= len) return MS_OK; /* no longer contains the pair */
    /* at most (len - i) / 2 merges: 3 old pairs and 2 new ones each, and
     * each merge's position in the rewritten word */
    size_t most = (len - i) / 2, need = 5 * most;
    if (need > tr->d_cap) {
        uint64_t *k = realloc(tr->dkeys, need * sizeof *k);
        if (!k) return oom();
        tr->dkeys = k;
        tr->d_cap = need;
    }
    if (most > tr->mpos_cap) {
        uint32_t *q = realloc(tr->mpos, most * sizeof *q);
        if (!q) return oom();
        tr->mpos = q;
        tr->mpos_cap = most;
    }
    /* Pair keys fit in 48 bits (ids < 2^24); bit 63 marks an old pair.  In
     * place, j <= i: s[i - 1 ..] still hold the word's symbols when a merge
     * at i is found (s[i - 1] was copied onto itself if j == i). */
    size_t nd = 0, nm = 0;
    int64_t last = -1; /* the last old pair recorded: k is the pair (s[k], s[k + 1]) */
    for (j = i; i < len;) {
        if (i + 1 < len && s[i] == a && s[i + 1] == b) {
            for (int64_t k = (int64_t)i - 1; k <= (int64_t)i + 1; k++)
                if (k > last && k >= 0 && k + 1 < (int64_t)len) {
                    tr->dkeys[nd++] = ((uint64_t)s[k] << 24 | s[k + 1]) | 1ull << 63;
                    last = k;
                }
            tr->mpos[nm++] = j;
            s[j++] = m;
            i += 2;
        } else {
            s[j++] = s[i++];
        }
    }
    tr->w_len[w] = len = j;
    last = -1;
    for (size_t q = 0; q < nm; q++)
        for (int64_t k = (int64_t)tr->mpos[q] - 1; k <= (int64_t)tr->mpos[q]; k++)
            if (k > last && k >= 0 && k + 1 < (int64_t)len) {
                tr->dkeys[nd++] = (uint64_t)s[k] << 24 | s[k + 1];
                last = k;
            }
    qsort(tr->dkeys, nd, sizeof *tr->dkeys, cmp_u64);
    /* Old and new copies of a pair sort apart (bit 63): merge by key. */
    size_t lo = 0, hi = 0;
    while (hi < nd && !(tr->dkeys[hi] >> 63))
        hi++;
    size_t new_end = hi, old_end = nd;
    while (lo < new_end || hi < old_end) {
        uint64_t kn = lo < new_end ? tr->dkeys[lo] : UINT64_MAX;
        uint64_t ko = hi < old_end ? tr->dkeys[hi] & ~(1ull << 63) : UINT64_MAX;
        uint64_t k = kn < ko ? kn : ko;
        int64_t d = 0;
        while (lo < new_end && tr->dkeys[lo] == k)
            d++, lo++;
        while (hi < old_end && (tr->dkeys[hi] & ~(1ull << 63)) == k)
            d--, hi++;
        if (d) MS_TRY(pair_change(tr, (k >> 24) << 32 | (k & 0xffffff), d, w, step));
    }
    return MS_OK;
}

static ms_status merge_pair(trainer *tr, uint32_t p, uint32_t m, uint32_t step) {
    uint64_t key = tr->pairs[p].key;
    uint32_t a = (uint32_t)(key >> 32), b = (uint32_t)key;
    uint32_t *occ = tr->pairs[p].occ, occ_n = tr->pairs[p].occ_n;
    tr->pairs[p].occ = NULL; /* new pairs all contain m, never (a, b) */
    tr->pairs[p].occ_n = tr->pairs[p].occ_cap = 0;
    tr->n_touched = 0;
    ms_status rc = MS_OK;
    for (uint32_t k = 0; k < occ_n && rc == MS_OK; k++) {
        uint32_t w = occ[k];
        if (tr->w_stamp[w] == step) continue;
        tr->w_stamp[w] = step;
        rc = rewrite_word(tr, w, a, b, m, step);
    }
    free(occ);
    /* A count that went up needs a fresh heap entry; one that went down is
     * corrected when its old entry comes up. */
    for (uint32_t k = 0; k < tr->n_touched && rc == MS_OK; k++) {
        pair_info *pi = &tr->pairs[tr->touched[k]];
        if (pi->delta > 0 && pi->count > 0) rc = heap_push(tr, pi->count, pi->key);
    }
    return rc;
}

static ms_status train_init(trainer *tr, uint32_t max_tokens) {
    tr->max_tokens = max_tokens;
    tr->tmask = 1;
    while (tr->tmask < 2 * (uint64_t)max_tokens)
        tr->tmask <<= 1;
    tr->tmask -= 1;
    tr->tmap = calloc(tr->tmask + 1, sizeof *tr->tmap);
    tr->tok_off = malloc(((size_t)max_tokens + 2) * sizeof *tr->tok_off);
    tr->tok_bytes_cap = 1 << 16;
    tr->tok_bytes = malloc(tr->tok_bytes_cap);
    if (!tr->tmap || !tr->tok_off || !tr->tok_bytes) return oom();
    for (uint32_t c = 0; c < 256; c++) {
        tr->tok_off[c] = c;
        tr->tok_bytes[c] = (uint8_t)c;
        uint64_t i = tok_hash(tr->tok_bytes + c, 1) & tr->tmask;
        while (tr->tmap[i])
            i = (i + 1) & tr->tmask;
        tr->tmap[i] = c + 1;
    }
    tr->tok_off[256] = 256;
    tr->n_tokens = 256;
    tr->wmask = (1 << 16) - 1;
    tr->wmap = calloc(tr->wmask + 1, sizeof *tr->wmap);
    tr->pmask = (1 << 16) - 1;
    tr->pmap = calloc(tr->pmask + 1, sizeof *tr->pmap);
    if (!tr->wmap || !tr->pmap) return oom();
    return MS_OK;
}

/* Words' symbols and the initial pair counts. */
static ms_status count_pairs(trainer *tr) {
    tr->sym = malloc((tr->pool_n ? tr->pool_n : 1) * sizeof *tr->sym);
    tr->w_stamp = calloc(tr->n_words ? tr->n_words : 1, sizeof *tr->w_stamp);
    if (!tr->sym || !tr->w_stamp) return oom();
    for (size_t i = 0; i < tr->pool_n; i++)
        tr->sym[i] = tr->pool[i];
    free(tr->pool);
    tr->pool = NULL;
    for (uint32_t w = 0; w < tr->n_words; w++) {
        const uint32_t *s = tr->sym + tr->w_off[w];
        for (uint32_t i = 0; i + 1 < tr->w_len[w]; i++) {
            uint32_t p;
            MS_TRY(pair_get(tr, (uint64_t)s[i] << 32 | s[i + 1], &p));
            tr->pairs[p].count += (int64_t)tr->w_count[w];
            MS_TRY(occ_add(&tr->pairs[p], w));
        }
    }
    for (uint32_t p = 0; p < tr->n_pairs; p++)
        MS_TRY(heap_push(tr, tr->pairs[p].count, tr->pairs[p].key));
    return MS_OK;
}

static void train_free(trainer *tr) {
    free(tr->pool);
    free(tr->w_off);
    free(tr->w_count);
    free(tr->w_len);
    free(tr->w_stamp);
    free(tr->wmap);
    free(tr->sym);
    for (uint32_t p = 0; p < tr->n_pairs; p++)
        free(tr->pairs[p].occ);
    free(tr->pairs);
    free(tr->pmap);
    free(tr->heap);
    free(tr->tok_off);
    free(tr->tok_bytes);
    free(tr->tmap);
    free(tr->touched);
    free(tr->dkeys);
    free(tr->mpos);
}

/* The merge loop: until max_tokens ordinary tokens or no pair is left. */
static ms_status run_merges(trainer *tr, void (*progress)(void *, int, int), void *ctx) {
    int total = (int)(tr->max_tokens - 256);
    uint32_t step = 0;
    while (tr->n_tokens < tr->max_tokens && tr->heap_n) {
        heap_ent e = heap_pop(tr);
        uint32_t p;
        MS_TRY(pair_get(tr, e.key, &p));
        pair_info *pi = &tr->pairs[p];
        if (pi->count <= 0 || pi->forbidden) continue;
        if (pi->count != e.count) { /* out of date: requeue with its count */
            MS_TRY(heap_push(tr, pi->count, pi->key));
            continue;
        }
        uint32_t m;
        MS_TRY(token_for(tr, (uint32_t)(e.key >> 32), (uint32_t)e.key, &m));
        if (m == TOK_NONE) {
            tr->pairs[p].forbidden = 1;
            continue;
        }
        MS_TRY(merge_pair(tr, p, m, ++step));
        if (progress && (step % 64 == 0)) progress(ctx, (int)(tr->n_tokens - 256), total);
    }
    if (progress) progress(ctx, (int)(tr->n_tokens - 256), total);
    return MS_OK;
}

ms_status data_tok_train(const char *text, const size_t *ends, size_t n_docs, int vocab_size,
                         data_tokenizer **out,
                         void (*progress)(void *ctx, int merges_done, int merges_total),
                         void *ctx) {
    trainer tr;
    ms_status rc;
    *out = NULL;
    memset(&tr, 0, sizeof tr);
    if (vocab_size < 257 || (uint32_t)vocab_size > TOK_MAX_TOKENS)
        return ms_error(MS_ERR_ARG, "tokenizer training: vocab size %d is not in 257..%u",
                        vocab_size, TOK_MAX_TOKENS);
    if ((rc = train_init(&tr, (uint32_t)vocab_size - 1)) != MS_OK) goto out;
    for (size_t d = 0; d < n_docs; d++) {
        size_t b = d ? ends[d - 1] : 0;
        if (ends[d] < b) {
            rc = ms_error(MS_ERR_ARG, "tokenizer training: document %zu ends before it starts", d);
            goto out;
        }
        if ((rc = tok_split(NULL, 0, text + b, ends[d] - b, count_piece, &tr)) != MS_OK) goto out;
    }
    if ((rc = count_pairs(&tr)) != MS_OK) goto out;
    if ((rc = run_merges(&tr, progress, ctx)) != MS_OK) goto out;

    /* Hand the table to tok_create: ordinary tokens, then <|endoftext|>. */
    uint32_t nt = tr.n_tokens;
    size_t eot_len = strlen(TOK_EOT_TEXT), nb = tr.tok_off[nt];
    char name[32], *name_s, *pat_s;
    snprintf(name, sizeof name, "bpe%u", nt + 1);
    name_s = strdup(name);
    pat_s = strdup(DATA_TOK_GPT2_PATTERN);
    uint64_t *off = malloc(((size_t)nt + 2) * sizeof *off);
    uint8_t *bytes = malloc(nb + eot_len);
    if (!name_s || !pat_s || !off || !bytes) {
        free(name_s);
        free(pat_s);
        free(off);
        free(bytes);
        rc = oom();
        goto out;
    }
    memcpy(off, tr.tok_off, ((size_t)nt + 1) * sizeof *off);
    memcpy(bytes, tr.tok_bytes, nb);
    memcpy(bytes + nb, TOK_EOT_TEXT, eot_len);
    off[nt + 1] = nb + eot_len;
    rc = tok_create("trained tokenizer", name_s, pat_s, nt, 1, off, bytes, out);
out:
    train_free(&tr);
    return rc;
}
