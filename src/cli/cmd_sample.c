/* cmd_sample.c - `megascale sample`: generate text from saved weights. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "ckpt/ckpt.h"
#include "ckpt/hf.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

typedef struct {
    char *weights, *prompt, *device, *tokenizer, *data_dir;
    int tokens, top_k, threads, heads, cuda_profile, cuda_fuse_gelu;
    double temperature;
    uint64_t seed;
} sample_config;

#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(sample_config, field), def, help, NULL, NULL, 0, 0 }
#define R(name, type, field, def, range, help)                                                     \
    { name, type, offsetof(sample_config, field), def, help, NULL, range, 0, 0 }
#define OE(name, type, field, def, env, range, help)                                               \
    { name, type, offsetof(sample_config, field), def, help, env, range, 0, 0 }
static const opts_spec sample_opts[] = {
    O("weights", OPT_T_STR, weights, NULL,
      "weights file (HF GPT-2 safetensors: --save-weights, ckpt export; llm.c .bin), or a "
      "checkpoint: a commit (DIR/step_N) or a checkpoint directory (its newest valid commit)"),
    O("prompt", OPT_T_STR, prompt, NULL,
      "text to continue (default: a newline; \"\": a new document, from end-of-text)"),
    R("tokens", OPT_T_INT, tokens, "200", "[0,16777216]", "tokens to generate"),
    R("temperature", OPT_T_DOUBLE, temperature, "0.8", "[0,)", "softmax temperature (0: greedy)"),
    R("top-k", OPT_T_INT, top_k, "40", "[0,)", "sample among the k most likely tokens (0: all)"),
    R("seed", OPT_T_U64, seed, "42", "[0,)", "sampling seed"),
    O("tokenizer", OPT_T_STR, tokenizer, "auto",
      "bytes, gpt2, a tokenizer file, ids, or auto (ids for vocab < 256, bytes up to 256, gpt2 for "
      "50257)"),
    OE("data-dir", OPT_T_STR, data_dir, MS_DATA_DIR, "MS_DATA_DIR", NULL,
       "directory of the shipped tokenizers (gpt2: DIR/gpt2.tok)"),
    R("heads", OPT_T_INT, heads, "0", "[0,)",
      "attention heads when the file does not say (0: C/64); else it must agree"),
    O("device", OPT_T_STR, device, "cpu", "compute backend"),
    R("threads", OPT_T_INT, threads, "0", "[0,1024]", "CPU threads (0: all cores)"),
    OE("cuda-profile", OPT_T_INT, cuda_profile, "0", "MS_CUDA_PROFILE", "[0,1]",
       "cuda: 1 times every op on the device and prints a table at exit"),
    OE("cuda-fuse-gelu", OPT_T_INT, cuda_fuse_gelu, "1", "MS_CUDA_FUSE_GELU", "[0,1]",
       "cuda: 1 fuses bias + GeLU into the GEMM epilogue, 0 runs them as a kernel of their own"),
};
#define N_SAMPLE_OPTS ((int)(sizeof sample_opts / sizeof sample_opts[0]))

/* Generated tokens and prompt bytes, each at most this many: their sum is
 * an int (it was a signed overflow). */
#define SAMPLE_MAX_TOKENS (1 << 24)

/* How tokens become text: bytes, a BPE tokenizer, or raw ids. */
typedef struct {
    int bytes;
    int vocab;           /* the model's: ids must be below it */
    data_tokenizer *tok; /* NULL for bytes / ids */
} sample_text;

static ms_status text_open(sample_text *tx, const char *name, const char *data_dir,
                           const gpt_config *c, const char *wpath) {
    memset(tx, 0, sizeof *tx);
    tx->vocab = c->vocab;
    if (!strcmp(name, "auto")) /* below 256 no byte tokenizer made the data: its own ids */
        name = c->vocab < 256      ? "ids"
               : c->vocab == 256   ? "bytes"
               : c->vocab == 50257 ? "gpt2"
                                   : NULL;
    if (!name)
        return ms_error(MS_ERR_ARG,
                        "%s: vocab %d: say which --tokenizer made the data (a file), or ids", wpath,
                        c->vocab);
    if (!strcmp(name, "ids")) return MS_OK;
    if (!strcmp(name, "bytes")) {
        if (c->vocab < 256)
            return ms_error(MS_ERR_ARG,
                            "%s: vocab %d is too small for bytes (256 ids): --tokenizer ids "
                            "takes and prints token ids",
                            wpath, c->vocab);
        tx->bytes = 1;
        return MS_OK;
    }
    MS_TRY(cli_tokenizer_load(&tx->tok, name, data_dir, "auto, gpt2, bytes, ids"));
    if (data_tok_vocab_size(tx->tok) > c->vocab)
        return ms_error(MS_ERR_ARG, "tokenizer %s has %d ids but the model only %d", name,
                        data_tok_vocab_size(tx->tok), c->vocab);
    return MS_OK;
}

