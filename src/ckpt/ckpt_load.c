/* ckpt_load.c - reading a commit: validation (manifest, step, the tensors
 * against the manifest's model, file sizes, safetensors headers, every
 * slice's CRC32C, each box and range, every element covered exactly once:
 * ckpt_reader_open, the one routine behind verify, inspect and load),
 * assembly of logical tensors from any set of slices, and loading into a
 * model and optimiser: the reader (rank 0 of the dp group) broadcasts each
 * logical tensor, every rank keeps the parameters and its own m/v runs. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/fileio.h"
#include "ckpt/ckpt_internal.h"
#include "ckpt/safetensors.h"

struct ckpt_reader {
    char dir[4096];
    ckpt_manifest mf;
    ckpt_st_file **files;
    const ckpt_st_tensor **data; /* per slice */
};

void ckpt_reader_close(ckpt_reader *r) {
    if (!r) return;
    for (int i = 0; r->files && i < r->mf.n_files; i++)
        ckpt_st_close(r->files[i]);
    free(r->files);
    free(r->data);
    ckpt_manifest_free(&r->mf);
    free(r);
}

const ckpt_manifest *ckpt_reader_manifest(const ckpt_reader *r) {
    return &r->mf;
}

int ckpt_dir_step(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    const char *b = dir + n;
    while (b > dir && b[-1] != '/')
        b--;
    int step, len = 0;
    if (strncmp(b, "step_", 5) || sscanf(b + 5, "%d%n", &step, &len) != 1 || b + 5 + len != dir + n)
        return -1;
    return step;
}

static ms_status open_files(ckpt_reader *r) {
    ckpt_manifest *mf = &r->mf;
    r->files = calloc((size_t)mf->n_files, sizeof *r->files);
    if (!r->files) return ms_error(MS_ERR_NOMEM, "%s: out of memory", r->dir);
    for (int i = 0; i < mf->n_files; i++) {
        char path[4300];
        uint64_t size = 0;
        snprintf(path, sizeof path, "%s/%s", r->dir, mf->files[i].name);
        MS_TRY(ms_file_size(path, &size));
        if (size != mf->files[i].bytes)
            return ms_error(MS_ERR_FORMAT,
                            "%s: %" PRIu64 " bytes, but the manifest says %" PRIu64
                            " (truncated or overwritten)",
                            path, size, mf->files[i].bytes);
        MS_TRY(ckpt_st_open(&r->files[i], path));
    }
    return MS_OK;
}

static ms_status check_slices(ckpt_reader *r, int verify_crc) {
    ckpt_manifest *mf = &r->mf;
    r->data = calloc((size_t)mf->n_slices + 1, sizeof *r->data);
    if (!r->data) return ms_error(MS_ERR_NOMEM, "%s: out of memory", r->dir);
    for (int i = 0; i < mf->n_slices; i++) {
        const ckpt_slice *s = &mf->slices[i];
        const char *tn = mf->tensors[s->tensor].name, *fn = mf->files[s->file].name;
        const ckpt_st_tensor *t = ckpt_st_find(r->files[s->file], s->key);
        if (!t)
            return ms_error(MS_ERR_FORMAT, "%s/%s: tensor '%s' (%s): slice '%s' is missing", r->dir,
                            fn, tn, ckpt_kind_name(s->kind), s->key);
        if (t->dtype != CKPT_ST_F32 || s->end < s->begin ||
            t->nbytes != (s->end - s->begin) * sizeof(float))
            return ms_error(MS_ERR_FORMAT,
                            "%s/%s: tensor '%s' (%s): slice '%s' holds %zu bytes of %s, the "
                            "manifest says %" PRIu64 " F32 elements",
                            r->dir, fn, tn, ckpt_kind_name(s->kind), s->key, t->nbytes,
                            ckpt_st_dtype_name(t->dtype), s->end - s->begin);
        if (verify_crc) {
            uint32_t crc = ms_crc32c(0, t->data, t->nbytes);
            if (crc != s->crc)
                return ms_error(MS_ERR_FORMAT,
                                "%s/%s: tensor '%s' (%s, elements [%" PRIu64 ", %" PRIu64
                                ")): CRC32C 0x%08x, the manifest says 0x%08x (damaged data)",
                                r->dir, fn, tn, ckpt_kind_name(s->kind), s->begin, s->end, crc,
                                s->crc);
        }
        r->data[i] = t;
    }
    return MS_OK;
}

