# Parallelism: pipeline schedules (pure instruction lists, simulated).
ms_c_test(test_schedule SOURCES unit/test_schedule.c LABELS unit)
# The scale planner (src/plan): against MegaScale's published Table 2 and
# Table 3 with the shipped A100 cluster file.
ms_c_test(test_plan_megascale SOURCES unit/test_plan_megascale.c LABELS unit
  ARGS ${CMAKE_SOURCE_DIR}/data/clusters/a100-megascale.json)
