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

/* Tensors added in the file's dtype: F32 as given, BF16 rounded to nearest
 * even into buffers held here until the write (ckpt_hf_conv_free after). */
typedef struct {
    ckpt_st_dtype dtype;
    uint16_t **bufs;
    int n, cap;
} ckpt_hf_conv;
ms_status ckpt_hf_add(ckpt_st_writer *w, ckpt_hf_conv *cv, const char *name, int ndim,
                      const int64_t *shape, const float *src);
void ckpt_hf_conv_free(ckpt_hf_conv *cv);
/* The metadata, the file, then transformers' config.json beside it
 * (ckpt_hf_config_path), when the architecture is GPT-2's. */
ms_status ckpt_hf_finish(ckpt_st_writer *w, const gpt_config *c, ckpt_st_dtype dtype,
                         const char *path);

#endif
