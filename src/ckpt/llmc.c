/* llmc.c - llm.c's GPT-2 model files (see llmc.h for the layout). */
#include "ckpt/llmc.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"

#define HEADER_WORDS 256

typedef struct {
    int version, max_t, vocab, layers, heads, ch, vocab_pad;
    size_t esize;   /* bytes an element: 4 (v3) or 2 (v5) */
    uint64_t numel; /* parameters in the file */
} llmc_header;

struct ckpt_llmc_file {
    llmc_header h;
    ckpt_st_tensor *t;
    int n;
    char *names; /* n x 48 bytes */
    void *data;  /* the parameters in Hugging Face layout */
};

int ckpt_llmc_probe(const char *path) {
    /* a regular file only: opening a FIFO blocked for ever (the readers that follow say what
     * the path is) */
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t magic = 0;
    int ok = fread(&magic, sizeof magic, 1, f) == 1 && magic == CKPT_LLMC_MAGIC;
    fclose(f);
    return ok;
}

/* The header's words checked, and the parameter count they imply. */
static ms_status parse_header(const int32_t *w, uint64_t file_size, const char *path,
                              llmc_header *h) {
    if (w[0] != CKPT_LLMC_MAGIC)
        return ms_error(MS_ERR_FORMAT, "%s: bad magic %d (expected %d): not an llm.c model file",
                        path, w[0], CKPT_LLMC_MAGIC);
    if (w[1] != 3 && w[1] != 5)
        return ms_error(MS_ERR_FORMAT,
                        "%s: llm.c model version %d is not supported (3: fp32, 5: bf16; older "
                        "versions have no padded vocabulary: re-export with llm.c's train_gpt2.py)",
                        path, w[1]);
    struct {
        const char *what;
        int32_t v, max;
    } dims[] = {{"max_seq_len", w[2], 1 << 20}, {"vocab_size", w[3], 1 << 24},
                {"num_layers", w[4], 4096},     {"num_heads", w[5], 1 << 16},
                {"channels", w[6], 1 << 17},    {"padded_vocab_size", w[7], 1 << 24}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v < 1 || dims[i].v > dims[i].max)
            return ms_error(MS_ERR_FORMAT, "%s: header %s = %d is out of range 1..%d", path,
                            dims[i].what, dims[i].v, dims[i].max);
    if (w[7] < w[3])
        return ms_error(MS_ERR_FORMAT, "%s: padded_vocab_size %d is below vocab_size %d", path,
                        w[7], w[3]);
    *h = (llmc_header){.version = w[1],
                       .max_t = w[2],
                       .vocab = w[3],
                       .layers = w[4],
                       .heads = w[5],
                       .ch = w[6],
                       .vocab_pad = w[7],
                       .esize = w[1] == 3 ? 4 : 2};
    uint64_t C = (uint64_t)h->ch, L = (uint64_t)h->layers;
    /* at most 2^17 squared times 12 times 4096 layers: no overflow in 64 bits */
    h->numel =
        (uint64_t)h->vocab_pad * C + (uint64_t)h->max_t * C +
        L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C) +
        2 * C;
    uint64_t want = HEADER_WORDS * 4 + h->numel * h->esize;
    if (file_size != want)
        return ms_error(MS_ERR_FORMAT,
                        "%s: %llu bytes, but its header (%d layers, %d channels, vocab %d padded "
                        "to %d, %d positions, %s) implies %llu: the file is truncated or not "
                        "llm.c's",
                        path, (unsigned long long)file_size, h->layers, h->ch, h->vocab,
                        h->vocab_pad, h->max_t, h->version == 3 ? "fp32" : "bf16",
                        (unsigned long long)want);
    return MS_OK;
}

static void header_config(const llmc_header *h, gpt_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->n_layer = h->layers;
    cfg->n_head = h->heads;
    cfg->n_embd = h->ch;
    cfg->vocab = h->vocab;
    cfg->seq_max = h->max_t;
    cfg->block = GPT_BLOCK_SERIAL;
    cfg->attn_window = 0;
}

/* The header of the open file f checked against its size, and the model
 * it describes (validated) into *cfg. */
static ms_status read_header(FILE *f, const char *path, llmc_header *h, gpt_config *cfg) {
    struct stat sb; /* the size of the file open, not of whatever the path names now */
    if (fstat(fileno(f), &sb) != 0)
        return ms_error(MS_ERR_IO, "%s: fstat: %s", path, strerror(errno));
    uint64_t size = (uint64_t)sb.st_size;
    int32_t w[HEADER_WORDS];
    if (size < sizeof w)
        return ms_error(MS_ERR_FORMAT, "%s: %llu bytes, shorter than llm.c's 1024-byte header",
                        path, (unsigned long long)size);
    MS_TRY(ms_file_pread(f, path, w, sizeof w, 0));
    MS_TRY(parse_header(w, size, path, h));
    header_config(h, cfg);
    if (gpt_config_validate(cfg) != MS_OK) return ms_error_wrap(MS_ERR_FORMAT, "%s", path);
    return MS_OK;
}

