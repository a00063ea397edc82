/* finite.h - the first NaN or Inf of a float array: what the weights file
 * reader (ckpt/hf.c), the checkpoint shard writer and the resume's choice of
 * a host-memory snapshot (ckpt/) refuse, naming the element.  Host memory
 * only (the backends' has_nonfinite answers for device memory).  Pure,
 * thread-safe. */
#ifndef MS_FINITE_H
#define MS_FINITE_H

#include <stddef.h>
#include <stdint.h>

/* The index of the first element of x[0, n) that is NaN or Inf, or -1: blocks
 * tested on the exponent bits with integer operations (a loop the compiler
 * vectorises), the element found only in a block that holds one. */
int64_t ms_first_nonfinite(const float *x, size_t n);

#endif
