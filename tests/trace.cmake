# Offline trace tools (src/trace): merge, stragglers, hang analysis.
ms_c_test(test_trace SOURCES unit/test_trace.c LABELS unit)
target_link_libraries(test_trace PRIVATE mstrace)
ms_script_test(trace_tools COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/trace/test_trace_tools.py
  LABELS unit cli)
