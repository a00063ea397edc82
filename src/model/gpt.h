/* gpt.h - the GPT-2 model: configuration and presets, the parameter table
 * (Hugging Face GPT-2 names and shapes), initialisation, and the forward /
 * backward passes over a backend.
 *
 * Architecture: learned position embeddings, pre-LN blocks, 4C tanh-GeLU MLP,
 * final LayerNorm, LM head tied to the token embedding, vocabulary padded to
 * a multiple of 128 (padded rows never take part in the softmax).  Options
 * from MegaScale: the parallel block y = x + Attn(LN(x)) + MLP(LN(x)) (one
 * LayerNorm, ln_1, feeds both branches) and sliding-window attention.
 *
 * Memory: gpt_create makes few, large allocations on the backend: one buffer
 * for the fp32 master parameters, one for their gradients, one for the
 * activations of a (B, T) micro-batch; every tensor is a view into them.
 * Parameters are stored in Hugging Face Conv1D layout (in, out).
 *
 * Tensor parallelism (gpt_create_tp, Megatron style with sequence
 * parallelism; the passes are in gpt_tp.c / gpt_tp_vocab.c): each rank of
 * the tp group holds only its shard of the split tensors (the table records
 * the split rule and the logical shape), the residual stream is split along
 * the sequence, and the passes communicate over the group.
 * Callers: the optimiser (through the parameter table), the trainer, the
 * checkpoint code (through the table and gpt_param_data).  A model is used
 * by one thread at a time.
 */
#ifndef GPT_GPT_H
#define GPT_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "base/status.h"
#include "comm/comm.h"

typedef enum { GPT_BLOCK_SERIAL = 0, GPT_BLOCK_PARALLEL = 1 } gpt_block;

typedef struct {
    int n_layer;
    int n_head;
    int n_embd;    /* C */
    int vocab;     /* V, real vocabulary size */
    int vocab_pad; /* Vp, V rounded up to a multiple of 128 (set by validate) */
    int seq_max;   /* rows of wpe: the longest sequence the model supports */
    gpt_block block;
    int attn_window; /* W: each token sees itself and the W-1 before it; 0 = full */
    /* GPT_RECOMPUTE_* flags: activations recomputed in the backward pass
     * instead of kept from the forward (memory for time; not part of the
     * architecture, so checkpoints ignore it). */
    int recompute;
} gpt_config;

enum {
    GPT_RECOMPUTE_GELU = 1, /* GeLU outputs (N,4C) per block: one GeLU pass per block again */
    GPT_RECOMPUTE_LN = 2,   /* LayerNorm outputs (N,C) x 1-2 per block (not with tp > 1) */
};
/* Parse "none", "gelu", "ln", "gelu,ln" into GPT_RECOMPUTE_* flags. */
ms_status gpt_recompute_parse(const char *s, int *flags);

/* Fill cfg from a preset name: d6 (6 layers, C=384, 6 heads), d12 (GPT-2 124M),
 * d24 (350M), d36 (774M), d48 (1.5B); vocab 50257, seq_max 1024, serial. */
ms_status gpt_config_preset(gpt_config *cfg, const char *name);
/* Check ranges (layers 1..1024, C 1..2^20, heads divide C, vocab 2..2^30, positive
 * seq_max, window >= 0) and set vocab_pad. */
ms_status gpt_config_validate(gpt_config *cfg);
const char *gpt_block_name(gpt_block b);
ms_status gpt_block_parse(const char *s, gpt_block *out);

/* Parameter count without vocabulary padding (the "N" of 6N). */
size_t gpt_config_num_params(const gpt_config *cfg);
/* Tensors of one block, and of the embeddings and final norm (wte, wpe, ln_f). */
int gpt_config_layer_tensors(const gpt_config *cfg);
#define GPT_EMBED_TENSORS 4
/* Training flops per token: 6N + 12 * L * T_eff * C, T_eff = min(T, W). */
double gpt_flops_per_token(const gpt_config *cfg, int T);

/* How a tensor is split over the tp ranks (rank r of tp holds block r). */
typedef enum {
    GPT_SPLIT_NONE = 0, /* replicated: LayerNorms, wpe, row-parallel biases */
    GPT_SPLIT_QKV,      /* attn.c_attn weight (C,3C) and bias (3C): the q, k and v
                         * columns of heads r*NH/tp .. (r+1)*NH/tp-1, stored [q|k|v] */
    GPT_SPLIT_COLS,     /* last dimension in tp blocks: mlp.c_fc weight and bias */
    GPT_SPLIT_ROWS,     /* first dimension in tp blocks: attn.c_proj and mlp.c_proj
                         * weights (the rows of this rank's heads / hidden units) */
    GPT_SPLIT_VOCAB,    /* wte: rows of the padded vocabulary, Vp/tp per rank */
} gpt_split;

