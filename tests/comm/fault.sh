#!/usr/bin/env bash
# fault.sh MPIEXEC NUMPROC_FLAG TEST_BINARY MODE [TIMEOUT_S]
# Runs test_comm_fault on 3 ranks with MS_COMM_TIMEOUT=TIMEOUT_S (default 3)
# and mpirun --enable-recovery (without it mpirun kills the whole job as
# soon as one rank exits without MPI_Finalize, before the survivors can
# report).  Passes when both survivors printed FAULT-OK (their own checks:
# error code, message naming op, group and rank 2, elapsed <= timeout + 1 s)
# and the whole run ended in time.  Exits 77 without mpirun.
set -u
mpiexec=${1:-}
npflag=${2:--np}
bin=$3
mode=$4
tmo=${5:-3}
if [[ -z "$mpiexec" || ! -x "$(command -v "$mpiexec" 2>/dev/null)" ]]; then
  echo "skipped: mpirun not found ('$mpiexec'); install openmpi-bin" >&2
  exit 77
fi
extra=(--oversubscribe --enable-recovery)
[[ $(id -u) -eq 0 ]] && extra+=(--allow-run-as-root)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
t0=$(date +%s.%N)
MS_COMM_TIMEOUT=$tmo timeout -k 5 60 "$mpiexec" "${extra[@]}" -x MS_COMM_TIMEOUT "$npflag" 3 \
  "$bin" "$mode" >"$log" 2>&1
rc=$?
t1=$(date +%s.%N)
cat "$log"
echo "fault.sh: mode $mode, timeout ${tmo}s, mpirun exit $rc, wall $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s"
ok=1
ranks="0 1"
[[ $mode == postfail ]] && ranks="0 1 2" # rank 2 checks its own failed post
for r in $ranks; do
  if ! grep -q "^FAULT-OK r$r " "$log"; then
    echo "FAIL: rank $r did not report (the missing rank, or its own failure)" >&2
    ok=0
  fi
done
[[ $rc -eq 124 || $rc -eq 137 ]] && { echo "FAIL: the job hung (killed by timeout)" >&2; ok=0; }
[[ $ok -eq 1 ]] && echo "fault.sh: PASS" && exit 0
exit 1
