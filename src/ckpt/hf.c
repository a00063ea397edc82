/* hf.c - Hugging Face GPT-2 safetensors import / export of model weights.
 *
 * Tensor-parallel models store shards (gpt_param.split): saving gathers
 * every split tensor over the model's tp group and places each element at
 * its logical index (gpt_logical_index), loading takes this rank's
 * elements from the logical tensors of the file.  A pipeline stage loads
 * only its tensors; hf_pipe.c exports a pipeline-parallel model. */
#include "ckpt/hf.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/fileio.h"
#include "base/finite.h"
#include "base/log.h"
#include "ckpt/ckpt.h"
#include "ckpt/hf_internal.h"
#include "ckpt/llmc.h"
#include "ckpt/safetensors.h"

/* The tensor's shape in the file: its logical shape, wte without padding. */
void ckpt_hf_file_shape(const gpt_model *m, const gpt_param *p, int64_t *shape) {
    shape[0] = p->shape[0];
    shape[1] = p->shape[1];
    if (!strcmp(p->name, "wte.weight")) shape[0] = gpt_get_config(m)->vocab;
}

static size_t file_numel(const gpt_model *m, const gpt_param *p) {
    int64_t sh[2];
    ckpt_hf_file_shape(m, p, sh);
    return (size_t)sh[0] * (size_t)(p->ndim > 1 ? sh[1] : 1);
}

/* The logical tensors of a tensor-parallel model on tp rank 0 (*out, one
 * buffer, tensor i at offs[i]); collective over the tp group.  The other
 * ranks get *out = NULL. */
ms_status ckpt_hf_logical(gpt_model *m, const float *host, float **out, size_t *offs,
                          const char *path) {
    comm_group *g = gpt_tp_group(m);
    int P = gpt_tp_size(m), r = gpt_tp_rank(m), nt = gpt_num_tensors(m);
    size_t total = 0, most = 0;
    for (int i = 0; i < nt; i++) {
        offs[i] = total;
        total += file_numel(m, gpt_tensor(m, i));
        if (gpt_tensor(m, i)->numel > most) most = gpt_tensor(m, i)->numel;
    }
    float *full = r == 0 ? malloc(total * sizeof(float)) : NULL;
    float *parts = malloc((size_t)P * most * sizeof(float));
    int bad = !parts || (r == 0 && !full);
    ms_status st = comm_allreduce(g, &bad, &bad, 1, COMM_I32, COMM_MAX);
    if (st == MS_OK && bad)
        st = ms_error(MS_ERR_NOMEM, "%s: out of memory gathering weights", path);
    for (int i = 0; st == MS_OK && i < nt; i++) {
        const gpt_param *p = gpt_tensor(m, i);
        size_t lim = file_numel(m, p);
        if (p->split == GPT_SPLIT_NONE) {
            if (full) memcpy(full + offs[i], host + p->offset, p->numel * sizeof(float));
            continue;
        }
        st = comm_allgather(g, host + p->offset, parts, p->numel, COMM_F32);
        for (int q = 0; st == MS_OK && full && q < P; q++)
            for (size_t j = 0; j < p->numel; j++) {
                size_t k = gpt_logical_index(m, i, q, j);
                if (k < lim) full[offs[i] + k] = parts[(size_t)q * p->numel + j];
            }
    }
    free(parts);
    if (st != MS_OK) {
        free(full);
        full = NULL;
    }
    *out = full;
    return st;
}

/* The architecture as the file's metadata. */
ms_status ckpt_hf_write_meta(ckpt_st_writer *w, const gpt_config *c) {
    ms_status st = MS_OK;
    char buf[32];
#define META(k, v)                                                                                 \
    if (st == MS_OK) {                                                                             \
        snprintf(buf, sizeof buf, "%d", (v));                                                      \
        st = ckpt_st_writer_meta(w, k, buf);                                                       \
    }
    META("n_layer", c->n_layer);
    META("n_head", c->n_head);
    META("n_embd", c->n_embd);
    META("vocab_size", c->vocab);
    META("n_positions", c->seq_max);
    META("attn_window", c->attn_window);
#undef META
    if (st == MS_OK) st = ckpt_st_writer_meta(w, "block", gpt_block_name(c->block));
    if (st == MS_OK) st = ckpt_st_writer_meta(w, "format", "pt");
    return st;
}

