# Data parallelism in the trainer, under mpirun (label mpi).
ms_script_test(mpi_data_parallel COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_dp.py
  LABELS mpi)
set_tests_properties(mpi_data_parallel PROPERTIES TIMEOUT 300)
# The ranks and the layout: options compared across ranks at start-up, --dp
# inferred from the world size, the warning of a pipeline short of
# micro-batches (label mpi).
ms_script_test(mpi_ranks COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_ranks.py
  LABELS mpi)
set_tests_properties(mpi_ranks PROPERTIES TIMEOUT 600)
# The fixed validation set across layouts (dp, tp, pp) and `megascale eval`
# under mpirun, on weights and on a dp2 run's checkpoint (label mpi).
ms_script_test(mpi_validation COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_val.py
  LABELS mpi)
set_tests_properties(mpi_validation PROPERTIES TIMEOUT 300)
# Open MPI's shared-memory segments that killed jobs left in /dev/shm: the
# first rank of a host removes them at start-up, and only them (label mpi).
ms_script_test(mpi_shm_sweep COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_shm_sweep.py
  LABELS mpi)
set_tests_properties(mpi_shm_sweep PROPERTIES TIMEOUT 300)
# A multi-rank command's errors printed once, by rank 0, naming the ranks.
ms_script_test(mpi_errors COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_errors.py
  LABELS mpi)
set_tests_properties(mpi_errors PROPERTIES TIMEOUT 600)
# Data-parallel overlap (--overlap): dp2 with the ZeRO communication hidden
# behind compute is bitwise the run that waits for every op at once (losses
# and final weights), serial and parallel block, AdamW and LAMB, gradient
# accumulation; a bad --overlap value is named (label mpi).
ms_script_test(mpi_overlap_dp COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_overlap_dp.py
  LABELS mpi)
set_tests_properties(mpi_overlap_dp PROPERTIES TIMEOUT 300)
# The CPU backend's bf16 mode (--cpu-dtype bf16) end to end: one process
# against fp32, dp2 / tp2 / pp2 x dp2 against one process, a bitwise
# resume, the refusals (label mpi); skipped with the reason where the CPU
# has no AVX512-BF16.
ms_script_test(mpi_cpu_bf16 COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_cpu_bf16.py
  LABELS mpi)
set_tests_properties(mpi_cpu_bf16 PROPERTIES TIMEOUT 300)
