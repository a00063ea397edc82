# CPU backend tests: every op against naive references and finite
# differences (unit), and against PyTorch in float64 (torch).
ms_c_test(test_cpu_ops SOURCES unit/test_cpu_ops.c LABELS unit)
# The bf16 mode (--cpu-dtype bf16) op by op against the fp32 mode: exact
# where it computes in fp32 and rounds once, bf16 tolerances for the GEMMs
# and the classifier; skipped with the reason without oneDNN or AVX512-BF16.
ms_c_test(test_cpu_bf16 SOURCES unit/test_cpu_bf16.c LABELS unit)
# The own fp32 GEMM (cpu_sgemm.c) against float64, and its bits under row,
# column and thread splits; skipped with the reason without full-width
# AVX-512.
ms_c_test(test_cpu_sgemm SOURCES unit/test_cpu_sgemm.c LABELS unit)

# ops_dump writes every op's inputs and outputs for test_ops.py to check.
add_executable(ops_dump torch/ops_dump.c)
target_link_libraries(ops_dump PRIVATE mscore)
ms_script_test(torch_ops
  COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/test_ops.py $<TARGET_FILE:ops_dump>
  LABELS torch)

# Ops for tensor parallelism (vocabulary slices, bias add) against the
# whole-vocabulary ops.
ms_c_test(test_cpu_tp_ops SOURCES unit/test_cpu_tp_ops.c LABELS unit)

# bench/cpu_gemm.c's measuring program (not a test): the own fp32 GEMM
# against OpenBLAS at a step's shapes.
add_executable(bench_cpu_gemm ${CMAKE_SOURCE_DIR}/bench/cpu_gemm.c)
target_link_libraries(bench_cpu_gemm PRIVATE mscore)
