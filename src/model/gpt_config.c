/* gpt_config.c - model presets, validation, parameter and flop counts. */
#include <stdio.h>
#include <string.h>

#include "model/gpt.h"

#define GPT_MAX_DIM (1 << 20) /* GPT-3 175B: 12288 */
#define GPT_MAX_SEQ 10000000  /* train's --seq-max and plan's range */

typedef struct {
    const char *name;
    int layers, dim, heads;
} gpt_preset;

static const gpt_preset presets[] = {
    {"d6", 6, 384, 6},     {"d12", 12, 768, 12},  {"d24", 24, 1024, 16},
    {"d36", 36, 1280, 20}, {"d48", 48, 1600, 25},
};

ms_status gpt_config_preset(gpt_config *cfg, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0) continue;
        memset(cfg, 0, sizeof *cfg);
        cfg->n_layer = presets[i].layers;
        cfg->n_embd = presets[i].dim;
        cfg->n_head = presets[i].heads;
        cfg->vocab = 50257;
        cfg->seq_max = 1024;
        cfg->block = GPT_BLOCK_SERIAL;
        cfg->attn_window = 0;
        return MS_OK;
    }
    return ms_error(MS_ERR_ARG, "unknown model preset '%s' (known: d6, d12, d24, d36, d48)", name);
}

const char *gpt_block_name(gpt_block b) {
    return b == GPT_BLOCK_PARALLEL ? "parallel" : "serial";
}

ms_status gpt_block_parse(const char *s, gpt_block *out) {
    if (!strcmp(s, "serial"))
        *out = GPT_BLOCK_SERIAL;
    else if (!strcmp(s, "parallel"))
        *out = GPT_BLOCK_PARALLEL;
    else
        return ms_error(MS_ERR_ARG, "unknown block type '%s' (serial or parallel)", s);
    return MS_OK;
}

ms_status gpt_config_validate(gpt_config *c) {
    if (c->n_layer < 1 || c->n_layer > 1024)
        return ms_error(MS_ERR_ARG, "layers must be in 1..1024 (got %d)", c->n_layer);
    if (c->n_embd < 1 || c->n_head < 1)
        return ms_error(MS_ERR_ARG, "dim and heads must be positive (got %d, %d)", c->n_embd,
                        c->n_head);
    if (c->n_embd > GPT_MAX_DIM) /* the sizes in bytes then fit in 64 bits (a message's too) */
        return ms_error(MS_ERR_ARG, "dim must be in 1..%d (got %d)", GPT_MAX_DIM, c->n_embd);
    if (c->n_embd % c->n_head != 0)
        return ms_error(MS_ERR_ARG, "dim %d is not divisible by heads %d", c->n_embd, c->n_head);
    if (c->vocab < 2 || c->vocab > (1 << 30))
        return ms_error(MS_ERR_ARG, "vocab must be in 2..2^30 (got %d)", c->vocab);
    if (c->seq_max < 1 || c->seq_max > GPT_MAX_SEQ)
        return ms_error(MS_ERR_ARG, "seq-max must be in 1..%d (got %d)", GPT_MAX_SEQ, c->seq_max);
    if (c->attn_window < 0)
        return ms_error(MS_ERR_ARG, "attn-window must be >= 0 (got %d)", c->attn_window);
    c->vocab_pad = (c->vocab + 127) / 128 * 128;
    return MS_OK;
}

size_t gpt_config_num_params(const gpt_config *c) {
    size_t C = (size_t)c->n_embd, L = (size_t)c->n_layer;
    size_t per_layer = 2 * C                              /* ln_1 */
                       + C * 3 * C + 3 * C                /* c_attn */
                       + C * C + C                        /* attn c_proj */
                       + C * 4 * C + 4 * C                /* c_fc */
                       + 4 * C * C + C;                   /* mlp c_proj */
    if (c->block == GPT_BLOCK_SERIAL) per_layer += 2 * C; /* ln_2 */
    return (size_t)c->vocab * C + (size_t)c->seq_max * C + L * per_layer + 2 * C;
}

int gpt_config_layer_tensors(const gpt_config *c) {
    /* ln_1 w, b; c_attn w, b; c_proj w, b; c_fc w, b; mlp c_proj w, b; a serial block's
     * ln_2 w, b (gpt_model.c's table) */
    return c->block == GPT_BLOCK_SERIAL ? 12 : 10;
}

double gpt_flops_per_token(const gpt_config *c, int T) {
    int teff = (c->attn_window > 0 && c->attn_window < T) ? c->attn_window : T;
    return 6.0 * (double)gpt_config_num_params(c) + 12.0 * c->n_layer * (double)teff * c->n_embd;
}

ms_status gpt_recompute_parse(const char *s, int *flags) {
    *flags = 0;
    if (!s || !*s || !strcmp(s, "none")) return MS_OK;
    char buf[64];
    if (strlen(s) >= sizeof buf) /* (before, cut to 63 characters: the rest was dropped) */
        return ms_error(MS_ERR_ARG,
                        "--recompute: %zu characters is not a list of none, gelu and ln",
                        strlen(s));
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "gelu"))
            *flags |= GPT_RECOMPUTE_GELU;
        else if (!strcmp(tok, "ln"))
            *flags |= GPT_RECOMPUTE_LN;
        else
            return ms_error(MS_ERR_ARG,
                            "--recompute %s: unknown activation '%s' (expected none, gelu, ln or "
                            "gelu,ln)",
                            s, tok);
    }
    return MS_OK;
}
