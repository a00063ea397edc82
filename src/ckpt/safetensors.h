/* safetensors.h - reader and writer for the safetensors format
 * (8-byte little-endian header length, JSON header, raw little-endian data).
 *
 * Reader: ckpt_st_open maps the file read-only, parses the header with cJSON
 * and validates every entry (known dtype, shape product * dtype size equals
 * the byte span, spans inside the data section and not overlapping, header
 * length inside the file); any problem is MS_ERR_FORMAT naming the file and
 * the tensor.  Tensor data pointers point into the map and stay valid until
 * ckpt_st_close.
 * Writer: collect tensors (the caller keeps their data alive), then
 * ckpt_st_write writes the file atomically (temp + fsync + rename), with
 * data offsets aligned to 8 bytes and the string metadata in "__metadata__".
 * Not thread-safe per object.
 */
#ifndef CKPT_SAFETENSORS_H
#define CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define CKPT_ST_MAX_DIMS 8

typedef enum {
    CKPT_ST_F32 = 0,
    CKPT_ST_BF16,
    CKPT_ST_F16,
    CKPT_ST_I32,
    CKPT_ST_I64,
    CKPT_ST_U8
} ckpt_st_dtype;

typedef struct {
    char *name;
    ckpt_st_dtype dtype;
    int ndim;
    int64_t shape[CKPT_ST_MAX_DIMS];
    const void *data; /* into the map (reader) or caller memory (writer) */
    size_t nbytes;
} ckpt_st_tensor;

typedef struct ckpt_st_file ckpt_st_file; /* opaque, reader */

ms_status ckpt_st_open(ckpt_st_file **out, const char *path);
void ckpt_st_close(ckpt_st_file *f);
int ckpt_st_count(const ckpt_st_file *f);
const ckpt_st_tensor *ckpt_st_get(const ckpt_st_file *f, int i);
/* NULL if absent. */
const ckpt_st_tensor *ckpt_st_find(const ckpt_st_file *f, const char *name);
/* Metadata value for key, NULL if absent. */
const char *ckpt_st_meta(const ckpt_st_file *f, const char *key);
const char *ckpt_st_path(const ckpt_st_file *f);

typedef struct ckpt_st_writer ckpt_st_writer; /* opaque */

ckpt_st_writer *ckpt_st_writer_create(void);
void ckpt_st_writer_destroy(ckpt_st_writer *w);
/* Copies name and shape; data must stay valid until ckpt_st_write. */
ms_status ckpt_st_writer_add(ckpt_st_writer *w, const char *name, ckpt_st_dtype dt, int ndim,
                             const int64_t *shape, const void *data);
ms_status ckpt_st_writer_meta(ckpt_st_writer *w, const char *key, const char *value);
ms_status ckpt_st_write(ckpt_st_writer *w, const char *path);
/* The bytes before the data section of the file ckpt_st_write would write
 * (8-byte length, JSON header, space padding), padded so that the data
 * section starts at a multiple of `align` bytes (a power of two >= 8).  For
 * callers whose data already lies in one buffer in the writer's order
 * (element size descending, then insertion order), to write it themselves
 * (checkpoint shards, with O_DIRECT).  *hdr is malloc'd (caller frees). */
ms_status ckpt_st_writer_header(ckpt_st_writer *w, size_t align, char **hdr, size_t *len);

size_t ckpt_st_dtype_size(ckpt_st_dtype dt);
const char *ckpt_st_dtype_name(ckpt_st_dtype dt); /* "F32", ... */

#endif
