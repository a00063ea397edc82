# Fuzz harnesses of the file readers and line parsers (tests/fuzz/): built
# with clang in a sub-build (BUILD/fuzz), each run over its seed corpus and
# fuzzed for 10 s; skipped where clang or libFuzzer is missing.  Longer runs
# by hand: tests/fuzz/smoke.sh --seconds 600 fuzz_NAME.
ms_script_test(fuzz_smoke COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/smoke.sh LABELS fuzz)
set_tests_properties(fuzz_smoke PROPERTIES TIMEOUT 600)
