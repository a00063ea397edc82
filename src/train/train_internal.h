/* train_internal.h - helpers shared by the trainer's files. */
#ifndef TRAIN_INTERNAL_H
#define TRAIN_INTERNAL_H

#include "model/gpt.h"
#include "train/train.h"

/* Model configuration from the preset / explicit flags / --init-from file. */
ms_status train_model_config(const train_config *tc, gpt_config *out);
/* Cross-option checks for dp data-parallel ranks; sets the per-rank
 * micro-batch size and the accumulation steps. */
ms_status train_check(const train_config *tc, const gpt_config *c, int dp, int *micro, int *accum);
/* Checks for --tp tensor-parallel ranks (with sequence parallelism) on
 * micro-batches of `micro` sequences: heads and micro*seq divisible by tp,
 * no pipeline stages. */
ms_status train_check_tp(const train_config *tc, const gpt_config *c, int micro);

/* A parsed --inject-fault. */
typedef struct {
    int nan_grad_step; /* 1-based step whose gradients get a NaN; 0: none */
    int persistent;    /* also every later step */
    int exit_step;     /* 1-based step at whose start a rank exits; 0: none */
    int exit_rank;     /* the global rank that exits (-1: every rank) */
} train_fault;

ms_status train_fault_parse(const char *spec, train_fault *out);
int train_fault_hits(const train_fault *f, int step1);
/* 1 if this rank should die at the start of step1 (fault exit@S[:R]). */
int train_fault_exits(const train_fault *f, int step1, int rank);

#endif
