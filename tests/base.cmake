# Base layer and file formats: fileio / crc32c / rng, safetensors, token shards.
ms_c_test(test_base SOURCES unit/test_base.c LABELS unit)
# Files killed processes left in shared memory: found through /proc, removed.
ms_c_test(test_shm_sweep SOURCES unit/test_shm_sweep.c LABELS unit)
ms_c_test(test_safetensors SOURCES unit/test_safetensors.c LABELS unit)
ms_c_test(test_shard SOURCES unit/test_shard.c LABELS unit)
# The event recorder and the per-rank event log (threads: also under TSan).
ms_c_test(test_events SOURCES unit/test_events.c LABELS unit threads)
# The metrics JSONL sink: config / step / val / ckpt lines, a resumed run's trim.
ms_c_test(test_metrics SOURCES unit/test_metrics.c LABELS unit)
# The fault-injection registry and node maps: parse / format / find round trips.
ms_c_test(test_fault SOURCES unit/test_fault.c LABELS unit)
# The instruction-set check before main: a binary built for an extension the
# CPU lacks is refused with a clear error (x86-64 only).
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  add_executable(isa_probe_amx unit/isa_probe.c ${CMAKE_SOURCE_DIR}/src/base/cpu_isa.c
    ${CMAKE_SOURCE_DIR}/src/cli/isa_check.c)
  target_include_directories(isa_probe_amx PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(isa_probe_amx PRIVATE -mamx-tile)
  ms_script_test(cpu_isa COMMAND env MS_PROBE=$<TARGET_FILE:isa_probe_amx>
    bash ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_cpu_isa.sh LABELS unit)
endif()
# The OpenBLAS kernels megascale runs on fit the CPU (an OpenBLAS older than
# the CPU falls back to SSE3 ones; main() runs itself again with the right
# ones); OPENBLAS_CORETYPE from the user is obeyed.
ms_script_test(blas_core COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_blas_core.sh
  LABELS unit cli)
