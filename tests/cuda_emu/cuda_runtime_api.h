/* cuda_runtime_api.h (cuda-emu) - everything is in cuda_runtime.h. */
#include "cuda_runtime.h"