ms_status ckpt_hf_add(ckpt_st_writer *w, ckpt_hf_conv *cv, const char *name, int ndim,
                      const int64_t *shape, const float *src) {
    if (cv->dtype == CKPT_ST_F32) return ckpt_st_writer_add(w, name, CKPT_ST_F32, ndim, shape, src);
    size_t n = 1;
    for (int k = 0; k < ndim; k++)
        n *= (size_t)shape[k];
    if (cv->n == cv->cap) {
        int cap = cv->cap ? 2 * cv->cap : 64;
        uint16_t **b = realloc(cv->bufs, sizeof *b * (size_t)cap);
        if (!b) return ms_error(MS_ERR_NOMEM, "out of memory converting to bf16");
        cv->bufs = b;
        cv->cap = cap;
    }
    uint16_t *h = malloc(n * sizeof *h + 2);
    if (!h) return ms_error(MS_ERR_NOMEM, "out of memory converting to bf16");
    cv->bufs[cv->n++] = h;
    for (size_t i = 0; i < n; i++)
        h[i] = ms_f32_to_bf16(src[i]);
    return ckpt_st_writer_add(w, name, CKPT_ST_BF16, ndim, shape, h);
}

void ckpt_hf_conv_free(ckpt_hf_conv *cv) {
    for (int i = 0; i < cv->n; i++)
        free(cv->bufs[i]);
    free(cv->bufs);
    cv->bufs = NULL;
    cv->n = cv->cap = 0;
}

ms_status ckpt_hf_dtype_parse(const char *s, ckpt_st_dtype *dt) {
    if (!s || !strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32")) {
        *dt = CKPT_ST_F32;
    } else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) {
        *dt = CKPT_ST_BF16;
    } else {
        return ms_error(MS_ERR_ARG, "--save-dtype %s: expected f32 or bf16", s);
    }
    return MS_OK;
}

void ckpt_hf_config_path(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t dir = (size_t)(base - path), len = strlen(path);
    if (!strcmp(base, "model.safetensors")) {
        snprintf(out, n, "%.*sconfig.json", (int)dir, path);
        return;
    }
    size_t stem = len > 12 && !strcmp(path + len - 12, ".safetensors") ? len - 12 : len;
    snprintf(out, n, "%.*s.config.json", (int)stem, path);
}

/* transformers' GPT2Config for this model, written atomically; a model
 * GPT2LMHeadModel cannot run (a parallel block, sliding-window attention)
 * gets none, and a line says why.  Then a config file already at that path
 * (written beside the weights this file replaced) is removed: it describes
 * another model, which from_pretrained would build and fill with these
 * weights. */
static ms_status write_config_json(const gpt_config *c, ckpt_st_dtype dtype, const char *path) {
    char cfg[4200];
    ckpt_hf_config_path(path, cfg, sizeof cfg);
    if (c->block != GPT_BLOCK_SERIAL || c->attn_window > 0) {
        int stale = unlink(cfg) == 0;
        if (!stale && errno != ENOENT)
            return ms_error(MS_ERR_IO,
                            "%s: the weights are written, but the config.json beside them, which "
                            "describes other weights, cannot be removed: %s",
                            cfg, strerror(errno));
        ms_info("weights: no %s%s: a %s block%s is not GPT-2's architecture for transformers", cfg,
                stale ? " (the one there, of the weights replaced, was removed)" : "",
                gpt_block_name(c->block),
                c->attn_window > 0 ? " with sliding-window attention" : "");
        return MS_OK;
    }
    char text[2048];
    snprintf(text, sizeof text,
             "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
             "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
             "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
             "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
             "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
             "  \"initializer_range\": 0.02,\n  \"tie_word_embeddings\": true,\n"
             "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"torch_dtype\": \"%s\"\n}\n",
             c->vocab, c->seq_max, c->seq_max, c->n_embd, c->n_layer, c->n_head,
             c->vocab > 50256 ? 50256 : c->vocab - 1, c->vocab > 50256 ? 50256 : c->vocab - 1,
             dtype == CKPT_ST_BF16 ? "bfloat16" : "float32");
    if (ms_file_write_atomic(cfg, text, strlen(text)) == MS_OK) return MS_OK;
    /* the weights are in place: the config.json of the weights they
     * replaced (the failed write left it whole) must not stay beside them,
     * or from_pretrained builds that model and fills it with these */
    char why[512];
    snprintf(why, sizeof why, "%s", ms_errmsg());
    int gone = unlink(cfg) == 0 || errno == ENOENT;
    return ms_error(MS_ERR_IO, "%s: the weights are written, but not their config.json (%s)%s",
                    path, why,
                    gone ? "" : "; the one there, of other weights, could not be removed either");
}

