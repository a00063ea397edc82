/* library_types.h (cuda-emu) - the data-type enum shared by the CUDA
 * libraries (cuBLASLt's matrix and scale types), with the real values. */
#ifndef MSEMU_LIBRARY_TYPES_H
#define MSEMU_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
    CUDA_R_16F = 2,
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_8I = 3,
    CUDA_R_32I = 10,
    CUDA_R_16BF = 14,
} cudaDataType;
typedef enum cudaDataType_t cudaDataType_t;

typedef enum libraryPropertyType_t {
    MAJOR_VERSION,
    MINOR_VERSION,
    PATCH_LEVEL
} libraryPropertyType;

#endif
