# CPU backend tests: every op against naive references and finite
# differences (unit), and against PyTorch in float64 (torch).
ms_c_test(test_cpu_ops SOURCES unit/test_cpu_ops.c LABELS unit)
# The bf16 mode (--cpu-dtype bf16) op by op against the fp32 mode: exact
# where it computes in fp32 and rounds once, bf16 tolerances for the GEMMs
# and the classifier; skipped with the reason without oneDNN or AVX512-BF16.
ms_c_test(test_cpu_bf16 SOURCES unit/test_cpu_bf16.c LABELS unit)

# ops_dump writes every op's inputs and outputs for test_ops.py to check.
add_executable(ops_dump torch/ops_dump.c)
target_link_libraries(ops_dump PRIVATE mscore)
ms_script_test(torch_ops
  COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/test_ops.py $<TARGET_FILE:ops_dump>
  LABELS torch)

# Ops for tensor parallelism (vocabulary slices, bias add) against the
# whole-vocabulary ops.
ms_c_test(test_cpu_tp_ops SOURCES unit/test_cpu_tp_ops.c LABELS unit)