ms_status ckpt_hf_finish(ckpt_st_writer *w, const gpt_config *c, ckpt_st_dtype dtype,
                         const char *path) {
    ms_status st = ckpt_hf_write_meta(w, c);
    if (st == MS_OK) st = ckpt_st_writer_meta(w, "dtype", dtype == CKPT_ST_BF16 ? "bf16" : "f32");
    if (st == MS_OK) st = ckpt_st_write(w, path);
    if (st == MS_OK) st = write_config_json(c, dtype, path);
    return st;
}

ms_status ckpt_hf_save(gpt_model *m, const char *path, ckpt_st_dtype dtype) {
    const gpt_config *c = gpt_get_config(m);
    be_backend *be = gpt_backend(m);
    size_t n = gpt_num_elements(m), *offs = malloc(sizeof(size_t) * (size_t)gpt_num_tensors(m));
    float *host = malloc(n * sizeof(float)), *full = NULL;
    ckpt_hf_conv cv = {.dtype = dtype};
    if (!host || !offs) {
        free(host);
        free(offs);
        return ms_error(MS_ERR_NOMEM, "%s: out of memory staging weights", path);
    }
    be->to_host(be, host, gpt_params(m), n * sizeof(float));
    ms_status st = MS_OK;
    if (gpt_tp_size(m) > 1) {
        st = ckpt_hf_logical(m, host, &full, offs, path);
        if (st != MS_OK || !full) goto out; /* tp ranks other than 0 write nothing */
    } else {
        for (int i = 0; i < gpt_num_tensors(m); i++)
            offs[i] = gpt_tensor(m, i)->offset;
    }
    const float *src = full ? full : host;
    ckpt_st_writer *w = ckpt_st_writer_create();
    st = w ? MS_OK : ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; st == MS_OK && i < gpt_num_tensors(m); i++) {
        const gpt_param *p = gpt_tensor(m, i);
        int64_t shape[2];
        ckpt_hf_file_shape(m, p, shape);
        st = ckpt_hf_add(w, &cv, p->name, p->ndim, shape, src + offs[i]);
    }
    if (st == MS_OK) st = ckpt_hf_finish(w, c, dtype, path);
    ckpt_st_writer_destroy(w);
out:
    ckpt_hf_conv_free(&cv);
    free(full);
    free(offs);
    free(host);
    return st;
}

/* The tensors of a weights file: safetensors, or llm.c's model file (its
 * tensors under Hugging Face names and shapes, llmc.h). */
typedef struct {
    ckpt_st_file *st;
    ckpt_llmc_file *llmc;
} weights_file;

static ms_status wf_open(weights_file *w, const char *path) {
    *w = (weights_file){0};
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) /* not "not a regular file" */
        return ckpt_is_checkpoint(path)
                   ? ms_error(MS_ERR_ARG,
                              "%s is a checkpoint, not a weights file: `megascale ckpt export "
                              "%s --out FILE` writes its weights as one file",
                              path, path)
                   : ms_error(MS_ERR_ARG,
                              "%s is a directory, not a weights file (a .safetensors file or "
                              "an llm.c .bin)",
                              path);
    return ckpt_llmc_probe(path) ? ckpt_llmc_open(&w->llmc, path) : ckpt_st_open(&w->st, path);
}

static void wf_close(weights_file *w) {
    ckpt_st_close(w->st);
    ckpt_llmc_close(w->llmc);
}

static int wf_count(const weights_file *w) {
    return w->st ? ckpt_st_count(w->st) : ckpt_llmc_count(w->llmc);
}

static const ckpt_st_tensor *wf_get(const weights_file *w, int i) {
    return w->st ? ckpt_st_get(w->st, i) : ckpt_llmc_get(w->llmc, i);
}

static const ckpt_st_tensor *wf_find_exact(const weights_file *w, const char *name) {
    if (w->st) return ckpt_st_find(w->st, name);
    for (int i = 0; i < wf_count(w); i++)
        if (!strcmp(wf_get(w, i)->name, name)) return wf_get(w, i);
    return NULL;
}

/* The metadata value of key; llm.c's files have none (their header is the
 * whole architecture). */
static const char *wf_meta(const weights_file *w, const char *key) {
    return w->st ? ckpt_st_meta(w->st, key) : NULL;
}

