# Communicator (src/comm): collectives, groups, the rank grid, timeouts and
# dead peers.  Label mpi.  Multi-rank runs go through tests/comm/mpirun.sh
# (adds --oversubscribe, and --allow-run-as-root as root; exits 77 without
# mpirun) or tests/comm/fault.sh (3 ranks, one missing; checks the
# survivors' reports).  MS_COMM_TIMEOUT=60 turns a hang into a failure long
# before the CTest timeout (the programs read it themselves and pass it in
# comm_options: tests/comm/env_options.h; the library reads no environment).
set(MS_COMM_RUN ${CMAKE_CURRENT_SOURCE_DIR}/comm/mpirun.sh)
set(MS_COMM_FAULT ${CMAKE_CURRENT_SOURCE_DIR}/comm/fault.sh)
set(MS_COMM_ENV "MS_COMM_TIMEOUT=60;OMP_NUM_THREADS=1")

# A world of one process, without mpirun.
ms_c_test(test_comm SOURCES unit/test_comm.c LABELS unit mpi)
ms_c_test(test_comm_grid SOURCES unit/test_comm_grid.c LABELS unit mpi)
# Device buffers staged through pinned memory, with a fake device (no GPU).
ms_c_test(test_comm_device SOURCES unit/test_comm_device.c LABELS unit mpi)
set_tests_properties(test_comm test_comm_grid test_comm_device PROPERTIES TIMEOUT 60
  ENVIRONMENT "${MS_COMM_ENV}")
# A staged recv that never matches: the timeout report, nothing copied back.
add_test(NAME test_comm_device_timeout COMMAND test_comm_device timeout)
set_tests_properties(test_comm_device_timeout PROPERTIES LABELS "unit;mpi;faults" TIMEOUT 60)

# ms_comm_mpi_test(NAME NP TARGET [ARGS...])
function(ms_comm_mpi_test name np target)
  add_test(NAME ${name} COMMAND ${MS_COMM_RUN} "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} ${np}
    $<TARGET_FILE:${target}> ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 120
    ENVIRONMENT "${MS_COMM_ENV}")
endfunction()

foreach(np 2 3 4 8)
  ms_comm_mpi_test(test_comm_np${np} ${np} test_comm)
endforeach()
foreach(np 2 4 8)
  ms_comm_mpi_test(test_comm_grid_np${np} ${np} test_comm_grid)
endforeach()
# The communication thread under ThreadSanitizer too (`make tsan` runs the
# label threads), in one process and in two; tests/comm/tsan.supp holds
# OpenMPI's own TCP transport's lock-order reports.
set_property(TEST test_comm test_comm_np2 APPEND PROPERTY LABELS threads)
set_property(TEST test_comm test_comm_np2 APPEND PROPERTY ENVIRONMENT
  "TSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/comm/tsan.supp")
foreach(np 2 3 4)
  ms_comm_mpi_test(test_comm_device_np${np} ${np} test_comm_device)
endforeach()

# NCCL on real GPUs (label gpu; exits 77 without a GPU).  MS_HAVE_NCCL is
# set by the top-level CMakeLists when CUDA and NCCL are found; the NCCL
# code (src/comm/comm_nccl*.c, compiled with MS_HAVE_NCCL) then lives in
# mscore or in the CUDA object library mscuda, which brings the CUDA runtime
# this test calls itself.  np2 on a one-GPU machine checks the "same GPU"
# refusal and runs on groups of one; _sync waits on the host.
if(MS_HAVE_NCCL)
  ms_c_test(test_comm_nccl SOURCES comm/test_comm_nccl.c LABELS gpu mpi)
  if(TARGET mscuda)
    target_link_libraries(test_comm_nccl PRIVATE mscuda)
  endif()
  set_tests_properties(test_comm_nccl PROPERTIES TIMEOUT 120 ENVIRONMENT "${MS_COMM_ENV}")
  ms_comm_mpi_test(test_comm_nccl_np2 2 test_comm_nccl)
  ms_comm_mpi_test(test_comm_nccl_sync 1 test_comm_nccl)
  set_tests_properties(test_comm_nccl_np2 test_comm_nccl_sync PROPERTIES LABELS "gpu;mpi")
  set_tests_properties(test_comm_nccl_sync PROPERTIES
    ENVIRONMENT "${MS_COMM_ENV};MS_COMM_NCCL_SYNC=1")
endif()

add_executable(test_comm_fault unit/test_comm_fault.c)
target_link_libraries(test_comm_fault PRIVATE mscore)
target_include_directories(test_comm_fault PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
foreach(mode dead split late stopped stopped-late dead-dev dump signal-noboard signal-first
    postfail outside)
  add_test(NAME test_comm_fault_${mode} COMMAND ${MS_COMM_FAULT} "${MPIEXEC_EXECUTABLE}"
    ${MPIEXEC_NUMPROC_FLAG} $<TARGET_FILE:test_comm_fault> ${mode} 3)
  set_tests_properties(test_comm_fault_${mode} PROPERTIES LABELS "mpi;faults" SKIP_RETURN_CODE 77
    TIMEOUT 120)
endforeach()

# bench/init_groups: group-creation time for 8..64 ranks (not a test).
add_executable(bench_init_groups ${CMAKE_SOURCE_DIR}/bench/init_groups.c)
target_link_libraries(bench_init_groups PRIVATE mscore)
target_include_directories(bench_init_groups PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
