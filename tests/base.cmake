# Base layer and file formats: fileio / crc32c / rng, safetensors, token shards.
ms_c_test(test_base SOURCES unit/test_base.c LABELS unit)
ms_c_test(test_safetensors SOURCES unit/test_safetensors.c LABELS unit)
ms_c_test(test_shard SOURCES unit/test_shard.c LABELS unit)
# The event recorder and the per-rank event log (threads: also under TSan).
ms_c_test(test_events SOURCES unit/test_events.c LABELS unit threads)
# The metrics JSONL sink: config / step / val / ckpt lines, a resumed run's trim.
ms_c_test(test_metrics SOURCES unit/test_metrics.c LABELS unit)
# The fault-injection registry and node maps: parse / format / find round trips.
ms_c_test(test_fault SOURCES unit/test_fault.c LABELS unit)