/* Mark the bits [lo, hi) of bm; the first one already set goes to *twice
 * (returns 1), else 0. */
static int bits_claim(uint64_t *bm, uint64_t lo, uint64_t hi, uint64_t *twice) {
    int clash = 0;
    while (lo < hi) {
        uint64_t w = lo / 64, b = lo % 64, n = hi - lo < 64 - b ? hi - lo : 64 - b;
        uint64_t mask = (n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << b;
        if (!clash && (bm[w] & mask)) {
            clash = 1;
            *twice = w * 64 + (uint64_t)__builtin_ctzll(bm[w] & mask);
        }
        bm[w] |= mask;
        lo += n;
    }
    return clash;
}

/* Mark the logical elements of slice s (checked: its box lies in t) in bm,
 * one contiguous piece per box row; 1 and *twice if one was marked already. */
static int claim_slice(uint64_t *bm, const ckpt_tensor_info *t, const ckpt_slice *s,
                       uint64_t *twice) {
    if (t->ndim == 1)
        return bits_claim(bm, (uint64_t)s->box_off[0] + s->begin, (uint64_t)s->box_off[0] + s->end,
                          twice);
    uint64_t bc = (uint64_t)s->box_shape[1], C = (uint64_t)t->shape[1];
    if (bc == C) { /* whole rows: one piece */
        uint64_t lo = (uint64_t)s->box_off[0] * C + s->begin;
        return bits_claim(bm, lo, lo + (s->end - s->begin), twice);
    }
    int clash = 0;
    uint64_t at = 0;
    for (uint64_t k = s->begin; k < s->end;) {
        uint64_t row = k / bc, col = k % bc, len = bc - col;
        if (len > s->end - k) len = s->end - k;
        uint64_t lo = ((uint64_t)s->box_off[0] + row) * C + (uint64_t)s->box_off[1] + col;
        if (bits_claim(bm, lo, lo + len, &at) && !clash) clash = 1, *twice = at;
        k += len;
    }
    return clash;
}

/* Every (tensor, state) is covered exactly once (docs/formats.md): each
 * slice's box lies in its tensor and its range in the box, the element
 * counts add up, and no element is held by two slices (so none is missing
 * either). */
static ms_status check_coverage(ckpt_reader *r) {
    ckpt_manifest *mf = &r->mf;
    uint64_t maxel = 0;
    for (int i = 0; i < mf->n_slices; i++) {
        const ckpt_slice *s = &mf->slices[i];
        char where[4400];
        snprintf(where, sizeof where, "%s/%s", r->dir, mf->files[s->file].name);
        MS_TRY(ckpt_slice_check(&mf->tensors[s->tensor], s, where));
    }
    for (int t = 0; t < mf->n_tensors; t++)
        for (int k = 0; k < CKPT_NKINDS; k++) {
            uint64_t sum = 0, numel = ckpt_numel(&mf->tensors[t]);
            for (int i = 0; i < mf->n_slices; i++)
                if (mf->slices[i].tensor == t && mf->slices[i].kind == k)
                    sum += mf->slices[i].end - mf->slices[i].begin;
            if (sum != numel) /* before the bitmap: numel is then backed by real bytes */
                return ms_error(MS_ERR_FORMAT,
                                "%s: tensor '%s' (%s): slices hold %" PRIu64 " of %" PRIu64
                                " elements",
                                r->dir, mf->tensors[t].name, ckpt_kind_name(k), sum, numel);
            if (numel > maxel) maxel = numel;
        }
    size_t words = (size_t)((maxel + 63) / 64);
    uint64_t *bm = malloc(words * sizeof *bm + 8);
    if (!bm) return ms_error(MS_ERR_NOMEM, "%s: out of memory", r->dir);
    ms_status st = MS_OK;
    for (int t = 0; st == MS_OK && t < mf->n_tensors; t++)
        for (int k = 0; st == MS_OK && k < CKPT_NKINDS; k++) {
            const ckpt_tensor_info *ti = &mf->tensors[t];
            memset(bm, 0, (size_t)((ckpt_numel(ti) + 63) / 64) * sizeof *bm);
            for (int i = 0; st == MS_OK && i < mf->n_slices; i++) {
                const ckpt_slice *s = &mf->slices[i];
                uint64_t twice = 0;
                if (s->tensor == t && s->kind == k && claim_slice(bm, ti, s, &twice))
                    st = ms_error(MS_ERR_FORMAT,
                                  "%s: tensor '%s' (%s): slices overlap: element %" PRIu64
                                  " is held twice (again by '%s'), so others are missing",
                                  r->dir, ti->name, ckpt_kind_name(k), twice, s->key);
            }
        }
    free(bm);
    return st;
}

/* The manifest's tensors are exactly the ones its model has (names,
 * shapes, order): what loading builds a model from must agree with what
 * the slices are checked against. */
static ms_status check_tensors(ckpt_reader *r) {
    const ckpt_manifest *mf = &r->mf;
    const gpt_config *c = &mf->model;
    ckpt_tensor_info *t = NULL;
    int n = 0;
    MS_TRY(ckpt_tensors_of_config(c, &t, &n));
    ms_status st = MS_OK;
    if (n != mf->n_tensors)
        st = ms_error(MS_ERR_FORMAT,
                      "%s/%s lists %d tensors, but its model (%d layers, %s block) has %d", r->dir,
                      CKPT_MANIFEST, mf->n_tensors, c->n_layer, gpt_block_name(c->block), n);
    for (int i = 0; st == MS_OK && i < n; i++) {
        const ckpt_tensor_info *a = &t[i], *b = &mf->tensors[i];
        if (strcmp(a->name, b->name) || a->ndim != b->ndim || a->shape[0] != b->shape[0] ||
            (a->ndim > 1 && a->shape[1] != b->shape[1]))
            st = ms_error(MS_ERR_FORMAT,
                          "%s/%s: tensor %d is '%s' (%" PRId64 " x %" PRId64
                          "), but its model (dim %d, vocab %d, seq-max %d) has '%s' (%" PRId64
                          " x %" PRId64 ") there",
                          r->dir, CKPT_MANIFEST, i, b->name, b->shape[0], b->shape[1], c->n_embd,
                          c->vocab, c->seq_max, a->name, a->shape[0], a->shape[1]);
    }
    free(t);
    return st;
}

ms_status ckpt_reader_open(ckpt_reader **out, const char *dir, int verify_crc) {
    *out = NULL;
    ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) return ms_error(MS_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    ms_status st = ckpt_manifest_read(dir, &r->mf);
    int ds = ckpt_dir_step(dir);
    if (st == MS_OK && ds >= 0 && ds != r->mf.step)
        st = ms_error(MS_ERR_FORMAT,
                      "%s/%s holds step %d, but the directory is step %d (a manifest from another "
                      "step)",
                      dir, CKPT_MANIFEST, r->mf.step, ds);
    if (st == MS_OK) st = check_tensors(r);
    if (st == MS_OK) st = open_files(r);
    if (st == MS_OK) st = check_slices(r, verify_crc);
    if (st == MS_OK) st = check_coverage(r);
    if (st != MS_OK) {
        ckpt_reader_close(r);
        return st;
    }
    *out = r;
    return MS_OK;
}

ms_status ckpt_reader_tensor(ckpt_reader *r, int t, int kind, float *dst) {
    const ckpt_manifest *mf = &r->mf;
    for (int i = 0; i < mf->n_slices; i++) {
        const ckpt_slice *s = &mf->slices[i];
        if (s->tensor != t || s->kind != kind) continue;
        char where[4300];
        snprintf(where, sizeof where, "%s/%s", r->dir, mf->files[s->file].name);
        MS_TRY(ckpt_slice_scatter(&mf->tensors[t], s, r->data[i]->data, dst, where));
    }
    return MS_OK;
}

ms_status ckpt_verify(const char *dir, ckpt_manifest *mf) {
    return ckpt_validate(dir, 1, mf);
}

ms_status ckpt_validate(const char *dir, int check_crc, ckpt_manifest *mf) {
    ckpt_reader *r;
    MS_TRY(ckpt_reader_open(&r, dir, check_crc));
    if (mf) {
        *mf = r->mf;
        memset(&r->mf, 0, sizeof r->mf);
        r->mf.n_files = mf->n_files; /* for closing the files */
    }
    ckpt_reader_close(r);
    return MS_OK;
}

ms_status ckpt_check_model(const ckpt_manifest *mf, gpt_model *m, const char *dir) {
    const gpt_config *c = gpt_get_config(m), *s = &mf->model;
    if (c->n_layer != s->n_layer || c->n_head != s->n_head || c->n_embd != s->n_embd ||
        c->vocab != s->vocab || c->seq_max != s->seq_max || c->block != s->block ||
        c->attn_window != s->attn_window)
        return ms_error(MS_ERR_ARG,
                        "%s holds another model (%d layers, dim %d, %d heads, vocab %d, seq-max "
                        "%d, %s block, window %d) than this run's (%d layers, dim %d, %d heads, "
                        "vocab %d, seq-max %d, %s block, window %d)",
                        dir, s->n_layer, s->n_embd, s->n_head, s->vocab, s->seq_max,
                        gpt_block_name(s->block), s->attn_window, c->n_layer, c->n_embd, c->n_head,
                        c->vocab, c->seq_max, gpt_block_name(c->block), c->attn_window);
    ckpt_tensor_info *t = NULL;
    int n = 0;
    MS_TRY(ckpt_tensors_of(m, &t, &n));
    ms_status st = n == mf->n_tensors ? MS_OK
                                      : ms_error(MS_ERR_ARG, "%s: %d tensors, the model has %d",
                                                 dir, mf->n_tensors, n);
    for (int i = 0; st == MS_OK && i < n; i++)
        if (strcmp(t[i].name, mf->tensors[i].name) || t[i].ndim != mf->tensors[i].ndim ||
            t[i].shape[0] != mf->tensors[i].shape[0] ||
            (t[i].ndim > 1 && t[i].shape[1] != mf->tensors[i].shape[1]))
            st = ms_error(MS_ERR_ARG,
                          "%s: tensor %d is '%s' (%" PRId64 " x %" PRId64
                          "), the model's is '%s' (%" PRId64 " x %" PRId64 ")",
                          dir, i, mf->tensors[i].name, mf->tensors[i].shape[0],
                          mf->tensors[i].shape[1], t[i].name, t[i].shape[0], t[i].shape[1]);
    free(t);
    return st;
}

void ckpt_run_put(gpt_model *m, const ckpt_run *r, int kind, const ckpt_tensor_info *t,
                  const float *src) {
    be_backend *be = gpt_backend(m);
    uint64_t C = t->ndim > 1 ? (uint64_t)t->shape[1] : 1, bw = r->width;
    for (uint64_t k = r->begin; k < r->end;) {
        size_t pos = 0, len = ckpt_run_seg(r, k, &pos);
        for (size_t done = 0; done < len;) { /* the logical rows of the box */
            uint64_t kk = k + done, row = kk / bw, col = kk % bw, n = bw - col;
            if (n > len - done) n = len - done;
            const float *from =
                src +
                (t->ndim > 1 ? ((uint64_t)r->box_off[0] + row) * C + (uint64_t)r->box_off[1]
                             : (uint64_t)r->box_off[0]) +
                col + (t->ndim > 1 ? 0 : row * bw);
            float *to = kind == CKPT_PARAM
                            ? gpt_params(m) + pos + done
                            : (kind == CKPT_MOM ? r->mom : r->var) + (pos + done - r->state_off);
            be->to_device(be, to, from, n * sizeof(float));
            done += n;
        }
        k += len;
    }
}

/* Runs covering the whole local tensor i (every element, for parameters). */
static ms_status whole_runs(gpt_model *m, int i, int gi, ckpt_run **out, int *n) {
    const gpt_param *p = gpt_tensor(m, i);
    return ckpt_runs_of_range(m, i, gi, p->offset, p->numel, out, n);
}

ms_status ckpt_load_into(ckpt_reader *r, comm_group *dp, gpt_model *m, const ckpt_run *runs,
                         int n_runs) {
    ckpt_tensor_info *tens = NULL;
    int nt = 0;
    MS_TRY(ckpt_tensors_of(m, &tens, &nt));
    uint64_t maxel = 0;
    for (int t = 0; t < nt; t++)
        if (ckpt_numel(&tens[t]) > maxel) maxel = ckpt_numel(&tens[t]);
    float *buf = calloc(maxel + 1, sizeof(float));
    ms_status st = buf ? MS_OK : ms_error(MS_ERR_NOMEM, "checkpoint load: out of memory");
    /* a whole-tensor view of the local table, for the parameters */
    for (int i = 0; st == MS_OK && i < gpt_num_tensors(m); i++) {
        int t = ckpt_tensor_find(tens, nt, gpt_tensor(m, i)->name);
        if (t < 0) {
            st = ms_error(MS_ERR_INTERNAL, "checkpoint load: unknown tensor '%s'",
                          gpt_tensor(m, i)->name);
            break;
        }
        uint64_t numel = ckpt_numel(&tens[t]);
        ckpt_run *whole = NULL;
        int nw = 0;
        st = whole_runs(m, i, t, &whole, &nw);
        for (int k = 0; st == MS_OK && k < CKPT_NKINDS; k++) {
            int need = k == CKPT_PARAM;
            for (int j = 0; !need && j < n_runs; j++)
                need = runs[j].local == i;
            if (dp) { /* the same decision on every rank of dp (m/v: any rank) */
                int32_t v = need, any = 0;
                st = comm_allreduce(dp, &v, &any, 1, COMM_I32, COMM_MAX);
                need = any;
            }
            if (st != MS_OK || !need) continue;
            if (r) {
                int rt = ckpt_tensor_find(r->mf.tensors, r->mf.n_tensors, tens[t].name);
                st = rt < 0 ? ms_error(MS_ERR_FORMAT, "%s: no tensor '%s'", r->dir, tens[t].name)
                            : ckpt_reader_tensor(r, rt, k, buf);
            }
            if (dp) { /* the reader's failure must not leave the others waiting */
                int32_t bad = st != MS_OK, any = 0;
                ms_status cs = comm_allreduce(dp, &bad, &any, 1, COMM_I32, COMM_MAX);
                if (cs != MS_OK)
                    st = cs;
                else if (any && st == MS_OK)
                    st = ms_error(MS_ERR_FORMAT, "the reading rank failed (see its log)");
                if (st == MS_OK) st = comm_broadcast(dp, buf, numel, COMM_F32, 0);
            }
            if (st != MS_OK) break;
            if (k == CKPT_PARAM) {
                for (int j = 0; j < nw; j++)
                    ckpt_run_put(m, &whole[j], k, &tens[t], buf);
                continue;
            }
            for (int j = 0; j < n_runs; j++)
                if (runs[j].local == i) ckpt_run_put(m, &runs[j], k, &tens[t], buf);
        }
        free(whole);
    }
    if (st == MS_OK) gpt_params_updated(m);
    free(buf);
    free(tens);
    return st;
}

ms_status ckpt_load_snapshot(const ckpt_snap_view *v, gpt_model *m, const ckpt_run *runs,
                             int n_runs) {
    be_backend *be = gpt_backend(m);
    for (int i = 0; i < n_runs; i++) {
        const ckpt_run *r = &runs[i], *s = &v->runs[i];
        size_t n = r->end - r->begin;
        const float *d = v->data + s->data_off;
        for (uint64_t k = r->begin; k < r->end;) {
            size_t pos = 0, len = ckpt_run_seg(r, k, &pos), o = k - r->begin;
            be->to_device(be, gpt_params(m) + pos, d + o, len * sizeof(float));
            be->to_device(be, r->mom + (pos - r->state_off), d + n + o, len * sizeof(float));
            be->to_device(be, r->var + (pos - r->state_off), d + 2 * n + o, len * sizeof(float));
            k += len;
        }
    }
    gpt_params_updated(m);
    return MS_OK;
}

int ckpt_snap_matches(const ckpt_snap_view *v, const ckpt_run *runs, int n_runs) {
    if (v->n_runs != n_runs) return 0;
    for (int i = 0; i < n_runs; i++)
        if (v->runs[i].tensor != runs[i].tensor || v->runs[i].begin != runs[i].begin ||
            v->runs[i].end != runs[i].end || v->runs[i].box_off[0] != runs[i].box_off[0] ||
            v->runs[i].box_off[1] != runs[i].box_off[1])
            return 0;
    return 1;
}
