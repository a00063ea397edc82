/* llmc.h - llm.c's GPT-2 model files (gpt2_124M.bin, and the
 * model_XXXXXX.bin its trainers write), read as weights for
 * `train --init-from`, `eval --weights` and `sample --weights`.
 *
 * The file: 256 little-endian int32 header words, [0] magic 20240326,
 * [1] version (3: fp32 parameters, 5: bf16), [2] max_seq_len, [3]
 * vocab_size, [4] num_layers, [5] num_heads, [6] channels, [7]
 * padded_vocab_size; then the parameters, each tensor whole in this order:
 * wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C),
 * qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w, ln2b (L, C),
 * fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw
 * (C), lnfb (C).  Matrices are stored (out, in), as torch.nn.Linear holds
 * them; Hugging Face's Conv1D holds (in, out), so they are transposed here.
 * The file is read (not mapped: a file truncated under a reader is an
 * error, not SIGBUS) and its size must be exactly what the header implies.
 * Thread-safe (no shared state).
 */
#ifndef CKPT_LLMC_H
#define CKPT_LLMC_H

#include "base/status.h"
#include "ckpt/safetensors.h"
#include "model/gpt.h"

#define CKPT_LLMC_MAGIC 20240326

/* 1 when path is a readable file starting with llm.c's model magic. */
int ckpt_llmc_probe(const char *path);

typedef struct ckpt_llmc_file ckpt_llmc_file; /* opaque */

/* Read and check the file; its tensors are then available under Hugging
 * Face GPT-2 names and shapes (wte without its padding rows), in the file's
 * dtype (F32 or BF16).  MS_ERR_FORMAT names the file and what is wrong. */
ms_status ckpt_llmc_open(ckpt_llmc_file **out, const char *path);
void ckpt_llmc_close(ckpt_llmc_file *f);
int ckpt_llmc_count(const ckpt_llmc_file *f);
const ckpt_st_tensor *ckpt_llmc_get(const ckpt_llmc_file *f, int i);
/* The architecture in the header: serial block, full attention. */
void ckpt_llmc_config(const ckpt_llmc_file *f, gpt_config *cfg);
/* The same from the header alone (the parameters are not read). */
ms_status ckpt_llmc_read_config(const char *path, gpt_config *cfg);

#endif
