/* fuzz_safetensors.c - libFuzzer harness of the safetensors reader
 * (src/ckpt/safetensors.c, ckpt_st_open): checkpoint shards and exported
 * weights.
 *
 * The input is the file.  The reader must reject it with a status or
 * accept it; never crash, leak or read outside the file.  On a file it
 * accepts: every tensor is found by its name, its size is its shape's,
 * all its bytes are read, and the writer (ckpt_st_write) writes the
 * tensors into a file that reads back the same (names, dtypes, shapes,
 * bytes).
 */
#include <string.h>

#include "ckpt/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_init("fuzz_safetensors");
    return 0;
}

static void check_tensor(const ckpt_st_file *f, const ckpt_st_tensor *t) {
    uint64_t nel = 1;
    MS_CHECK(t->name && ckpt_st_find(f, t->name) == t);
    MS_CHECK(t->ndim >= 0 && t->ndim <= CKPT_ST_MAX_DIMS);
    for (int k = 0; k < t->ndim; k++) {
        MS_CHECK(t->shape[k] >= 0);
        nel *= (uint64_t)t->shape[k];
    }
    MS_CHECK(nel * ckpt_st_dtype_size(t->dtype) == t->nbytes);
    MS_CHECK(strcmp(ckpt_st_dtype_name(t->dtype), "unknown") != 0);
    fuzz_touch(t->data, t->nbytes);
}

/* Write f's tensors with the writer and check that they read back equal.
 * Skipped when the writer refuses a name the reader accepts ("" and the
 * reserved "__metadata__" cannot be written). */
static void check_roundtrip(const ckpt_st_file *f) {
    ckpt_st_writer *w = ckpt_st_writer_create();
    ckpt_st_file *g = NULL;
    const char *path = tpath("roundtrip.safetensors"), *fmt = ckpt_st_meta(f, "format");
    int n = ckpt_st_count(f), ok = 1;
    MS_CHECK(w != NULL);
    for (int i = 0; ok && i < n; i++) {
        const ckpt_st_tensor *t = ckpt_st_get(f, i);
        ok = ckpt_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data) == MS_OK;
    }
    if (ok && fmt) MS_CHECK(ckpt_st_writer_meta(w, "format", fmt) == MS_OK);
    if (ok) {
        MS_CHECKF(ckpt_st_write(w, path) == MS_OK, "%s", ms_errmsg());
        MS_CHECKF(ckpt_st_open(&g, path) == MS_OK, "the written file does not read back: %s",
                  ms_errmsg());
        MS_CHECK(ckpt_st_count(g) == n);
        for (int i = 0; i < n; i++) {
            const ckpt_st_tensor *a = ckpt_st_get(f, i), *b = ckpt_st_find(g, a->name);
            MS_CHECKF(b != NULL, "tensor \"%s\" lost in the round trip", a->name);
            MS_CHECK(a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes);
            MS_CHECK(memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim) == 0);
            MS_CHECK(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
        }
        const char *fmt2 = ckpt_st_meta(g, "format");
        MS_CHECK(!fmt == !fmt2 && (!fmt || strcmp(fmt, fmt2) == 0));
    }
    ckpt_st_close(g);
    ckpt_st_writer_destroy(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("in.safetensors", data, size);
    ckpt_st_file *f = NULL;
    ms_status rc = ckpt_st_open(&f, path);
    fuzz_said("safetensors", rc);
    if (rc != MS_OK) {
        MS_CHECKF(f == NULL && (rc == MS_ERR_FORMAT || rc == MS_ERR_NOMEM),
                  "unexpected status %s: %s", ms_status_name(rc), ms_errmsg());
        return 0;
    }
    for (int i = 0; i < ckpt_st_count(f); i++)
        check_tensor(f, ckpt_st_get(f, i));
    MS_CHECK(ckpt_st_find(f, "") == NULL || ckpt_st_find(f, "")->name[0] == 0);
    check_roundtrip(f);
    ckpt_st_close(f);
    return 0;
}
