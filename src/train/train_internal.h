/* train_internal.h - helpers shared by the trainer's files. */
#ifndef TRAIN_INTERNAL_H
#define TRAIN_INTERNAL_H

#include "model/gpt.h"
#include "train/train.h"

/* Model configuration from the preset / explicit flags / --init-from file. */
ms_status train_model_config(const train_config *tc, gpt_config *out);
/* Cross-option checks; sets the micro-batch size and accumulation steps. */
ms_status train_check(const train_config *tc, const gpt_config *c, int *micro, int *accum);

/* A parsed --inject-fault. */
typedef struct {
    int nan_grad_step; /* 1-based step whose gradients get a NaN; 0: none */
    int persistent;    /* also every later step */
} train_fault;

ms_status train_fault_parse(const char *spec, train_fault *out);
int train_fault_hits(const train_fault *f, int step1);

#endif
