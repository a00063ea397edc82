/* gpt_dump.c - runs the model on the CPU backend and writes everything a
 * PyTorch reference needs to check it into one safetensors file:
 *   init.<name>   initial weights (HF names; wte without padding rows)
 *   tokens, targets (S,B,T) int32: one batch per optimiser step
 *   logits (B,T,V), loss (1): forward on batch 0
 *   grad.<name>   gradients of the mean loss on batch 0
 *   step_loss (S), step_lr (S): losses / learning rates of S optimiser steps
 *   final.<name>  weights after those steps
 * usage: gpt_dump OUT L C H V TMAX BLOCK W B T STEPS OPTIMIZER CLIP
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "ckpt/safetensors.h"
#include "model/gpt.h"
#include "optim/optim.h"

static void add_weights(ckpt_st_writer *w, gpt_model *m, const char *prefix, const float *buf,
                        char names[][96]) {
    const gpt_config *c = gpt_get_config(m);
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        const gpt_param *p = gpt_tensor(m, i);
        int64_t shape[2] = {p->shape[0], p->shape[1]};
        if (!strcmp(p->name, "wte.weight")) shape[0] = c->vocab;
        snprintf(names[i], 96, "%s%s", prefix, p->name);
        MS_CHECK(ckpt_st_writer_add(w, names[i], CKPT_ST_F32, p->ndim, shape, buf + p->offset) ==
                 MS_OK);
    }
}

int main(int argc, char **argv) {
    if (argc != 14) {
        fprintf(stderr, "usage: gpt_dump OUT L C H V TMAX BLOCK W B T STEPS OPTIMIZER CLIP\n");
        return 2;
    }
    gpt_config c = {0};
    c.n_layer = atoi(argv[2]);
    c.n_embd = atoi(argv[3]);
    c.n_head = atoi(argv[4]);
    c.vocab = atoi(argv[5]);
    c.seq_max = atoi(argv[6]);
    MS_CHECK(gpt_block_parse(argv[7], &c.block) == MS_OK);
    c.attn_window = atoi(argv[8]);
    int B = atoi(argv[9]), T = atoi(argv[10]), S = atoi(argv[11]);
    opt_config oc = {OPT_ADAMW, 0.9f, 0.95f, 1e-8f, 0.1f, (float)atof(argv[13])};
    MS_CHECK(opt_kind_parse(argv[12], &oc.kind) == MS_OK);
    opt_schedule sched = {OPT_SCHED_COSINE, 1e-3f, 2, S, 0.1f};

    be_backend *be;
    gpt_model *m;
    opt_state *o;
    MS_CHECK(be_cpu_create(&be, 0) == MS_OK);
    if (gpt_create(&m, &c, be, B, T) != MS_OK) {
        fprintf(stderr, "gpt_create: %s\n", ms_errmsg());
        return 1;
    }
    c = *gpt_get_config(m);
    gpt_init(m, 1234);
    MS_CHECK(opt_create(&o, &oc, m, NULL) == MS_OK);

    size_t ne = gpt_num_elements(m), bt = (size_t)B * T;
    int nt = gpt_num_tensors(m);
    float *init = malloc(ne * 4), *grad = malloc(ne * 4), *fin = malloc(ne * 4);
    float *logits = malloc(bt * (size_t)c.vocab * 4);
    int32_t *tok = malloc((size_t)S * bt * 4), *tgt = malloc((size_t)S * bt * 4);
    float *step_loss = malloc((size_t)S * 4), *step_lr = malloc((size_t)S * 4);
    char(*names)[96] = malloc((size_t)nt * 3 * 96);
    MS_CHECK(init && grad && fin && logits && tok && tgt && step_loss && step_lr && names);
    for (size_t i = 0; i < (size_t)S * bt; i++) {
        tok[i] = (int32_t)(ms_rng_u64(99, 1, i) % (uint64_t)c.vocab);
        tgt[i] = (int32_t)(ms_rng_u64(99, 2, i) % (uint64_t)c.vocab);
    }
    memcpy(init, gpt_params(m), ne * 4);
    gpt_forward_logits(m, tok, B, T, 0, logits);
    gpt_zero_grads(m);
    float loss = gpt_forward_backward(m, tok, tgt, B, T, 1.0f / (float)bt);
    memcpy(grad, gpt_grads(m), ne * 4);
    for (int s = 0; s < S; s++) {
        gpt_zero_grads(m);
        step_loss[s] = gpt_forward_backward(m, tok + s * bt, tgt + s * bt, B, T, 1.0f / (float)bt);
        step_lr[s] = opt_lr_at(&sched, s);
        opt_stats st;
        MS_CHECK(opt_step(o, step_lr[s], &st) == MS_OK);
    }
    memcpy(fin, gpt_params(m), ne * 4);

    ckpt_st_writer *w = ckpt_st_writer_create();
    add_weights(w, m, "init.", init, names);
    add_weights(w, m, "grad.", grad, names + nt);
    add_weights(w, m, "final.", fin, names + 2 * nt);
    int64_t sh3[3] = {S, B, T}, shl[3] = {B, T, c.vocab}, one[1] = {1}, ss[1] = {S};
    MS_CHECK(ckpt_st_writer_add(w, "tokens", CKPT_ST_I32, 3, sh3, tok) == MS_OK);
    MS_CHECK(ckpt_st_writer_add(w, "targets", CKPT_ST_I32, 3, sh3, tgt) == MS_OK);
    MS_CHECK(ckpt_st_writer_add(w, "logits", CKPT_ST_F32, 3, shl, logits) == MS_OK);
    MS_CHECK(ckpt_st_writer_add(w, "loss", CKPT_ST_F32, 1, one, &loss) == MS_OK);
    MS_CHECK(ckpt_st_writer_add(w, "step_loss", CKPT_ST_F32, 1, ss, step_loss) == MS_OK);
    MS_CHECK(ckpt_st_writer_add(w, "step_lr", CKPT_ST_F32, 1, ss, step_lr) == MS_OK);
    char meta[64];
    snprintf(meta, sizeof meta, "%d", c.n_head);
    ckpt_st_writer_meta(w, "n_head", meta);
    ckpt_st_writer_meta(w, "block", gpt_block_name(c.block));
    snprintf(meta, sizeof meta, "%d", c.attn_window);
    ckpt_st_writer_meta(w, "attn_window", meta);
    ckpt_st_writer_meta(w, "optimizer", opt_kind_name(oc.kind));
    snprintf(meta, sizeof meta, "%g", (double)oc.grad_clip);
    ckpt_st_writer_meta(w, "grad_clip", meta);
    if (ckpt_st_write(w, argv[1]) != MS_OK) {
        fprintf(stderr, "write: %s\n", ms_errmsg());
        return 1;
    }
    ckpt_st_writer_destroy(w);
    opt_destroy(o);
    gpt_destroy(m);
    be_destroy(be);
    free(init);
    free(grad);
    free(fin);
    free(logits);
    free(tok);
    free(tgt);
    free(step_loss);
    free(step_lr);
    free(names);
    return 0;
}
