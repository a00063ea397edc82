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
# Why each skipped test skipped (its "SKIP: reason" line from CTest's log).
if [[ $skip -gt 0 && -f $build/Testing/Temporary/LastTest.log ]]; then
  awk '/^[0-9]+\/[0-9]+ Testing: / { name = $3 }
       /^SKIP/ { sub(/^SKIP: */, ""); print "skipped " name ": " $0 }' \
    "$build/Testing/Temporary/LastTest.log"
fi
echo "$pass passed, $fail failed, $skip skipped"
exit $rc
