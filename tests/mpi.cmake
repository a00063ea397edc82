# Data parallelism in the trainer, under mpirun (label mpi).
ms_script_test(mpi_data_parallel COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_dp.py
  LABELS mpi)
set_tests_properties(mpi_data_parallel PROPERTIES TIMEOUT 300)
