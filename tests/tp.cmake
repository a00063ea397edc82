# Tensor parallelism (Megatron style, with sequence parallelism), label mpi.
# test_tp_model: the tensor-parallel model against the single-process model
# in the same process (init, every gradient, load/save), on 2 and 4 ranks
# through tests/comm/mpirun.sh (exits 77 without mpirun).
add_executable(test_tp_model unit/test_tp_model.c)
target_link_libraries(test_tp_model PRIVATE mscore)
target_include_directories(test_tp_model PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
foreach(np 2 4)
  add_test(NAME test_tp_model_np${np} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/comm/mpirun.sh
    "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_tp_model>)
  set_tests_properties(test_tp_model_np${np} PROPERTIES LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 120
    ENVIRONMENT "MS_COMM_TIMEOUT=60;OMP_NUM_THREADS=1")
endforeach()

# The trainer with --tp (and --dp) against one process: loss curves, final
# weights, layout errors, a dead peer.
ms_script_test(mpi_tensor_parallel COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_tp.py
  LABELS mpi)
set_tests_properties(mpi_tensor_parallel PROPERTIES TIMEOUT 300)

# --overlap on the tensor-parallel exchanges: bitwise the same losses and
# weights as waiting for each message at once (tp2, tp4, tp2 x dp2).
ms_script_test(mpi_overlap_tp COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_overlap_tp.py
  LABELS mpi)
set_tests_properties(mpi_overlap_tp PROPERTIES TIMEOUT 300)
