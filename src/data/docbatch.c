/* docbatch.c - read ahead, encode in parallel, hand out in order. */
#include "data/docbatch.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define BATCH_DOCS 65536 /* at most this many documents in one batch */

typedef struct {
    const char *text; /* a large document: the reader's text; NULL: small */
    size_t off, len;  /* small: its text at batch->text + off */
    uint64_t used;
    uint32_t *ids; /* small: its tokens (the buffer is kept for the next batch) */
    size_t n, cap;
    ms_status rc;
} entry;

struct data_docbatch {
    data_docs *docs;
    const data_tokenizer *tok;
    int threads;
    entry *e;
    int n, cap, next; /* the batch: e[0, n), the next to hand out */
    char *text;       /* the small documents' texts, copied */
    size_t text_len, text_cap;
    int at_end;
    uint64_t tail; /* at_end: the bytes read after the last document */
};

ms_status data_docbatch_create(data_docbatch **out, data_docs *docs, const data_tokenizer *tok,
                               int threads) {
    data_docbatch *b = calloc(1, sizeof *b);
    *out = b;
    if (!b) return ms_error(MS_ERR_NOMEM, "out of memory");
    b->docs = docs;
    b->tok = tok;
    b->threads = threads > 0 ? threads : omp_get_max_threads();
    return MS_OK;
}

void data_docbatch_free(data_docbatch *b) {
    if (!b) return;
    for (int i = 0; i < b->cap; i++)
        free(b->e[i].ids);
    free(b->e);
    free(b->text);
    free(b);
}

/* Room for one more entry and for len more bytes of text. */
static ms_status grow(data_docbatch *b, size_t len) {
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 256;
        entry *g = realloc(b->e, sizeof *g * (size_t)cap);
        if (!g) return ms_error(MS_ERR_NOMEM, "prepare: out of memory for a batch of documents");
        memset(g + b->cap, 0, sizeof *g * (size_t)(cap - b->cap));
        b->e = g;
        b->cap = cap;
    }
    if (b->text_len + len > b->text_cap) {
        size_t cap = b->text_cap ? b->text_cap : DATA_DOCBATCH_BYTES + DATA_DOCBATCH_SMALL;
        while (cap < b->text_len + len)
            cap *= 2;
        char *g = realloc(b->text, cap);
        if (!g) return ms_error(MS_ERR_NOMEM, "prepare: out of memory for a batch of documents");
        b->text = g;
        b->text_cap = cap;
    }
    return MS_OK;
}

/* Encode small document e (one thread). */
static ms_status encode(const data_docbatch *b, entry *e) {
    const char *t = b->text + e->off;
    e->n = 0;
    if (b->tok) return data_tok_encode(b->tok, t, e->len, &e->ids, &e->n, &e->cap);
    if (e->cap < e->len) {
        uint32_t *g = realloc(e->ids, e->len * sizeof *g);
        if (!g) return ms_error(MS_ERR_NOMEM, "prepare: out of memory");
        e->ids = g;
        e->cap = e->len;
    }
    for (size_t i = 0; i < e->len; i++)
        e->ids[i] = (unsigned char)t[i];
    e->n = e->len;
    return MS_OK;
}

/* Read the next batch (none at the end) and encode its small documents. */
static ms_status fill(data_docbatch *b) {
    b->n = b->next = 0;
    b->text_len = 0;
    while (!b->at_end && b->n < BATCH_DOCS && b->text_len < DATA_DOCBATCH_BYTES) {
        const char *t;
        size_t len;
        uint64_t used;
        MS_TRY(data_docs_next(b->docs, &t, &len, &used));
        if (!t) {
            b->at_end = 1;
            b->tail = used;
            break;
        }
        MS_TRY(grow(b, len <= DATA_DOCBATCH_SMALL ? len : 0));
        entry *e = &b->e[b->n++];
        e->len = len;
        e->used = used;
        e->rc = MS_OK;
        if (len > DATA_DOCBATCH_SMALL) { /* the reader keeps its text until the next call */
            e->text = t;
            break;
        }
        e->text = NULL;
        e->off = b->text_len;
        memcpy(b->text + b->text_len, t, len);
        b->text_len += len;
    }
#pragma omp parallel for schedule(dynamic, 4) num_threads(b->threads)
    for (int i = 0; i < b->n; i++)
        if (!b->e[i].text) b->e[i].rc = encode(b, &b->e[i]);
    for (int i = 0; i < b->n; i++)
        if (b->e[i].rc != MS_OK) /* again here, for the message (a thread's is its own) */
            return encode(b, &b->e[i]);
    return MS_OK;
}

ms_status data_docbatch_next(data_docbatch *b, data_docbatch_doc *doc, int *end) {
    memset(doc, 0, sizeof *doc);
    *end = 0;
    if (b->next == b->n) MS_TRY(fill(b));
    if (b->next == b->n) {
        *end = 1;
        doc->used = b->tail;
        b->tail = 0;
        return MS_OK;
    }
    const entry *e = &b->e[b->next++];
    doc->text = e->text;
    doc->ids = e->ids;
    doc->n_ids = e->n;
    doc->len = e->len;
    doc->used = e->used;
    return MS_OK;
}
