# GPU tests (the CUDA backend).  Each C program is built twice by
# ms_cuda_test (tests/cuda_emu.cmake): against the CPU emulator of CUDA
# (label cuda_emu: runs on every machine, CI included) and, when nvcc was
# found, against the real backend (label gpu: exits 77, skipped with the
# reason, on a machine without a GPU).
if(COMMAND ms_cuda_test)
  ms_cuda_test(test_cu_ops SOURCES gpu/test_cu_ops.c)
  ms_cuda_test(test_cu_attention SOURCES gpu/test_cu_attention.c)

endif()
if(TARGET mscuda)
  # cuBLASLt loaded at run time: needs the toolkit, not a GPU (label cuda)
  add_executable(test_cu_lt gpu/test_cu_lt.cu)
  set_target_properties(test_cu_lt PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_include_directories(test_cu_lt PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
    ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/src/backend/cuda ${CUDAToolkit_INCLUDE_DIRS}
    ${CUDAToolkit_INCLUDE_DIRS}/cccl)
  target_link_libraries(test_cu_lt PRIVATE mscuda mscore)
  add_test(NAME test_cu_lt COMMAND test_cu_lt)
  set_tests_properties(test_cu_lt PROPERTIES LABELS cuda)
endif()
if(TARGET mscuda_emu)
  # The trainer with the emulated CUDA backend: end-to-end runs in CI.
  add_executable(megascale_emu ${MS_CLI_SOURCES})
  target_compile_definitions(megascale_emu PRIVATE MS_DATA_DIR="${MS_DATA_DIR}")
  target_link_libraries(megascale_emu PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,mscuda_emu>" mssup mstrace mscore)
  set_target_properties(megascale_emu PROPERTIES LINKER_LANGUAGE CXX)
  add_test(NAME gpu_train_emu
    COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_train_cuda.py)
  set_tests_properties(gpu_train_emu PROPERTIES LABELS "cuda_emu;mpi" SKIP_RETURN_CODE 77
    TIMEOUT 900
    ENVIRONMENT "MS_BIN=$<TARGET_FILE:megascale_emu>;MS_GPU_EMU=1;OMP_NUM_THREADS=1")
endif()
if(TARGET mscuda)
  add_test(NAME gpu_train
    COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_train_cuda.py)
  set_tests_properties(gpu_train PROPERTIES LABELS "gpu;mpi" SKIP_RETURN_CODE 77 TIMEOUT 900
    ENVIRONMENT "MS_BIN=$<TARGET_FILE:megascale>;OMP_NUM_THREADS=1")
endif()
