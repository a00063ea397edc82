/* fuzz_manifest.c - libFuzzer harness of the checkpoint manifest reader
 * (src/ckpt/ckpt_manifest.c, ckpt_manifest_read): DIR/manifest.json of a
 * committed checkpoint, with the model and trainer-state objects it holds.
 *
 * The input is the manifest.  The reader must accept it or reject it as
 * malformed (MS_ERR_FORMAT, naming the file); never crash or leak.  On a manifest it accepts, every slice
 * names a listed tensor, state and file, and every tensor has 1 or 2
 * dimensions.
 */
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_init("fuzz_manifest");
    return 0;
}

static void check_manifest(const ckpt_manifest *mf) {
    MS_CHECK(mf->version >= 1 && mf->version <= CKPT_VERSION && mf->step == mf->trainer.step);
    MS_CHECK(mf->world >= 1 && mf->dp >= 1 && mf->tp >= 1 && mf->pp >= 1);
    MS_CHECK(mf->n_tensors >= 0 && (mf->n_tensors == 0 || mf->tensors));
    MS_CHECK(mf->n_files >= 1 && mf->files);
    MS_CHECK(memchr(mf->optimizer, 0, sizeof mf->optimizer));
    for (int i = 0; i < mf->n_tensors; i++) {
        const ckpt_tensor_info *t = &mf->tensors[i];
        MS_CHECK(t->ndim >= 1 && t->ndim <= CKPT_MAX_DIMS && memchr(t->name, 0, sizeof t->name));
    }
    for (int i = 0; i < mf->n_files; i++)
        MS_CHECK(mf->files[i].name[0] && !strchr(mf->files[i].name, '/'));
    for (int i = 0; i < mf->n_slices; i++) {
        const ckpt_slice *s = &mf->slices[i];
        MS_CHECK(s->tensor >= 0 && s->tensor < mf->n_tensors);
        MS_CHECK(s->file >= 0 && s->file < mf->n_files);
        MS_CHECK(s->kind >= 0 && s->kind < CKPT_NKINDS);
        MS_CHECK(memchr(s->key, 0, sizeof s->key));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckpt_manifest mf;
    fuzz_file(CKPT_MANIFEST, data, size);
    ms_status rc = ckpt_manifest_read(tmpdir, &mf);
    fuzz_said("manifest", rc);
    if (rc == MS_OK)
        check_manifest(&mf);
    else
        MS_CHECKF(rc == MS_ERR_FORMAT || rc == MS_ERR_NOMEM,
                  "unexpected status %s: %s", ms_status_name(rc), ms_errmsg());
    ckpt_manifest_free(&mf);
    return 0;
}