/* The tensor named `name`, with or without the "transformer." prefix. */
static const ckpt_st_tensor *find_tensor(const weights_file *f, const char *name) {
    const ckpt_st_tensor *t = wf_find_exact(f, name);
    if (t) return t;
    char pref[96];
    snprintf(pref, sizeof pref, "transformer.%s", name);
    return wf_find_exact(f, pref);
}

static const char *strip_prefix(const char *name) {
    return strncmp(name, "transformer.", 12) == 0 ? name + 12 : name;
}

static void fmt_shape(char *buf, size_t n, const int64_t *shape, int ndim) {
    int k = snprintf(buf, n, "(");
    for (int d = 0; d < ndim && (size_t)k < n; d++)
        k += snprintf(buf + k, n - (size_t)k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if ((size_t)k < n) snprintf(buf + k, n - (size_t)k, ")");
}

/* 1 if nm is HF's causal-mask buffer of one of the model's layers:
 * exactly h.I.attn.bias or h.I.attn.masked_bias, I < n_layer.  (Any name
 * holding ".attn.bias" was skipped before: a layer the model has not, or
 * junk.attn.bias.x, loaded without a word.) */
static int mask_buffer(const char *nm, int n_layer) {
    if (strncmp(nm, "h.", 2)) return 0;
    const char *p = nm + 2;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9')) return 0;
    long i = 0;
    for (; *p >= '0' && *p <= '9' && i <= INT_MAX; p++)
        i = i * 10 + (*p - '0');
    return i < n_layer && (!strcmp(p, ".attn.bias") || !strcmp(p, ".attn.masked_bias"));
}

/* Check every file tensor is known to the model (or the tied lm_head). */
static ms_status check_extra(gpt_model *m, const weights_file *f, const char *path) {
    for (int i = 0; i < wf_count(f); i++) {
        const char *nm = strip_prefix(wf_get(f, i)->name);
        if (!strcmp(nm, "lm_head.weight") || mask_buffer(nm, gpt_get_config(m)->n_layer))
            continue; /* tied head; HF's causal-mask buffers */
        if (gpt_find(m, nm) < 0 && !gpt_tensor_elsewhere(m, nm))
            return ms_error(MS_ERR_FORMAT,
                            "%s: tensor '%s' is not part of this model (%d layers, %s block)", path,
                            wf_get(f, i)->name, gpt_get_config(m)->n_layer,
                            gpt_block_name(gpt_get_config(m)->block));
        char pref[96];
        snprintf(pref, sizeof pref, "transformer.%s", nm);
        if (nm == wf_get(f, i)->name && wf_find_exact(f, pref)) /* which one is meant? */
            return ms_error(MS_ERR_FORMAT,
                            "%s: both '%s' and '%s' are present: ambiguous, the file holds two "
                            "copies of the tensor",
                            path, nm, pref);
    }
    return MS_OK;
}

/* An lm_head.weight in the file must be the tied head: wte's shape and, in
 * the same dtype, its bytes.  One of its own (an untied model) cannot be
 * held: the model's output head is wte, and ignoring the file's head would
 * load another model than the file's. */
/* 1 if the bf16 tensor b holds the f32 tensor f rounded to bf16 (a tied
 * head saved in the other precision); the shapes are equal. */
static int same_rounded(const ckpt_st_tensor *f, const ckpt_st_tensor *b) {
    size_t n = f->nbytes / 4;
    if (b->nbytes != 2 * n) return 0;
    for (size_t i = 0; i < n; i++) {
        float x;
        uint16_t y;
        memcpy(&x, (const char *)f->data + 4 * i, 4);
        memcpy(&y, (const char *)b->data + 2 * i, 2);
        if (ms_f32_to_bf16(x) != y) return 0;
    }
    return 1;
}

static ms_status check_head(const weights_file *f, const char *path) {
    const ckpt_st_tensor *h = find_tensor(f, "lm_head.weight"), *w = find_tensor(f, "wte.weight");
    if (!h || !w) return MS_OK;
    int shape = h->ndim == w->ndim && h->shape[0] == w->shape[0] &&
                (h->ndim < 2 || h->shape[1] == w->shape[1]);
    /* the same bytes, or in f32 and bf16 the one the other rounded (before,
     * any head in another dtype passed: an untied model loaded as a tied one) */
    int same = h->dtype == w->dtype ? h->nbytes == w->nbytes && !memcmp(h->data, w->data, h->nbytes)
               : h->dtype == CKPT_ST_BF16 && w->dtype == CKPT_ST_F32 ? same_rounded(w, h)
               : h->dtype == CKPT_ST_F32 && w->dtype == CKPT_ST_BF16 ? same_rounded(h, w)
                                                                     : 0;
    if (shape && same) return MS_OK;
    return ms_error(MS_ERR_FORMAT,
                    "%s: '%s' %s '%s': an output head of its own (an untied model), which this "
                    "model cannot hold (its head is wte, tied as in GPT-2)",
                    path, h->name, shape ? "differs from" : "has another shape than", w->name);
}

ms_status ckpt_hf_load(gpt_model *m, const char *path) {
    const gpt_config *c = gpt_get_config(m);
    be_backend *be = gpt_backend(m);
    weights_file wf, *f = &wf;
    MS_TRY(wf_open(f, path));
    size_t n = gpt_num_elements(m);
    float *host = calloc(n, sizeof(float));
    ms_status st =
        host ? check_extra(m, f, path) : ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    if (st == MS_OK) st = check_head(f, path);
    for (int i = 0; st == MS_OK && i < gpt_num_tensors(m); i++) {
        const gpt_param *p = gpt_tensor(m, i);
        const ckpt_st_tensor *t = find_tensor(f, p->name);
        if (!t) {
            st = ms_error(MS_ERR_FORMAT, "%s: tensor '%s' is missing", path, p->name);
            break;
        }
        int64_t want[2] = {p->shape[0], p->shape[1]};
        if (!strcmp(p->name, "wte.weight")) want[0] = c->vocab;
        int ok =
            t->ndim == p->ndim && t->shape[0] == want[0] && (p->ndim < 2 || t->shape[1] == want[1]);
        if (!ok) {
            char got[96], exp[96];
            fmt_shape(got, sizeof got, t->shape, t->ndim);
            fmt_shape(exp, sizeof exp, want, p->ndim);
            st = ms_error(MS_ERR_FORMAT, "%s: tensor '%s' has shape %s, the model needs %s", path,
                          t->name, got, exp);
            break;
        }
        if (t->dtype != CKPT_ST_F32 && t->dtype != CKPT_ST_BF16) {
            st = ms_error(MS_ERR_FORMAT,
                          "%s: tensor '%s' has dtype %s; only F32 and BF16 are supported", path,
                          t->name, ckpt_st_dtype_name(t->dtype));
            break;
        }
        size_t es = t->dtype == CKPT_ST_BF16 ? 2 : 4,
               lim = t->nbytes / es; /* wte: rows past V stay 0 */
        if (es == 4 && p->split == GPT_SPLIT_NONE) {
            memcpy(host + p->offset, t->data, t->nbytes);
            continue;
        }
        for (size_t j = 0; j < p->numel; j++) {
            size_t k = p->split == GPT_SPLIT_NONE ? j : gpt_logical_index(m, i, gpt_tp_rank(m), j);
            if (k >= lim) continue;
            const char *at = (const char *)t->data + k * es;
            if (es == 4) {
                memcpy(host + p->offset + j, at, 4);
            } else {
                uint16_t h;
                memcpy(&h, at, 2);
                host[p->offset + j] = ms_bf16_to_f32(h);
            }
        }
    }
    for (int i = 0; st == MS_OK && i < gpt_num_tensors(m); i++) { /* NaN or Inf: say where */
        const gpt_param *p = gpt_tensor(m, i);
        int64_t e = ms_first_nonfinite(host + p->offset, p->numel);
        if (e >= 0)
            st = ms_error(MS_ERR_FORMAT,
                          "%s: tensor '%s' holds a non-finite value (%g at element %lld): the "
                          "weights are corrupt or diverged",
                          path, p->name, (double)host[p->offset + (size_t)e], (long long)e);
    }
    if (st == MS_OK) {
        be->to_device(be, gpt_params(m), host, n * sizeof(float));
        gpt_params_updated(m);
    }
    free(host);
    wf_close(f);
    return st;
}

/* The metadata value of key as an int (def when absent); a value that is
 * not one ("2x", "", beyond an int) is an error naming the file and key. */
static ms_status meta_int(const weights_file *f, const char *path, const char *key, int def,
                          int *out) {
    const char *v = wf_meta(f, key);
    *out = def;
    if (!v) return MS_OK;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    /* digits only, a '-' at most (strtol also took " +1") */
    int plain = (v[0] == '-' ? v[1] : v[0]) >= '0' && (v[0] == '-' ? v[1] : v[0]) <= '9';
    if (!plain || end == v || *end || errno || x < INT_MIN || x > INT_MAX)
        return ms_error(MS_ERR_FORMAT, "%s: metadata %s = '%.40s' is not an integer", path, key, v);
    *out = (int)x;
    return MS_OK;
}

ms_status ckpt_hf_read_config(const char *path, int heads_hint, gpt_config *cfg) {
    if (ckpt_llmc_probe(path)) return ckpt_llmc_read_config(path, cfg);
    weights_file wf, *f = &wf;
    MS_TRY(wf_open(f, path));
    ms_status st = MS_OK;
    const ckpt_st_tensor *wte = find_tensor(f, "wte.weight"), *wpe = find_tensor(f, "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2) {
        st = ms_error(MS_ERR_FORMAT, "%s: no 2-D wte.weight / wpe.weight: not GPT-2 weights", path);
        goto out;
    }
    /* shapes past int are no model's (cut to int, [2^32 + 16, 0] read as 16) */
    if (wte->shape[0] > INT_MAX || wte->shape[1] > INT_MAX || wpe->shape[0] > INT_MAX) {
        st = ms_error(MS_ERR_FORMAT, "%s: wte.weight / wpe.weight has a dimension past 2^31", path);
        goto out;
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->vocab = (int)wte->shape[0];
    cfg->n_embd = (int)wte->shape[1];
    cfg->seq_max = (int)wpe->shape[0];
    /* the layers the file holds: h.I.ln_1.weight of the model's width each */
    int L = 0;
    char nm[64];
    for (;; L++) {
        snprintf(nm, sizeof nm, "h.%d.ln_1.weight", L);
        const ckpt_st_tensor *t = find_tensor(f, nm);
        if (!t) break;
        if (t->ndim != 1 || t->shape[0] != cfg->n_embd) {
            st = ms_error(MS_ERR_FORMAT, "%s: %s is not a vector of the width %d (wte's)", path,
                          t->name, cfg->n_embd);
            goto out;
        }
    }
    st = meta_int(f, path, "n_layer", L, &cfg->n_layer);
    /* the metadata may not promise more (or fewer) layers than the file
     * holds: the model is built from it before the tensors are read (a
     * 271 KB file saying 1024 layers built 495 MB of model first) */
    if (st == MS_OK && cfg->n_layer != L)
        st = ms_error(MS_ERR_FORMAT,
                      "%s: metadata n_layer = %d, but the file holds %d layer(s) (h.0 .. h.%d)",
                      path, cfg->n_layer, L, L - 1);
    /* the sizes the shapes give: metadata that says others is a damaged or hand-edited file,
     * never read past (n_positions 32 beside a wpe of 64 rows was taken without a word) */
    const struct {
        const char *key, *shape;
        int have;
    } sizes[] = {{"vocab_size", "wte.weight's rows", cfg->vocab},
                 {"n_embd", "wte.weight's columns", cfg->n_embd},
                 {"n_positions", "wpe.weight's rows", cfg->seq_max}};
    for (size_t i = 0; st == MS_OK && i < sizeof sizes / sizeof *sizes; i++) {
        int said = 0;
        st = meta_int(f, path, sizes[i].key, sizes[i].have, &said);
        if (st == MS_OK && said != sizes[i].have)
            st = ms_error(MS_ERR_FORMAT, "%s: metadata %s = %d, but %s are %d", path, sizes[i].key,
                          said, sizes[i].shape, sizes[i].have);
    }
    int hh = heads_hint > 0 ? heads_hint : (cfg->n_embd % 64 == 0 ? cfg->n_embd / 64 : 1);
    if (st == MS_OK) st = meta_int(f, path, "n_head", hh, &cfg->n_head);
    if (st != MS_OK) goto out;
    if (!wf_meta(f, "n_head") && heads_hint <= 0) /* the shapes do not say: never silently */
        ms_warn("%s has no n_head metadata: assuming %d heads (width %d / 64); pass --heads N if "
                "the model has another head count (a wrong one trains and samples garbage)",
                path, hh, cfg->n_embd);
    if ((st = meta_int(f, path, "attn_window", 0, &cfg->attn_window)) != MS_OK) goto out;
    const char *blk = wf_meta(f, "block");
    if (blk) {
        st = gpt_block_parse(blk, &cfg->block);
    } else {
        cfg->block = find_tensor(f, "h.0.ln_2.weight") ? GPT_BLOCK_SERIAL : GPT_BLOCK_PARALLEL;
    }
    if (st == MS_OK) st = gpt_config_validate(cfg);
    if (st != MS_OK) ms_error_wrap(st, "%s", path);
out:
    wf_close(f);
    return st;
}
