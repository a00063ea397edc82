# The troubleshooting tools on real runs: the merged timeline of dp2 x pp2,
# a straggler made with SIGSTOP/SIGCONT, a hang (SIGSTOP) in dp2 x tp2 x pp2
# named by `trace hang` (labels mpi, faults).
ms_script_test(trace_runs COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/trace/test_trace_runs.py
  LABELS mpi faults)
set_tests_properties(trace_runs PROPERTIES TIMEOUT 600)
