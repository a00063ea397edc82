/* cmd_eval.c - `megascale eval`: the validation loss of saved weights (a
 * weights file or a checkpoint) over the fixed validation set, the number
 * training's validation passes report (train_eval). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "base/ctx.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "train/train.h"

typedef struct {
    train_config tc; /* the fields train_eval reads */
    int json;
} eval_cli;

/* As in cmd_train.c: O any value, R in `range`, OE from the environment
 * too; RL, OEL: may differ between the ranks of a job (opts_spec.per_rank). */
#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(eval_cli, field), def, help, NULL, NULL, 0, 0 }
#define R(name, type, field, def, range, help)                                                     \
    { name, type, offsetof(eval_cli, field), def, help, NULL, range, 0, 0 }
#define OE(name, type, field, def, env, range, help)                                               \
    { name, type, offsetof(eval_cli, field), def, help, env, range, 0, 0 }
#define RL(name, type, field, def, range, help)                                                    \
    { name, type, offsetof(eval_cli, field), def, help, NULL, range, 1, 0 }
#define OEL(name, type, field, def, env, range, help)                                              \
    { name, type, offsetof(eval_cli, field), def, help, env, range, 1, 0 }

static const opts_spec eval_opts[] = {
    O("weights", OPT_T_STR, tc.init_from, NULL,
      "weights file (HF GPT-2 safetensors: --save-weights, ckpt export, Hugging Face's; or an "
      "llm.c model file, .bin), or a checkpoint (as --ckpt)"),
    O("ckpt", OPT_T_STR, tc.resume, NULL,
      "a checkpoint: a commit (DIR/step_N) or a checkpoint directory (its newest valid commit)"),
    O("val-data", OPT_T_STR, tc.val_data, NULL,
      "glob of the token shards to score (with --ckpt: the run's, when left out)"),
    R("val-batches", OPT_T_INT, tc.val_batches, "0", "[0,)",
      "the set: the first N x --batch sequences of the data (train's --val-batches; 0: the "
      "checkpoint's, else 10)"),
    R("batch", OPT_T_INT, tc.batch, "0", "[0,16777216]",
      "sequences per validation batch (0: the checkpoint's --batch, else 8)"),
    R("micro-batch", OPT_T_INT, tc.micro_batch, "0", "[0,16777216]",
      "sequences per forward pass on one rank (0: --batch / dp); the loss does not depend on it"),
    R("seq", OPT_T_INT, tc.seq, "0", "[0,)",
      "tokens per sequence T (0: the checkpoint's --seq, else 256 or the model's seq-max if "
      "fewer)"),
    R("heads", OPT_T_INT, tc.heads, "0", "[0,)",
      "attention heads when the weights file does not say (0: C/64, with a warning)"),
    R("tp", OPT_T_INT, tc.tp, "1", "[1,65536]",
      "tensor-parallel ranks (divides heads and micro-batch*seq); dp is world / (tp x pp)"),
    R("pp", OPT_T_INT, tc.pp, "1", "[1,65536]", "pipeline stages (layers divide by pp)"),
    O("device", OPT_T_STR, tc.device, "cpu", "compute backend: cpu or cuda"),
    O("comm", OPT_T_STR, tc.comm, "auto",
      "device buffers between ranks (cuda): nccl, mpi (staged) or auto"),
    RL("threads", OPT_T_INT, tc.threads, "0", "[0,1024]", "CPU threads per rank (0: all cores)"),
    OEL("cuda-profile", OPT_T_INT, tc.cuda_profile, "0", "MS_CUDA_PROFILE", "[0,1]",
        "cuda: 1 times every op on the device and prints a table at exit"),
    OE("cpu-dtype", OPT_T_STR, tc.cpu_dtype, "fp32", "MS_CPU_DTYPE", "fp32|bf16",
       "cpu: fp32, or bf16 (activations and GEMMs in bf16; needs AVX512-BF16 or AMX)"),
    OE("cuda-fuse-gelu", OPT_T_INT, tc.cuda_fuse_gelu, "1", "MS_CUDA_FUSE_GELU", "[0,1]",
       "cuda: 1 fuses bias + GeLU into the GEMM epilogue, 0 runs them as a kernel of their own"),
    OEL("comm-timeout", OPT_T_DOUBLE, tc.comm_timeout, "300", "MS_COMM_TIMEOUT", "(0,1e6]",
        "seconds a collective may take before it fails, naming the missing ranks"),
    OEL("comm-nccl-sync", OPT_T_INT, tc.comm_nccl_sync, "0", "MS_COMM_NCCL_SYNC", "[0,1]",
        "1: a wait on an NCCL op blocks the host"),
    OPTS_FLAG("json", eval_cli, json,
              "1 prints one JSON object instead of the line (a bare --json means 1)"),
};
#define N_EVAL_OPTS ((int)(sizeof eval_opts / sizeof eval_opts[0]))