ms_status ckpt_llmc_read_config(const char *path, gpt_config *cfg) {
    FILE *f = fopen(path, "rb");
    if (!f) return ms_error(MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    llmc_header h;
    ms_status st = read_header(f, path, &h, cfg);
    fclose(f);
    return st;
}

/* Reads tensor `name` of shape (d0[, d1]) from the file into the next free
 * bytes of the output; (out, in) matrices of the file (rows x cols = d1 x
 * d0) are transposed through the scratch buffer. */
typedef struct {
    ckpt_llmc_file *f;
    FILE *fp;
    const char *path;
    uint64_t at; /* file offset of the next parameter */
    char *dst;   /* the next free byte of the output */
    char *scratch;
} builder;

static ms_status add(builder *b, const char *name, int64_t d0, int64_t d1, int transpose) {
    ckpt_llmc_file *f = b->f;
    size_t es = f->h.esize, n = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    ckpt_st_tensor *t = &f->t[f->n];
    t->name = f->names + (size_t)f->n * 48;
    snprintf(t->name, 48, "%s", name);
    t->dtype = es == 4 ? CKPT_ST_F32 : CKPT_ST_BF16;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = b->dst;
    t->nbytes = n * es;
    MS_TRY(ms_file_pread(b->fp, b->path, transpose ? b->scratch : b->dst, n * es, b->at));
    if (transpose) /* file [d1][d0] -> out [d0][d1] */
        for (int64_t o = 0; o < d1; o++)
            for (int64_t i = 0; i < d0; i++)
                memcpy(b->dst + ((size_t)i * (size_t)d1 + (size_t)o) * es,
                       b->scratch + ((size_t)o * (size_t)d0 + (size_t)i) * es, es);
    b->at += n * es;
    b->dst += n * es;
    f->n++;
    return MS_OK;
}

/* One per-layer tensor of every layer: the file holds them layer after
 * layer, one kind at a time (all ln1w, then all ln1b, ...). */
static ms_status add_layers(builder *b, const char *suffix, int64_t d0, int64_t d1, int transpose) {
    for (int l = 0; l < b->f->h.layers; l++) {
        char nm[48];
        snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);
        MS_TRY(add(b, nm, d0, d1, transpose));
    }
    return MS_OK;
}

static ms_status read_tensors(builder *b) {
    const llmc_header *h = &b->f->h;
    int64_t C = h->ch, V = h->vocab;
    MS_TRY(add(b, "wte.weight", V, C, 0));
    b->at += (uint64_t)(h->vocab_pad - V) * (uint64_t)C * h->esize; /* padding rows */
    MS_TRY(add(b, "wpe.weight", h->max_t, C, 0));
    MS_TRY(add_layers(b, "ln_1.weight", C, 0, 0));
    MS_TRY(add_layers(b, "ln_1.bias", C, 0, 0));
    MS_TRY(add_layers(b, "attn.c_attn.weight", C, 3 * C, 1));
    MS_TRY(add_layers(b, "attn.c_attn.bias", 3 * C, 0, 0));
    MS_TRY(add_layers(b, "attn.c_proj.weight", C, C, 1));
    MS_TRY(add_layers(b, "attn.c_proj.bias", C, 0, 0));
    MS_TRY(add_layers(b, "ln_2.weight", C, 0, 0));
    MS_TRY(add_layers(b, "ln_2.bias", C, 0, 0));
    MS_TRY(add_layers(b, "mlp.c_fc.weight", C, 4 * C, 1));
    MS_TRY(add_layers(b, "mlp.c_fc.bias", 4 * C, 0, 0));
    MS_TRY(add_layers(b, "mlp.c_proj.weight", 4 * C, C, 1));
    MS_TRY(add_layers(b, "mlp.c_proj.bias", C, 0, 0));
    MS_TRY(add(b, "ln_f.weight", C, 0, 0));
    return add(b, "ln_f.bias", C, 0, 0);
}

ms_status ckpt_llmc_open(ckpt_llmc_file **out, const char *path) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return ms_error(MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    ckpt_llmc_file *f = calloc(1, sizeof *f);
    gpt_config c;
    ms_status st = f ? read_header(fp, path, &f->h, &c) : ms_error(MS_ERR_NOMEM, "out of memory");
    builder b = {.f = f, .fp = fp, .path = path, .at = HEADER_WORDS * 4};
    if (st == MS_OK) {
        size_t C = (size_t)f->h.ch, cap = 4 + 12 * (size_t)f->h.layers;
        f->data = malloc((size_t)f->h.numel * f->h.esize); /* wte's padding rows spare */
        b.dst = f->data;
        b.scratch = malloc(4 * C * C * f->h.esize); /* the largest matrix */
        f->t = calloc(cap, sizeof *f->t);
        f->names = calloc(cap, 48);
        if (!f->data || !b.scratch || !f->t || !f->names)
            st = ms_error(MS_ERR_NOMEM, "%s: out of memory for %llu bytes of weights", path,
                          (unsigned long long)(f->h.numel * f->h.esize));
    }
    if (st == MS_OK) st = read_tensors(&b);
    free(b.scratch);
    fclose(fp);
    if (st != MS_OK) {
        ckpt_llmc_close(f);
        return st;
    }
    *out = f;
    return MS_OK;
}

void ckpt_llmc_close(ckpt_llmc_file *f) {
    if (!f) return;
    free(f->t);
    free(f->names);
    free(f->data);
    free(f);
}

int ckpt_llmc_count(const ckpt_llmc_file *f) {
    return f->n;
}

const ckpt_st_tensor *ckpt_llmc_get(const ckpt_llmc_file *f, int i) {
    return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

void ckpt_llmc_config(const ckpt_llmc_file *f, gpt_config *cfg) {
    header_config(&f->h, cfg);
}
