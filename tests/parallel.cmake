# Parallelism: pipeline schedules (pure instruction lists, simulated).
ms_c_test(test_schedule SOURCES unit/test_schedule.c LABELS unit)
# The scale planner (src/plan): its cost models, cluster files and errors.
ms_c_test(test_plan SOURCES unit/test_plan.c LABELS unit)
# The planner against MegaScale's published Table 2 and
# Table 3 with the shipped A100 cluster file.
ms_c_test(test_plan_megascale SOURCES unit/test_plan_megascale.c LABELS unit
  ARGS ${CMAKE_SOURCE_DIR}/data/clusters/a100-megascale.json)
# The planner's pipeline at any batch: the activation sets in closed form against the
# schedule's, the cap on the simulated pipeline, --tp inside a node, cluster ranges.
ms_c_test(test_plan_pipe SOURCES plan/test_plan_pipe.c LABELS unit)
# (The planner against our own CPU runs is a benchmark, bench/plan_cpu: its
# verdict is a timing on a shared machine.)
# `megascale plan` end to end: JSON, text, --search, plan measure, the
# shipped cluster files, bad input.
ms_script_test(plan_cli COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/test_plan_cli.py
  LABELS cli)
set_tests_properties(plan_cli PROPERTIES TIMEOUT 300)
# The planner's memory per GPU against the trainer's own count of what it allocates (the CPU
# backend's device-memory peak), tiny models in one process and under mpirun (tp, dp, pp, vpp).
ms_script_test(plan_memory COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/test_plan_memory.py
  LABELS cli)
ms_script_test(plan_memory_mpi COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/test_plan_memory.py --mpi
  LABELS mpi)
# `plan measure --base` under mpirun: the links, the shared cores, overlap_exposed.
ms_script_test(plan_measure_mpi COMMAND ${MS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/test_plan_cli.py --mpi
  LABELS mpi)
set_tests_properties(plan_measure_mpi PROPERTIES TIMEOUT 300)