/* One entry of the parameter table. */
typedef struct {
    char name[64]; /* Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight" */
    int ndim;      /* 1 or 2 */
    int shape[2];  /* logical shape (wte is (Vp, C) here) */
    int local[2];  /* shape of this rank's shard as stored (== shape without TP) */
    gpt_split split;
    size_t offset;  /* element offset into the parameter / gradient buffers */
    size_t numel;   /* elements stored on this rank (local[0] * local[1]) */
    int decay;      /* 1 for matrices and embeddings, 0 for biases and LN */
    float init_std; /* normal std; 0 means constant init_value */
    float init_value;
    int layer; /* block index, -1 for wte/wpe/ln_f */
} gpt_param;

typedef struct gpt_model gpt_model;

/* Create a model for micro-batches of at most B sequences of T tokens
 * (T <= seq_max).  Parameters are zero until gpt_init or a load.  On the
 * CPU backend, buffers larger than the host's memory are MS_ERR_NOMEM
 * before any is allocated (be_cpu_check_host_memory). */
ms_status gpt_create(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T);
/* The same, with every range of gpt_grad_ranges padded to a multiple of
 * range_align elements (rounded up to a multiple of 16), so that data
 * parallelism can split each range into equal, aligned shards. */
ms_status gpt_create_aligned(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T,
                             size_t range_align);
/* The same, tensor parallel over the group tp (NULL or size 1: none).
 * Rank r of the group stores only its shards (gpt_split), the residual
 * stream of rows [r*N/tp, (r+1)*N/tp) of each (B,T) micro-batch (N = B*T)
 * and its NH/tp heads; the vocabulary is padded to a multiple of 128*tp.
 * Errors (MS_ERR_ARG): heads or B*T not divisible by tp, a non-fp32 act
 * dtype.  Every forward / backward pass is then collective over tp. */
ms_status gpt_create_tp(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T,
                        size_t range_align, comm_group *tp);
void gpt_destroy(gpt_model *m);

const gpt_config *gpt_get_config(const gpt_model *m);
be_backend *gpt_backend(const gpt_model *m);
int gpt_num_tensors(const gpt_model *m);
const gpt_param *gpt_tensor(const gpt_model *m, int i);
/* Tensor-parallel size, this rank's index and group (NULL without TP). */
int gpt_tp_size(const gpt_model *m);
int gpt_tp_rank(const gpt_model *m);
comm_group *gpt_tp_group(const gpt_model *m);
/* Tensor-parallel overlap (--overlap tp, the default): 1 pipelines each
 * column-parallel GEMM with the all-gather of its input and each
 * row-parallel GEMM with the reduce-scatter of its output, chunk by chunk
 * (gpt_tp.c); 0 waits for each chunk's communication at once.  Both give
 * the same bits.  No-op without TP. */
void gpt_set_tp_overlap(gpt_model *m, int on);
/* The comm dtype of activation buffers (the backend's act dtype), for the
 * tensor- and pipeline-parallel exchanges. */
comm_dtype gpt_act_comm_dtype(const gpt_model *m);
/* Row-major index in the logical tensor t (gpt_param.shape) of element j of
 * tp rank `rank`'s shard. */
size_t gpt_logical_index(const gpt_model *m, int t, int rank, size_t j);
/* A communication failure inside the last passes (tensor parallelism): the
 * first error since the last call, with its message (MS_OK if none).  The
 * pass that failed returned NaN. */
ms_status gpt_take_error(gpt_model *m);
/* Index of a tensor by name, -1 if absent. */
int gpt_find(const gpt_model *m, const char *name);
size_t gpt_num_elements(const gpt_model *m); /* total incl. padding */
float *gpt_params(gpt_model *m);             /* fp32 master weights (device) */
float *gpt_grads(gpt_model *m);              /* fp32 gradients (device) */
/* The act-dtype copy of the weights used by the ops (aliases gpt_params on
 * backends whose act dtype is fp32).  After changing gpt_params outside the
 * optimiser call gpt_params_updated(). */
void *gpt_params_act(gpt_model *m);
void gpt_params_updated(gpt_model *m);
/* The same for elements [begin, end) of the parameter buffer only (ZeRO
 * refreshes each bucket as its all-gather lands). */
void gpt_params_range_updated(gpt_model *m, size_t begin, size_t end);
/* Bytes of activations allocated (for reports). */
size_t gpt_activation_bytes(const gpt_model *m);

