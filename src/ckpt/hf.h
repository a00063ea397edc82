/* hf.h - model weights as one safetensors file with Hugging Face GPT-2
 * tensor names and shapes (wte.weight (V,C), wpe.weight (T_max,C),
 * h.{i}.attn.c_attn.weight (C,3C) ..., Conv1D weights stored (in, out)).
 *
 * Used by `train --init-from / --save-weights`, `sample`, and later the
 * checkpoint export.  Names may carry a "transformer." prefix on load; the
 * tied "lm_head.weight" is ignored when present.  The model's architecture
 * travels in the file's metadata (n_layer, n_head, n_embd, vocab_size,
 * n_positions, block, attn_window) and can also be inferred from the shapes
 * of a plain Hugging Face file.  The readers (ckpt_hf_load,
 * ckpt_hf_read_config) also take llm.c's model files (gpt2_124M.bin:
 * versions 3, fp32, and 5, bf16; llmc.h), told apart by their magic.  Not
 * thread-safe per model.
 */
#ifndef CKPT_HF_H
#define CKPT_HF_H

#include "base/status.h"
#include "model/gpt.h"

/* Write the model's weights in dtype (CKPT_ST_F32, or CKPT_ST_BF16: rounded
 * to nearest even; padded vocabulary rows dropped), and transformers'
 * config.json beside them when the architecture is GPT-2's
 * (ckpt_hf_config_path).  With
 * tensor parallelism this is collective over the model's tp group: the
 * shards are gathered and tp rank 0 writes the whole logical tensors (the
 * same file as a single process); the other ranks write nothing. */
#include "ckpt/safetensors.h"
ms_status ckpt_hf_save(gpt_model *m, const char *path, ckpt_st_dtype dtype);
/* The same for a pipeline stage model (gpt_create_stage): collective over
 * the model's tp group and the pipeline group pp (this (tp, dp) column's
 * stages, group rank == stage).  Each stage gathers its tp shards; pp rank
 * 0 (tp rank 0) receives every stage's tensors and writes one file, the
 * same as a single process (wte from stage 0: the last stage's tied copy
 * is equal and not sent).  The other ranks write nothing. */
ms_status ckpt_hf_save_pipeline(gpt_model *m, comm_group *pp, const char *path,
                                ckpt_st_dtype dtype);
/* Where the config.json of weights at path goes: DIR/config.json for
 * DIR/model.safetensors (the layout transformers' from_pretrained(DIR)
 * reads), else PATH's stem + ".config.json" (nothing else's config.json is
 * replaced). */
void ckpt_hf_config_path(const char *path, char *out, size_t n);
/* "f32" / "bf16" (the --save-dtype values) into *dt; MS_ERR_ARG otherwise. */
ms_status ckpt_hf_dtype_parse(const char *s, ckpt_st_dtype *dt);
/* Load weights into m (F32 or BF16 tensors); every tensor of the model must be present with the
 * exact (logical) shape, otherwise an error names the file, the tensor and
 * both shapes.  Unknown extra tensors are an error too (a wrong model).
 * A tensor-parallel rank takes its own shard of each tensor (no
 * communication: every rank reads the file).  A pipeline stage loads the
 * tensors it holds (those of other stages are expected in the file). */
ms_status ckpt_hf_load(gpt_model *m, const char *path);
/* Read the architecture stored in (or implied by) the file.  heads_hint is
 * used when the file has no metadata (0: C/64). */
ms_status ckpt_hf_read_config(const char *path, int heads_hint, gpt_config *cfg);

#endif