static const char *usage_text =
    "usage: megascale eval --weights FILE --val-data GLOB | --ckpt PATH [--val-data GLOB]\n"
    "                      [--val-batches N --batch B --seq T] [--device cpu|cuda] [--json]\n\n"
    "The validation loss of saved weights on the first N x B sequences of T+1 tokens of the\n"
    "data, the same set and the same number as a training run's validation (its val_loss)\n"
    "with those options; a checkpoint gives its run's for those left out.  Runs alone or\n"
    "under mpirun (dp, --tp, --pp).  Prints 'val_loss X over N tokens (ppl Y)'.";

/* Rank 0: the line, or the JSON object. */
static ms_status print_result(const train_eval_result *r, int json) {
    float loss = (float)r->loss; /* as training's val_loss (the metrics hold a float) */
    if (!json) {
        printf("val_loss %.6f over %lld tokens (ppl %.4g)\n", (double)loss, (long long)r->tokens,
               exp((double)loss));
        return MS_OK;
    }
    cJSON *o = cJSON_CreateObject();
    if (isfinite(loss))
        cJSON_AddNumberToObject(o, "val_loss", loss);
    else
        cJSON_AddNullToObject(o, "val_loss");
    if (isfinite(exp((double)loss)))
        cJSON_AddNumberToObject(o, "ppl", exp((double)loss));
    else
        cJSON_AddNullToObject(o, "ppl");
    cJSON_AddNumberToObject(o, "tokens", (double)r->tokens);
    cJSON_AddNumberToObject(o, "sequences", (double)r->sequences);
    cJSON_AddNumberToObject(o, "val_batches", r->batches);
    cJSON_AddNumberToObject(o, "batch", r->batch);
    cJSON_AddNumberToObject(o, "seq", r->seq);
    cJSON_AddNumberToObject(o, "micro_batch", r->micro);
    cJSON_AddStringToObject(o, "source", r->source);
    cJSON_AddStringToObject(o, "val_data", r->val_data);
    if (r->step >= 0) cJSON_AddNumberToObject(o, "step", r->step);
    cJSON *lay = cJSON_AddObjectToObject(o, "layout");
    cJSON_AddNumberToObject(lay, "world", r->world);
    cJSON_AddNumberToObject(lay, "dp", r->dp);
    cJSON_AddNumberToObject(lay, "tp", r->tp);
    cJSON_AddNumberToObject(lay, "pp", r->pp);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) return ms_error(MS_ERR_NOMEM, "eval: out of memory");
    printf("%s\n", text);
    free(text);
    return MS_OK;
}

int cmd_eval(int argc, char **argv) {
    eval_cli o = {0};
    char *pos[1];
    int npos = 0, help = 0, rc = 0;
    ms_status st = opts_parse(eval_opts, N_EVAL_OPTS, &o, argc, argv, pos, 0, &npos, &help);
    if (help) {
        opts_print_help(eval_opts, N_EVAL_OPTS, usage_text);
    } else if (st != MS_OK) {
        rc = cli_fail("eval", train_gate_early("eval", st));
    } else {
        train_eval_result r;
        o.tc.shared_json = opts_to_json_shared(eval_opts, N_EVAL_OPTS, &o);
        st = o.tc.shared_json ? train_eval(&o.tc, &r)
                              : ms_error(MS_ERR_NOMEM, "eval: out of memory");
        if (st == MS_OK && ms_ctx_get()->rank == 0) st = print_result(&r, o.json);
        if (st == MS_OK && !isfinite((float)r.loss)) /* printed (null in JSON), and an error */
            st = ms_error(MS_ERR_NONFINITE,
                          "the loss of %s over %lld tokens is not finite (%g): its weights give "
                          "NaN or Inf logits (a diverged run, or values too large for fp32)",
                          r.source, (long long)r.tokens, r.loss);
        free(o.tc.shared_json);
        if (st != MS_OK) rc = cli_fail("eval", st);
    }
    opts_free(eval_opts, N_EVAL_OPTS, &o);
    return rc;
}
