# The node self-test (megascale diag): checks, verdicts, JSON, history,
# injected faults, bad options; and the comm check on 2 ranks under mpirun.
# Both start MPI (the comm check), hence label mpi: left out of the ASan run,
# whose LeakSanitizer cannot attribute Open MPI's allocations (Makefile).
ms_script_test(diag_self_test COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/diag/test_diag.py
  LABELS cli mpi)
set_tests_properties(diag_self_test PROPERTIES TIMEOUT 120)
ms_script_test(diag_self_test_mpi COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/diag/test_diag.py --mpi
  LABELS mpi)
set_tests_properties(diag_self_test_mpi PROPERTIES TIMEOUT 120)
