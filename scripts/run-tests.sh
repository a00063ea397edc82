#!/usr/bin/env bash
# Run the CTest suite in build dir $1 (extra args go to ctest) and finish
# with one line "N passed, N failed, N skipped".
set -uo pipefail
build=${1:?usage: run-tests.sh BUILD_DIR [ctest args]}
shift
# Open MPI's MPI_Init probes libfabric and PSM (its cm layer) before it
# settles on ob1, the layer every test here runs on: 0.2 s of each rank's
# start-up on a machine without a fabric (docs/user-guide.md, "Data
# parallelism"); the MPI-heavy tests ran 14% faster without it.
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
log=$(mktemp)
( cd "$build" && ctest --output-on-failure -j "${MS_TEST_JOBS:-2}" "$@" ) 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
pass=$(grep -cE 'Test +#[0-9]+: .* Passed' "$log")
fail=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|\*\*\*Not Run)' "$log")
skip=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$log")
rm -f "$log"
# Why each skipped test skipped (its "SKIP: reason" line from CTest's log,
# or "NAME: SKIP: reason", "skipped: reason").
if [[ $skip -gt 0 && -f $build/Testing/Temporary/LastTest.log ]]; then
  awk '/^[0-9]+\/[0-9]+ Testing: / { name = $3 }
       /^([A-Za-z0-9_]+: )?(SKIP|skipped):/ { sub(/^([A-Za-z0-9_]+: )?(SKIP|skipped): */, "")
                                              if (!seen[name ": " $0]++)  # once, not a rank each
                                                print "skipped " name ": " $0 }' \
    "$build/Testing/Temporary/LastTest.log"
fi
echo "$pass passed, $fail failed, $skip skipped"
exit $rc
