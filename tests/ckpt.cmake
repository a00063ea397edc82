# Checkpoints (src/ckpt): unit tests (slice math, manifests, slots, commit,
# reader, the manager in-process; label threads too, for the TSan build),
# end-to-end runs of the binary (bitwise resume, tools; label cli), under
# mpirun (dp2 resume, cross-layout; label mpi) and fault injection (kill -9
# in stage 1 / stage 2, damaged commits, full disk; label faults).
ms_c_test(test_ckpt SOURCES unit/test_ckpt.c LABELS unit threads)
set_tests_properties(test_ckpt PROPERTIES TIMEOUT 120)
ms_script_test(ckpt_cli COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/test_ckpt.py
  LABELS cli)
ms_script_test(ckpt_faults COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/test_ckpt_faults.py
  LABELS faults)
ms_script_test(ckpt_mpi COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/test_ckpt_mpi.py
  LABELS mpi faults)
# Directories against a user's mistakes: pruning through step_* links, two
# trainers on one --ckpt-dir, reshard / export --out onto commits.
ms_script_test(ckpt_guard COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/test_ckpt_guard.py
  LABELS cli)
set_tests_properties(ckpt_cli ckpt_faults ckpt_mpi ckpt_guard PROPERTIES TIMEOUT 300)

# bench/ckpt's measuring program (not a test).
add_executable(bench_ckpt ${CMAKE_SOURCE_DIR}/bench/ckpt_bench.c)
target_link_libraries(bench_ckpt PRIVATE mscore)