/* Encode the prompt into ctx (at most cap ids). */
static ms_status text_encode(const sample_text *tx, const char *prompt, int32_t *ctx, int cap,
                             int *n) {
    size_t len = strlen(prompt);
    *n = 0;
    if (tx->tok) {
        uint32_t *ids = NULL;
        size_t nid = 0, c = 0;
        MS_TRY(data_tok_encode(tx->tok, prompt, len, &ids, &nid, &c));
        for (size_t i = 0; i < nid && *n < cap; i++)
            ctx[(*n)++] = (int32_t)ids[i];
        free(ids);
        return MS_OK;
    }
    if (!tx->bytes) { /* ids: the prompt is the ids themselves, "464 2068 7586" */
        for (const char *p = prompt; *p && *n < cap;) {
            if (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t') {
                p++;
                continue;
            }
            char *end = NULL;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= tx->vocab)
                return ms_error(MS_ERR_ARG,
                                "--prompt with --tokenizer ids: '%.20s' is not a token id in [0, "
                                "%d) (give ids separated by spaces or commas)",
                                p, tx->vocab);
            ctx[(*n)++] = (int32_t)v;
            p = end;
        }
        return MS_OK;
    }
    for (size_t i = 0; i < len && *n < cap; i++)
        ctx[(*n)++] = (unsigned char)prompt[i];
    return MS_OK;
}

/* An id the text's tokenizer has no bytes for (a model whose vocabulary is
 * larger than the tokenizer's, as a padded one is) is shown as <|id N|>,
 * not dropped or wrapped into another byte. */
static void emit(const sample_text *tx, int tok) {
    if (tx->tok) {
        uint32_t id = (uint32_t)tok;
        char *out = NULL;
        size_t len = 0;
        if (data_tok_decode(tx->tok, &id, 1, &out, &len) == MS_OK)
            fwrite(out, 1, len, stdout);
        else
            printf("<|id %d|>", tok);
        free(out);
    } else if (tx->bytes) {
        if (tok < 256)
            putchar(tok);
        else
            printf("<|id %d|>", tok);
    } else {
        printf(" %d", tok);
    }
    fflush(stdout);
}

/* The model of --weights: a weights file's, or a checkpoint's (its commit,
 * the newest valid one of a checkpoint directory, into commit; "" for a
 * file). */
static ms_status weights_config(const sample_config *sc, gpt_config *c, char *commit, size_t n) {
    commit[0] = 0;
    if (!ckpt_is_checkpoint(sc->weights)) return ckpt_hf_read_config(sc->weights, sc->heads, c);
    MS_TRY(ckpt_find_commit(sc->weights, commit, n));
    ckpt_manifest mf;
    MS_TRY(ckpt_validate(commit, 0, &mf)); /* the CRCs: when the parameters are read */
    *c = mf.model;
    ckpt_manifest_free(&mf);
    c->recompute = 0;
    return gpt_config_validate(c);
}

