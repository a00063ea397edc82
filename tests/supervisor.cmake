# The supervisor (megascale launch): crash, hang, crash loop and bad beats
# on real dp2 jobs (labels mpi, faults), and the heartbeat parser.
ms_script_test(supervisor COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/supervisor/test_launch.py
  LABELS mpi faults)
set_tests_properties(supervisor PROPERTIES TIMEOUT 600)
ms_c_test(test_sup_beat SOURCES unit/test_sup_beat.c LABELS unit threads)
target_link_libraries(test_sup_beat PRIVATE mssup)
# The short chaos run: 10 seeded faults (crashes and hangs) in one job under
# the supervisor, all detected and recovered, weights bitwise equal to the
# fault-free run (bench/chaos runs 50 outside the suite).
ms_script_test(chaos_short COMMAND ${MS_PYTHON} ${CMAKE_SOURCE_DIR}/bench/chaos --faults 10 --check
  --bin $<TARGET_FILE:megascale> LABELS mpi faults)
set_tests_properties(chaos_short PROPERTIES TIMEOUT 600)
