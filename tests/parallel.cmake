# Parallelism: pipeline schedules (pure instruction lists, simulated).
ms_c_test(test_schedule SOURCES unit/test_schedule.c LABELS unit)
