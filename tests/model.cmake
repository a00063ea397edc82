# Model, optimiser, loader and option-parser tests.
ms_c_test(test_model_parts SOURCES unit/test_model_parts.c ${CMAKE_SOURCE_DIR}/src/cli/opts.c LABELS unit)

add_executable(gpt_dump ${CMAKE_CURRENT_SOURCE_DIR}/torch/gpt_dump.c)
target_link_libraries(gpt_dump PRIVATE mscore)
ms_script_test(torch_gpt COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/test_gpt.py $<TARGET_FILE:gpt_dump>
  LABELS torch)

# Data loader: prefetch thread and the shared-memory batch ring.
ms_c_test(test_loader SOURCES unit/test_loader.c LABELS unit threads)
# Sampling: gpt_sample_token draws what the selection sort it replaced drew
# (ties included); `test_sample --perf` times both (docs/perf.md).
ms_c_test(test_sample SOURCES unit/test_sample.c LABELS unit)
