/* docbatch.h - the documents of a data_docs reader, read ahead and encoded
 * in batches on all threads (for data_prepare).
 *
 * One document is encoded by one thread (data_tok_encode_parallel finds no
 * cut in a small text, so encoding documents one by one would use one
 * core): small documents, up to DATA_DOCBATCH_SMALL bytes, are read until a
 * batch holds about DATA_DOCBATCH_BYTES of text, then encoded at once, one
 * document per thread at a time.  A document's ids are data_tok_encode's,
 * whatever the batch.  A larger document ends its batch and is handed over
 * as text, for the caller to encode in blocks on all threads.
 *
 * The reader is borrowed (it must outlive the batch); the batch owns its
 * buffers (data_docbatch_free).  Not thread-safe (it uses its own threads).
 */
#ifndef DATA_DOCBATCH_H
#define DATA_DOCBATCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "data/docs.h"
#include "data/tokenizer.h"

#define DATA_DOCBATCH_SMALL ((size_t)1 << 20) /* larger documents: as text */
#define DATA_DOCBATCH_BYTES ((size_t)4 << 20) /* the text of one batch */

typedef struct data_docbatch data_docbatch;

typedef struct {
    const char *text;    /* a large document's text, or NULL: a small one's ids */
    const uint32_t *ids; /* a small document's tokens, n_ids of them */
    size_t n_ids, len;   /* len: the document's bytes */
    uint64_t used;       /* input bytes read for it (data_docs_next's consumed) */
} data_docbatch_doc;

/* tok NULL: bytes (one token per byte); threads <= 0: all cores. */
ms_status data_docbatch_create(data_docbatch **out, data_docs *docs, const data_tokenizer *tok,
                               int threads);

/* The next document into *doc, valid until the next call; at the end *end
 * is 1 and doc->used holds the input bytes read after the last document. */
ms_status data_docbatch_next(data_docbatch *b, data_docbatch_doc *doc, int *end);

void data_docbatch_free(data_docbatch *b);

#endif
