# The CPU emulator of CUDA (tests/cuda_emu): the backend's .cu sources
# compiled by g++ as C++17 with -DMS_CUDA_EMU against the emulator's own
# cuda_runtime.h / cuda_bf16.h / mma.h / cublasLt.h / cub (never the
# toolkit's headers), so the kernels run, and are tested, on any machine.
#
#  mscuda_emu_rt  the emulator: fiber executor, runtime, cuBLASLt (static)
#  mscuda_emu     src/backend/cuda/*.cu on the emulator (static; link it
#                 WHOLE_ARCHIVE where be_cuda_create is only referenced
#                 weakly, as backend.c does; ms_cuda_test below does)
#  test_emu       the emulator's self-test (label cuda_emu)
#  ms_cuda_test(NAME SOURCES src... [LABELS l...] [ARGS a...])
#                 a C test program built as NAME_emu on the emulator (label
#                 cuda_emu, runs everywhere) and, when the real backend
#                 (target mscuda) is built, as NAME on it (label gpu; the
#                 program exits 77 without a GPU).
#
# Not in the sanitizer builds: ucontext fibers confuse ASan and TSan.  There
# ms_cuda_test stays undefined, which tests/gpu.cmake checks.
# This file must sort before gpu.cmake (tests/CMakeLists.txt includes the
# *.cmake files in alphabetical order).
if(NOT MS_SANITIZE AND NOT MS_TSAN)
  enable_language(CXX)
  set(CMAKE_CXX_FLAGS_RELEASE "-O2 -g")

  set(MS_EMU_DIR ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu)
  set(MS_EMU_WARN -Wall -Wextra -Wno-unused-parameter -Wno-unused-function)

  add_library(mscuda_emu_rt STATIC
    ${MS_EMU_DIR}/cuda_emu.cpp ${MS_EMU_DIR}/cuda_runtime_emu.cpp ${MS_EMU_DIR}/cublaslt_emu.cpp)
  set_target_properties(mscuda_emu_rt PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF)
  target_compile_definitions(mscuda_emu_rt PUBLIC MS_CUDA_EMU)
  target_compile_options(mscuda_emu_rt PRIVATE ${MS_EMU_WARN})
  target_include_directories(mscuda_emu_rt BEFORE PRIVATE ${MS_EMU_DIR})

  # The kernel sources: the set changes while the backend is written, hence
  # the glob (CONFIGURE_DEPENDS: a new .cu file joins at the next build).
  file(GLOB MS_EMU_CU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu)
  if(MS_EMU_CU_SOURCES)
    # Source properties are per directory: the top level's CUDA language for
    # the same files (target mscuda) is untouched.  g++ needs -x c++ for .cu.
    set_source_files_properties(${MS_EMU_CU_SOURCES} PROPERTIES LANGUAGE CXX
      COMPILE_OPTIONS "-x;c++")
    add_library(mscuda_emu STATIC ${MS_EMU_CU_SOURCES})
    set_target_properties(mscuda_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
      CXX_EXTENSIONS OFF LINKER_LANGUAGE CXX)
    target_compile_options(mscuda_emu PRIVATE ${MS_EMU_WARN})
    target_include_directories(mscuda_emu BEFORE PRIVATE ${MS_EMU_DIR} ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(mscuda_emu PUBLIC mscuda_emu_rt mscore)
  endif()

  add_executable(test_emu ${MS_EMU_DIR}/test_emu.cpp)
  set_target_properties(test_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF)
  target_compile_options(test_emu PRIVATE ${MS_EMU_WARN})
  target_include_directories(test_emu BEFORE PRIVATE ${MS_EMU_DIR} ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(test_emu PRIVATE mscuda_emu_rt mscore)
  add_test(NAME test_emu COMMAND test_emu)
  set_tests_properties(test_emu PROPERTIES LABELS cuda_emu SKIP_RETURN_CODE 77)

  function(ms_cuda_test name)
    cmake_parse_arguments(T "" "" "SOURCES;LABELS;ARGS" ${ARGN})
    if(TARGET mscuda_emu)
      set(emu_labels cuda_emu ${T_LABELS})
      list(REMOVE_ITEM emu_labels gpu)
      list(REMOVE_DUPLICATES emu_labels)
      add_executable(${name}_emu ${T_SOURCES})
      target_link_libraries(${name}_emu PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,mscuda_emu>" mscore)
      set_target_properties(${name}_emu PROPERTIES LINKER_LANGUAGE CXX)
      target_include_directories(${name}_emu PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
      add_test(NAME ${name}_emu COMMAND ${name}_emu ${T_ARGS})
      set_tests_properties(${name}_emu PROPERTIES LABELS "${emu_labels}"
        SKIP_RETURN_CODE 77)
    endif()
    if(TARGET mscuda)
      set(gpu_labels gpu ${T_LABELS})
      list(REMOVE_ITEM gpu_labels cuda_emu)
      list(REMOVE_DUPLICATES gpu_labels)
      add_executable(${name} ${T_SOURCES})
      target_link_libraries(${name} PRIVATE mscuda mscore)
      target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
      add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
      set_tests_properties(${name} PROPERTIES LABELS "${gpu_labels}" SKIP_RETURN_CODE 77)
    endif()
  endfunction()
endif()
