# Pipeline parallelism, label unit + mpi.
# test_schedule_slots: the activation sets a stage allocates cover every
# (mb, chunk) in flight of every schedule (early receives included).
ms_c_test(test_schedule_slots SOURCES unit/test_schedule_slots.c LABELS unit)

# The trainer with --pp (and --vpp, --tp, --dp) against one process: loss
# curves, final weights, --init-from, layout errors.
ms_script_test(mpi_pipeline_parallel COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_pp.py
  LABELS mpi)
set_tests_properties(mpi_pipeline_parallel PROPERTIES TIMEOUT 600)

# --overlap all / none / dp,tp with --pp (and --vpp, --dp, both blocks): the
# decoupled schedule and the overlapped embedding exchange give bitwise the
# losses and final weights of the blocking schedule and all-reduce.
ms_script_test(mpi_overlap_pp COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_overlap_pp.py
  LABELS mpi)
set_tests_properties(mpi_overlap_pp PROPERTIES TIMEOUT 300)