/* GPT-2 initialisation from a seed: weights N(0, 0.02), residual
 * projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0,
 * LayerNorm gains 1; padded vocabulary rows 0.  Element i of a tensor gets
 * the i-th number of a stream keyed by the tensor's name, so any sharding of
 * the same tensor sees the same values (a tp shard uses the logical index
 * of each of its elements). */
void gpt_init(gpt_model *m, uint64_t seed);

/* Forward + fused classifier + backward over one micro-batch.
 * tokens, targets: (B,T) int32 on the host, B <= the B of gpt_create.
 * Gradients are accumulated (+=) into gpt_grads, each token's loss gradient
 * scaled by dloss (1/(tokens in the whole batch) for a mean).  Returns the
 * mean loss of this micro-batch.  With tensor parallelism every rank of the
 * group passes the same whole micro-batch and gets the same loss. */
float gpt_forward_backward(gpt_model *m, const int32_t *tokens, const int32_t *targets, int B,
                           int T, float dloss);
/* The micro-batch index that the next forward / backward passes record in
 * their "fwd" / "bwd" spans (base/events.h; with the step and, for a
 * pipeline stage, the chunk).  Default 0. */
void gpt_trace_micro_batch(gpt_model *m, int mb);
/* Forward only: the mean loss over the B*T targets. */
float gpt_forward_loss(gpt_model *m, const int32_t *tokens, const int32_t *targets, int B, int T);
/* The per-token losses of the last pass that computed them (gpt_forward_loss,
 * gpt_forward_backward, the last global chunk's gpt_chunk_forward), for its
 * (B,T) micro-batch: row i's T losses summed in double in position order
 * into sums[i] (B, host).  With tensor parallelism every rank holds them
 * all; on a pipeline stage only the last. */
void gpt_row_losses(gpt_model *m, int B, int T, double *sums);
/* Forward only: logits (B,T,V) fp32 on the host for all positions, or only
 * for the last position of each row when last_only (then (B,V)).  Not with
 * tensor parallelism. */
void gpt_forward_logits(gpt_model *m, const int32_t *tokens, int B, int T, int last_only,
                        float *logits);
void gpt_zero_grads(gpt_model *m);

/* The next token drawn from one row of logits (V): the first largest when
 * temp <= 0, else with probability exp((l - max) / temp) among the top_k
 * largest (0 or >= V: all), exactly top_k of them, logits tied with the
 * k-th going to the lowest ids; one draw of rng.  work: V floats of
 * scratch.  O(V) expected, whatever top_k (gpt_sample.c).  Logits are
 * finite (a NaN makes the draw unspecified, still an id in [0, V)). */
int gpt_sample_token(const float *logits, int V, double temp, int top_k, ms_rng *rng, float *work);

/* Called by gpt_forward_backward as soon as the gradients of a contiguous
 * span [begin, end) of the gradient buffer (element offsets) are final for
 * the micro-batch; a span is one range of gpt_grad_ranges or several
 * consecutive ones (the pipeline's embedding span: wte and wpe).  Order:
 * ln_f (right after its backward, at the start of the backward pass),
 * block L-1 down to block 0, then the embeddings (wte and wpe) - or, while
 * a rows hook is set (gpt_set_rows_hook), wte right after the classifier,
 * before the blocks, and wpe alone at the end.  Data parallelism uses it to
 * start reducing a bucket while the backward pass goes on.  fn NULL
 * removes the hook. */
typedef void (*gpt_grad_ready_fn)(void *ctx, size_t begin, size_t end);
void gpt_set_grad_hook(gpt_model *m, gpt_grad_ready_fn fn, void *ctx);
/* Called by every forward pass just before the weights of a span are first
 * read (in the order of gpt_grad_ranges: the embeddings, block 0 ... block
 * L-1, ln_f; a pipeline stage's last chunk reads its wte copy after ln_f),
 * so that data parallelism can wait for that span's all-gather only when it
 * is needed.  fn NULL removes it. */
void gpt_set_param_hook(gpt_model *m, gpt_grad_ready_fn fn, void *ctx);
/* The ranges the hooks report, in the order the forward pass first reads
 * them: wte, wpe, block 0 ... block L-1, ln_f for a whole model (a pipeline
 * stage: its own only, and a last stage's wte copy after ln_f).  At most
 * L + 3 of them (max_ranges must allow that); range i is [bounds[2i],
 * bounds[2i+1]).  Each is padded to the model's range alignment. */
int gpt_grad_ranges(const gpt_model *m, size_t *bounds, int max_ranges);

