/* cmd_sample.c - `megascale sample`: generate text from saved weights. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "ckpt/hf.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "model/gpt.h"

typedef struct {
    char *weights, *prompt, *device, *tokenizer;
    int tokens, top_k, threads, heads;
    double temperature;
    uint64_t seed;
} sample_config;

#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(sample_config, field), def, help }
static const opts_spec sample_opts[] = {
    O("weights", OPT_T_STR, weights, NULL,
      "weights file (HF GPT-2 safetensors, from --save-weights)"),
    O("prompt", OPT_T_STR, prompt, NULL, "text to continue (default: a newline)"),
    O("tokens", OPT_T_INT, tokens, "200", "tokens to generate"),
    O("temperature", OPT_T_DOUBLE, temperature, "0.8", "softmax temperature (0: greedy)"),
    O("top-k", OPT_T_INT, top_k, "40", "sample among the k most likely tokens (0: all)"),
    O("seed", OPT_T_U64, seed, "42", "sampling seed"),
    O("tokenizer", OPT_T_STR, tokenizer, "auto", "bytes, ids, or auto (bytes when vocab <= 256)"),
    O("heads", OPT_T_INT, heads, "0", "attention heads when the file does not say (0: C/64)"),
    O("device", OPT_T_STR, device, "cpu", "compute backend"),
    O("threads", OPT_T_INT, threads, "0", "CPU threads (0: all cores)"),
};
#define N_SAMPLE_OPTS ((int)(sizeof sample_opts / sizeof sample_opts[0]))

/* Draw a token from logits (V) with temperature and top-k. */
static int draw(float *logits, int V, double temp, int top_k, ms_rng *rng, float *work) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp <= 0) return best;
    float cut = -INFINITY;
    if (top_k > 0 && top_k < V) { /* k-th largest by partial selection on a copy */
        memcpy(work, logits, sizeof(float) * (size_t)V);
        for (int k = 0; k < top_k; k++) {
            int mi = k;
            for (int i = k + 1; i < V; i++)
                if (work[i] > work[mi]) mi = i;
            float t = work[k];
            work[k] = work[mi];
            work[mi] = t;
        }
        cut = work[top_k - 1];
    }
    double sum = 0;
    for (int i = 0; i < V; i++) {
        double p = logits[i] >= cut ? exp((logits[i] - logits[best]) / temp) : 0;
        work[i] = (float)p;
        sum += p;
    }
    double u = ms_rng_next_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += work[i];
        if (u < acc) return i;
    }
    return best;
}

static void emit(int tok, int bytes) {
    if (bytes)
        putchar(tok);
    else
        printf(" %d", tok);
    fflush(stdout);
}

static ms_status run_sample(const sample_config *sc) {
    if (!sc->weights || !*sc->weights) return ms_error(MS_ERR_ARG, "--weights FILE is required");
    gpt_config c;
    MS_TRY(ckpt_hf_read_config(sc->weights, sc->heads, &c));
    int bytes =
        !strcmp(sc->tokenizer, "bytes") || (!strcmp(sc->tokenizer, "auto") && c.vocab <= 256);
    if (bytes && c.vocab < 256)
        return ms_error(MS_ERR_ARG, "%s: vocab %d is too small for the bytes tokenizer",
                        sc->weights, c.vocab);
    const char *prompt = sc->prompt && *sc->prompt ? sc->prompt : "\n";
    int n_prompt = (int)strlen(prompt), T = c.seq_max;
    if (!bytes)
        return ms_error(MS_ERR_ARG, "%s: vocab %d needs a tokenizer (only 'bytes' is built in yet)",
                        sc->weights, c.vocab);
    be_backend *be = NULL;
    gpt_model *m = NULL;
    int32_t *ctx = NULL;
    float *logits = NULL, *work = NULL;
    ms_status st = be_create(&be, sc->device, sc->threads);
    if (st == MS_OK) st = gpt_create(&m, &c, be, 1, T);
    if (st == MS_OK) st = ckpt_hf_load(m, sc->weights);
    if (st != MS_OK) goto out;
    int cap = n_prompt + sc->tokens;
    ctx = malloc(sizeof(int32_t) * (size_t)cap);
    logits = malloc(sizeof(float) * (size_t)c.vocab);
    work = malloc(sizeof(float) * (size_t)c.vocab);
    if (!ctx || !logits || !work) {
        st = ms_error(MS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_prompt; i++)
        ctx[i] = (unsigned char)prompt[i];
    fputs(prompt, stdout);
    ms_rng rng = ms_rng_make(sc->seed, 0x5a3b1e);
    for (int n = n_prompt; n < cap; n++) {
        int start = n > T ? n - T : 0;
        gpt_forward_logits(m, ctx + start, 1, n - start, 1, logits);
        ctx[n] = draw(logits, c.vocab, sc->temperature, sc->top_k, &rng, work);
        emit(ctx[n], bytes);
    }
    putchar('\n');
out:
    free(ctx);
    free(logits);
    free(work);
    gpt_destroy(m);
    if (be) be_destroy(be);
    return st;
}

int cmd_sample(int argc, char **argv) {
    sample_config sc = {0};
    char *pos[1];
    int npos, help, rc = 0;
    ms_status st = opts_parse(sample_opts, N_SAMPLE_OPTS, &sc, argc, argv, pos, 0, &npos, &help);
    if (help)
        opts_print_help(sample_opts, N_SAMPLE_OPTS,
                        "usage: megascale sample --weights FILE [options]");
    else if (st != MS_OK || (st = run_sample(&sc)) != MS_OK)
        rc = cli_fail("sample", st);
    opts_free(sample_opts, N_SAMPLE_OPTS, &sc);
    return rc;
}
