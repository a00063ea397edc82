/* fuzz_docs.c - libFuzzer harness of the JSON Lines document reader
 * (src/data/docs.c: `data prepare` and `data tokenizer-train` read their
 * inputs with it).
 *
 * The input is a .jsonl file, read twice: with skip_bad (bad lines counted
 * and skipped) and without (the first bad line an error).  The reader must
 * never crash, leak or read outside the file.  Every document is non-empty
 * and holds no NUL byte, and the bytes each call says it consumed add up to
 * the file's size.  Without skip_bad the documents are the skip_bad run's up
 * to the first bad line, which is MS_ERR_FORMAT naming the file; with no bad
 * line (none skipped) both runs give the same documents.
 */
#include <string.h>

#include "data/docs.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_init("fuzz_docs");
    return 0;
}

#define MAX_DOCS 4096

typedef struct {
    size_t n;
    uint64_t hash[MAX_DOCS]; /* FNV-1a of each document, length mixed in */
} doc_list;

static uint64_t fnv(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

/* Read every document of path into *out; the status that ended the read. */
static ms_status read_all(const char *path, size_t size, int skip_bad, doc_list *out,
                          uint64_t *skipped) {
    char *paths[1] = {(char *)path};
    data_docs *d = NULL;
    ms_status rc = data_docs_open(&d, paths, 1, NULL, skip_bad);
    MS_CHECK(rc == MS_OK);
    uint64_t total = 0;
    out->n = 0;
    for (;;) {
        const char *text = NULL;
        size_t len = 0;
        uint64_t used = 0;
        rc = data_docs_next(d, &text, &len, &used);
        if (rc != MS_OK) break;
        total += used;
        if (!text) {
            MS_CHECKF(total == size, "consumed %llu bytes of %zu", (unsigned long long)total, size);
            break;
        }
        MS_CHECK(len > 0 && len <= size);
        MS_CHECKF(memchr(text, 0, len) == NULL, "a document holds a NUL byte");
        if (out->n < MAX_DOCS) out->hash[out->n++] = fnv(text, len);
    }
    const char *first = NULL;
    *skipped = data_docs_skipped(d, &first);
    MS_CHECK(first != NULL);
    data_docs_close(d);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static doc_list all, strict;
    uint64_t skipped = 0, skipped0 = 0;
    const char *path = fuzz_file("in.jsonl", data, size);
    ms_status rc = read_all(path, size, 1, &all, &skipped);
    fuzz_said("docs (skip bad)", rc);
    MS_CHECKF(rc == MS_OK || rc == MS_ERR_FORMAT, "skip_bad: %s: %s", ms_status_name(rc),
              ms_errmsg()); /* FORMAT: a compressed file */
    ms_status rc0 = read_all(path, size, 0, &strict, &skipped0);
    fuzz_said("docs", rc0);
    MS_CHECK(skipped0 == 0);
    if (rc != MS_OK) {
        MS_CHECK(rc0 == MS_ERR_FORMAT);
        return 0;
    }
    MS_CHECKF(rc0 == MS_OK || rc0 == MS_ERR_FORMAT, "%s: %s", ms_status_name(rc0), ms_errmsg());
    MS_CHECK(rc0 == MS_OK ? skipped == 0 : skipped > 0);
    if (rc0 == MS_OK) MS_CHECK(strict.n == all.n);
    if (rc0 != MS_OK) MS_CHECK(strstr(ms_errmsg(), "in.jsonl:") != NULL);
    MS_CHECK(strict.n <= all.n);
    for (size_t i = 0; i < strict.n; i++)
        MS_CHECK(strict.hash[i] == all.hash[i]);
    return 0;
}