/* wte's gradient in two parts (data parallelism reduces the big classifier
 * part while the backward runs): while fn is set, gpt_forward_backward
 * reports wte's range to the grad hook right after the classifier (the
 * classifier's part, with earlier micro-batches' whole gradients, is then
 * final) and does not add this micro-batch's embedding-lookup rows into
 * wte's gradient: it calls fn once at the end of the backward with them,
 * ids (n, host, ascending, distinct token ids) and rows (gpt_rows_max
 * rows x C, f32 backend memory: row j < n is token ids[j]'s gradient, the
 * rest 0), valid until the next pass.  The caller must add them (wte's
 * gradient = what the grad hook saw + the rows).  A model that cannot
 * (gpt_rows_max 0) ignores fn.  fn NULL: one gradient, as usual. */
typedef void (*gpt_rows_ready_fn)(void *ctx, const int32_t *ids, int n, const float *rows);
void gpt_set_rows_hook(gpt_model *m, gpt_rows_ready_fn fn, void *ctx);
/* Rows the rows hook passes (B*T of gpt_create), 0 when the model cannot
 * keep them apart (tensor parallelism, a pipeline stage). */
int gpt_rows_max(const gpt_model *m);

/* ---- pipeline stages (gpt_stage.c) ----------------------------------------
 * A stage model holds only the blocks of its chunks: with pp stages of vpp
 * chunks each, global chunk g in [0, pp*vpp) holds blocks
 * [g*cl, (g+1)*cl), cl = L/(pp*vpp), and local chunk c of stage s is global
 * chunk c*pp + s.  Stage 0 holds the embeddings (wte, wpe), stage pp-1 ln_f
 * and a copy of wte for the tied classifier (initialised identically; the
 * trainer sums the two copies' gradients).  Tensor names stay the global
 * Hugging Face names.  Activations: `slots` sets, each one chunk's blocks
 * for one micro-batch, plus its tokens and output gradient; a (micro-batch,
 * chunk) pair in flight owns one set (par_schedule_slots).  The passes run
 * one chunk on one set; grad-ready hooks fire only for a chunk's final
 * micro-batch (the embedding range through gpt_embedding_grads_ready). */
typedef struct {
    int pp, vpp, stage; /* this rank is stage `stage` of pp, with vpp chunks */
    int chunk_layers;   /* blocks per chunk: L / (pp*vpp) */
    int slots;          /* activation sets */
} gpt_stage;

/* Fill st; MS_ERR_ARG naming the numbers when L is not divisible by pp*vpp
 * or a size is < 1. */
ms_status gpt_stage_init(gpt_stage *st, const gpt_config *cfg, int pp, int vpp, int stage,
                         int slots);
/* gpt_create_tp for the stage st (copied). */
ms_status gpt_create_stage(gpt_model **out, const gpt_config *cfg, be_backend *be, int B, int T,
                           size_t range_align, comm_group *tp, const gpt_stage *st);
/* The model's stage, NULL for a whole model. */
const gpt_stage *gpt_get_stage(const gpt_model *m);
/* 1 if `name` is a tensor of the whole model that another stage holds. */
int gpt_tensor_elsewhere(const gpt_model *m, const char *name);
/* (Nl,C) act buffers of set `slot`: the input activation of local chunk c
 * (a receive target; unused on global chunk 0) and the gradient of the
 * chunk's output (a receive target; written by the loss on the last). */
void *gpt_chunk_input(gpt_model *m, int c, int slot);
void *gpt_chunk_dout(gpt_model *m, int c, int slot);
/* Forward of local chunk c on set `slot` for a (B,T) micro-batch.  Global
 * chunk 0 embeds tokens (B,T host); the others read gpt_chunk_input.  The
 * output (Nl,C) goes to `out` (device), except on the last global chunk,
 * which computes the losses against targets (B,T host), and with grad the
 * backward of the classifier and ln_f (scaled by dloss) into
 * gpt_chunk_dout, and returns the mean loss (0 elsewhere; NaN after a
 * tensor-parallel failure).  final: the chunk's last micro-batch (the ln_f
 * gradients are then ready). */
float gpt_chunk_forward(gpt_model *m, int c, int slot, const int32_t *tokens,
                        const int32_t *targets, int B, int T, float dloss, int grad, void *out,
                        int final);
/* Backward of local chunk c on set `slot` from gpt_chunk_dout; the input
 * gradient (Nl,C) goes to din (device), or on global chunk 0 into the
 * embeddings' gradients.  final: report the blocks' gradient ranges. */
void gpt_chunk_backward(gpt_model *m, int c, int slot, int B, int T, void *din, int final);
/* Report the embedding range (wte and wpe, or the wte copy) to the grad
 * hook: after the trainer summed the tied copies.  No-op without it. */
void gpt_embedding_grads_ready(gpt_model *m);

#endif
