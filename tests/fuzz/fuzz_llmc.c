/* fuzz_llmc.c - libFuzzer harness of llm.c's model file reader
 * (src/ckpt/llmc.c, ckpt_llmc_open / ckpt_llmc_read_config): weights for
 * --init-from, eval and sample.
 *
 * The input is the file.  The reader must reject it with a status or
 * accept it; never crash, leak or read outside its buffers.  On a file it
 * accepts: the header alone gives the same architecture, and it validates;
 * there are 4 + 12 x layers tensors under distinct Hugging Face names, each
 * of its shape's size in the file's dtype, all their bytes readable, and
 * together exactly the file's parameters less wte's padding rows.
 */
#include <string.h>

#include "ckpt/llmc.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_init("fuzz_llmc");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("in.bin", data, size);
    ckpt_llmc_file *f = NULL;
    gpt_config hc;
    ms_status rh = ckpt_llmc_read_config(path, &hc);
    ms_status rc = ckpt_llmc_open(&f, path);
    fuzz_said("llmc", rc);
    if (rc != MS_OK) {
        MS_CHECKF(f == NULL && (rc == MS_ERR_FORMAT || rc == MS_ERR_NOMEM),
                  "unexpected status %s: %s", ms_status_name(rc), ms_errmsg());
        MS_CHECK(rh != MS_OK || rc == MS_ERR_NOMEM);
        return 0;
    }
    MS_CHECKF(rh == MS_OK, "the file opens but its header alone is refused: %s", ms_errmsg());
    MS_CHECK(ckpt_llmc_probe(path));
    gpt_config c;
    ckpt_llmc_config(f, &c);
    MS_CHECK(gpt_config_validate(&c) == MS_OK);
    MS_CHECK(memcmp(&c, &hc, sizeof c) == 0);
    int n = ckpt_llmc_count(f);
    MS_CHECK(n == 4 + 12 * c.n_layer);
    size_t es = 0, total = 0;
    for (int i = 0; i < n; i++) {
        const ckpt_st_tensor *t = ckpt_llmc_get(f, i);
        MS_CHECK(t && t->name && t->ndim >= 1 && t->ndim <= 2);
        MS_CHECK(t->dtype == CKPT_ST_F32 || t->dtype == CKPT_ST_BF16);
        size_t e = t->dtype == CKPT_ST_F32 ? 4 : 2;
        MS_CHECK(es == 0 || es == e);
        es = e;
        size_t nel = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        MS_CHECK(nel * e == t->nbytes);
        fuzz_touch(t->data, t->nbytes);
        total += t->nbytes;
        for (int j = 0; j < i; j++)
            MS_CHECKF(strcmp(ckpt_llmc_get(f, j)->name, t->name) != 0, "two tensors named %s",
                      t->name);
    }
    MS_CHECK(ckpt_llmc_get(f, n) == NULL && ckpt_llmc_get(f, -1) == NULL);
    size_t pad_rows = (size_t)(size - 1024) / es - total / es; /* wte's padding rows, in elements */
    MS_CHECK((size - 1024) % es == 0 && pad_rows % (size_t)c.n_embd == 0);
    ckpt_llmc_close(f);
    return 0;
}
