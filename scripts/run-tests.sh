#!/usr/bin/env bash
# Run the CTest suite in build dir $1 (extra args go to ctest) and finish
# with one line "N passed, N failed, N skipped".
set -uo pipefail
build=${1:?usage: run-tests.sh BUILD_DIR [ctest args]}
shift
log=$(mktemp)
( cd "$build" && ctest --output-on-failure -j "${MS_TEST_JOBS:-2}" "$@" ) 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
pass=$(grep -cE 'Test +#[0-9]+: .* Passed' "$log")
fail=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout)' "$log")
skip=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$log")
rm -f "$log"
echo "$pass passed, $fail failed, $skip skipped"
exit $rc
