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
# The control message parser (fuzzed), the loss-spike and straggler
# detectors, the node pool and the blocklist.
ms_c_test(test_sup_parts SOURCES unit/test_sup_parts.c LABELS unit)
target_link_libraries(test_sup_parts PRIVATE mssup)
# Nodes and spares: a persistent NaN and a node failing diag replaced by a
# spare, a manual eviction, a transient NaN redone in place, the driver
# killed and taken over, a straggler evicted, a loss spike, storage failing
# everywhere (exit 7); the take-over after an accepted eviction, with other
# options (refused), after a rank or the whole job died unwatched.
ms_script_test(supervisor_nodes COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/supervisor/test_nodes.py
  LABELS mpi faults)
set_tests_properties(supervisor_nodes PROPERTIES TIMEOUT 900)
# The dashboard: its model of a run (curves, states, heat map, bounds), the
# incremental file reader, the compute rows, and its server (token, paths,
# methods) while the live view is pushed from another thread.
ms_c_test(test_sup_dash SOURCES unit/test_sup_dash.c LABELS unit threads)
target_link_libraries(test_sup_dash PRIVATE mssup)
# The dashboard on a real 4-rank job with a fault: the API (token, paths,
# bounds), headless Chromium watching it live (skipped with the reason where
# Chromium or playwright-core is missing), the finished run served from its
# files.
ms_script_test(dashboard COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/supervisor/test_dashboard.py
  LABELS mpi faults)
set_tests_properties(dashboard PROPERTIES TIMEOUT 600)
# The start, stop and option policy on a tiny job: restarts resume from the
# job's own commits (not the user's --resume / --new-run), idle heartbeat
# connections time out, a stop nobody asked for is a fault, a signal in the
# back-off ends the job at once, bad options are usage errors naming them,
# an early failure is not broken storage, --ckpt-dir from --config, a rank's
# heartbeat connection that breaks while it runs is no crash.
ms_script_test(supervisor_policy COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/supervisor/test_launch_policy.py
  LABELS mpi faults)
set_tests_properties(supervisor_policy PROPERTIES TIMEOUT 600)
# A slow disk under the run directory: the driver's writes of events.jsonl,
# compute.jsonl and driver.json stall 2 s each (an LD_PRELOAD shim in the
# driver only); the job is done with no false fault, the control socket
# answers within 1.5 s (~0.1 s), every event is written, in order; the same
# with a crash: one fault, one restart, the socket answered all along.
add_library(ms_slowio SHARED ${CMAKE_CURRENT_SOURCE_DIR}/supervisor/slowio.c)
target_link_libraries(ms_slowio PRIVATE ${CMAKE_DL_LIBS})
ms_script_test(supervisor_slow_disk COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/supervisor/test_slow_disk.py
  LABELS mpi faults)
set_property(TEST supervisor_slow_disk APPEND PROPERTY ENVIRONMENT "MS_SLOWIO=$<TARGET_FILE:ms_slowio>")
set_tests_properties(supervisor_slow_disk PROPERTIES TIMEOUT 300)
