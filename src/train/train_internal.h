/* train_internal.h - helpers shared by the trainer's files. */
#ifndef TRAIN_INTERNAL_H
#define TRAIN_INTERNAL_H

#include "model/gpt.h"
#include "train/train.h"

/* Model configuration from the preset / explicit flags / --init-from file. */
ms_status train_model_config(const train_config *tc, gpt_config *out);
/* Cross-option checks; sets the micro-batch size and accumulation steps. */
ms_status train_check(const train_config *tc, const gpt_config *c, int *micro, int *accum);

#endif
