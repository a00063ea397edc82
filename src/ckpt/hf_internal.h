/* hf_internal.h - pieces of hf.c shared with hf_pipe.c (the pipeline
 * export).  Not for callers outside src/ckpt/hf*.c. */
#ifndef CKPT_HF_INTERNAL_H
#define CKPT_HF_INTERNAL_H

#include <stdint.h>

#include "ckpt/safetensors.h"
#include "model/gpt.h"

/* The tensor's shape in the file: its logical shape, wte without padding. */
void ckpt_hf_file_shape(const gpt_model *m, const gpt_param *p, int64_t *shape);
/* The logical tensors of a tensor-parallel model on tp rank 0 (*out, one
 * malloc'ed buffer, tensor i at offs[i]); collective over the tp group.
 * The other ranks get *out = NULL. */
ms_status ckpt_hf_logical(gpt_model *m, const float *host, float **out, size_t *offs,
                          const char *path);
/* The architecture as the file's metadata. */
ms_status ckpt_hf_write_meta(ckpt_st_writer *w, const gpt_config *c);

#endif
