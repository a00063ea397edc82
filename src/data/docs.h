/* docs.h - the documents of one `data prepare` input, in order.
 *
 * An input is a list of files, read one after the other.  A file whose name
 * ends in ".jsonl" is JSON Lines: each non-blank line is a JSON object whose
 * string member `field` is one document.  Any other file is one document.
 * Empty documents (an empty file, "") are skipped.  A bad JSONL line (not a
 * JSON object, the member missing or not a string, or holding "\u0000",
 * where cJSON's string would end and the rest be lost, longer than
 * DATA_DOCS_MAX_LINE bytes) is
 * MS_ERR_FORMAT naming FILE:LINE and the problem; with skip_bad it is
 * counted and skipped instead.  A compressed file (gzip, zstd, xz or bzip2,
 * told by its magic bytes) is MS_ERR_FORMAT naming the file: its bytes would
 * otherwise be tokenised as text.
 *
 * Callers: data_prepare, `data tokenizer-train`.  Files are memory-mapped
 * one at a time.  The object is the caller's (data_docs_close); a document
 * returned by data_docs_next stays valid until the next call.  One thread
 * per object.
 */
#ifndef DATA_DOCS_H
#define DATA_DOCS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define DATA_DOCS_MAX_LINE ((size_t)64 << 20) /* a JSONL line is at most 64 MiB */

typedef struct data_docs data_docs;

/* A reader of the files paths[0, n) (borrowed: they must outlive it);
 * field: the JSONL member that holds the text. */
ms_status data_docs_open(data_docs **out, char *const *paths, int n, const char *field,
                         int skip_bad);

/* The next document in *text (len bytes, not NUL-terminated), or *text NULL
 * at the end.  *consumed: the input bytes read since the previous document
 * (its file, or its line with the blank and skipped lines before it; at the
 * end, what was left), so that they add up to the files' sizes. */
ms_status data_docs_next(data_docs *d, const char **text, size_t *len, uint64_t *consumed);

/* The file being read (for messages), or "" before the first. */
const char *data_docs_path(const data_docs *d);

/* JSONL lines skipped (skip_bad), and *first: the first one's reason
 * ("FILE:LINE: ..."), owned by d. */
uint64_t data_docs_skipped(const data_docs *d, const char **first);

void data_docs_close(data_docs *d);

#endif