static ms_status run_sample(const sample_config *sc) {
    if (!sc->weights || !*sc->weights)
        return ms_error(MS_ERR_ARG, "--weights FILE (or a checkpoint) is required");
    /* --tokens has its range in the table (SAMPLE_MAX_TOKENS) */
    if (sc->prompt && strlen(sc->prompt) > SAMPLE_MAX_TOKENS)
        return ms_error(MS_ERR_ARG, "--prompt: longer than %d bytes", SAMPLE_MAX_TOKENS);
    gpt_config c;
    char commit[4300];
    ms_status ws = weights_config(sc, &c, commit, sizeof commit);
    if (ws != MS_OK) return ms_error_wrap(ws, "--weights");
    const char *src = commit[0] ? commit : sc->weights;
    if (sc->heads > 0 && sc->heads != c.n_head) /* as train --init-from and eval --weights */
        return ms_error(MS_ERR_ARG, "--heads %d disagrees with %s, which holds %d", sc->heads, src,
                        c.n_head);
    sample_text tx;
    be_backend *be = NULL;
    gpt_model *m = NULL;
    int32_t *ctx = NULL;
    float *logits = NULL, *work = NULL;
    /* no --prompt: a newline; an empty one: nothing, a document started (end-of-text) */
    const char *prompt = sc->prompt ? sc->prompt : "\n";
    int T = c.seq_max, cap = (int)strlen(prompt) + sc->tokens, n = 0;
    ms_status st = text_open(&tx, sc->tokenizer, sc->data_dir, &c, src);
    be_options bo = be_options_default();
    bo.threads = sc->threads;
    bo.cuda_profile = sc->cuda_profile;
    bo.cuda_fuse_gelu = sc->cuda_fuse_gelu;
    be_warn_ignored(sc->device, &bo);
    if (st == MS_OK) st = be_create(&be, sc->device, &bo);
    if (st == MS_OK) st = gpt_create(&m, &c, be, 1, T);
    if (st == MS_OK) { /* named by --weights, as every error of the weights */
        st = commit[0] ? ckpt_load_params(commit, m, NULL) : ckpt_hf_load(m, src);
        if (st != MS_OK) ms_error_wrap(st, "--weights");
    }
    if (st != MS_OK) goto out;
    ctx = malloc(sizeof(int32_t) * (size_t)(cap + 1));
    logits = malloc(sizeof(float) * (size_t)c.vocab);
    work = malloc(sizeof(float) * (size_t)c.vocab);
    if (!ctx || !logits || !work) {
        st = ms_error(MS_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((st = text_encode(&tx, prompt, ctx, cap, &n)) != MS_OK) goto out;
    int eot = tx.tok ? data_tok_eot(tx.tok) : -1;
    if (n == 0 && eot >= 0) { /* nothing to condition on: start a document (GPT-2's way) */
        ctx[n++] = eot;
    } else if (n == 0 && tx.bytes) {
        st = ms_error(MS_ERR_ARG,
                      "--prompt is empty, and the bytes tokenizer has no end-of-text token to "
                      "start a document with: give text to continue (without --prompt: a "
                      "newline)");
        goto out;
    } else if (n == 0 && tx.tok) { /* (it got the message of --tokenizer ids) */
        st = ms_error(MS_ERR_ARG,
                      "--prompt is empty, and the tokenizer %s has no end-of-text token to "
                      "start a document with: give text to continue",
                      data_tok_name(tx.tok));
        goto out;
    } else if (n == 0) {
        st = ms_error(MS_ERR_ARG,
                      "the --prompt%s holds no token id (--tokenizer ids: ids separated by "
                      "spaces, e.g. --prompt '464 2068'): give the context to continue (before, "
                      "id 0 was used without a word)",
                      sc->prompt ? "" : " (none given: the default, a newline,)");
        goto out;
    }
    fputs(prompt, stdout);
    ms_rng rng = ms_rng_make(sc->seed, 0x5a3b1e);
    for (int k = 0; k < sc->tokens; k++, n++) {
        int start = n > T ? n - T : 0;
        gpt_forward_logits(m, ctx + start, 1, n - start, 1, logits);
        for (int i = 0; i < c.vocab; i++)
            if (!isfinite(logits[i])) {
                putchar('\n');
                st = ms_error(MS_ERR_NONFINITE,
                              "%s: the logits after %d token(s) are not finite (%g at id %d): "
                              "the weights give NaN or Inf (a diverged run, or values too large "
                              "for fp32)",
                              src, n, (double)logits[i], i);
                goto out;
            }
        ctx[n] = gpt_sample_token(logits, c.vocab, sc->temperature, sc->top_k, &rng, work);
        if (ctx[n] == eot) break;
        emit(&tx, ctx[n]);
    }
    putchar('\n');
out:
    fflush(stdout); /* the text before the backend's exit line on stderr (a shared pipe) */
    free(ctx);
    free(logits);
    free(work);
    gpt_destroy(m);
    if (be) be_destroy(be);
    data_tok_free(tx.tok);
    return st;
}

int cmd_sample(int argc, char **argv) {
    sample_config sc = {0};
    char *pos[1];
    int npos, help, rc = 0;
    ms_status st = opts_parse(sample_opts, N_SAMPLE_OPTS, &sc, argc, argv, pos, 0, &npos, &help);
    if (st == MS_OK)
        st = opts_check_dir(sample_opts, N_SAMPLE_OPTS, &sc, "data-dir",
                            "the shipped tokenizers: DIR/gpt2.tok");
    if (help)
        opts_print_help(sample_opts, N_SAMPLE_OPTS,
                        "usage: megascale sample --weights FILE|CHECKPOINT [options]");
    else if (st != MS_OK || (st = run_sample(&sc)) != MS_OK)
        rc = cli_fail("sample", st);
    opts_free(sample_opts, N_SAMPLE_OPTS, &sc);
    return rc;
}
