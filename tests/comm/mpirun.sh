#!/usr/bin/env bash
# mpirun.sh MPIEXEC NUMPROC_FLAG N PROGRAM [ARGS...]
# Runs PROGRAM on N ranks for the comm tests: adds --oversubscribe (the
# tests run more ranks than cores) and --allow-run-as-root when root, and
# bounds the run (MS_MPI_TEST_LIMIT seconds, default 100) so a hang ends as
# a failure instead of a stuck CTest.  Exits 77 (skipped) without mpirun.
set -u
mpiexec=${1:-}
npflag=${2:--np}
n=${3:-1}
shift 3 || true
if [[ -z "$mpiexec" || ! -x "$(command -v "$mpiexec" 2>/dev/null)" ]]; then
  echo "skipped: mpirun not found ('$mpiexec'); install openmpi-bin" >&2
  exit 77
fi
extra=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && extra+=(--allow-run-as-root)
exec timeout -k 5 "${MS_MPI_TEST_LIMIT:-100}" "$mpiexec" "${extra[@]}" "$npflag" "$n" "$@"
