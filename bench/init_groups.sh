#!/usr/bin/env bash
# bench/init_groups.sh [BUILD_DIR] - how long creating the 3D grid's groups
# takes as the world grows (8, 16, 32, 64 ranks; a different layout each),
# measured only from the first collective after start-up to the last group
# (bench/init_groups.c).  Columns: ranks, layout, groups formed, grid
# creation (slowest rank, best of REPS), one world barrier, creation in
# barriers, and the naive one-collective-per-group scheme with its ratio.
# The ranks are oversubscribed on however many cores there are, so absolute
# times grow with the ranks-per-core ratio; the growth against the barrier
# column is what to read.  MS_BENCH_NAIVE_MAX (default 64): largest world
# that also runs the naive scheme (it is slow when oversubscribed).
set -euo pipefail
build=${1:-${MS_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build}}
bin=$build/tests/bench_init_groups
[[ -x $bin ]] || { echo "init_groups: $bin not built (cmake --build $build --target bench_init_groups)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "init_groups: mpirun not found (openmpi-bin)" >&2; exit 1; }
extra=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && extra+=(--allow-run-as-root)
reps=${MS_BENCH_REPS:-3}
naive_max=${MS_BENCH_NAIVE_MAX:-64}
echo "init_groups: grid group creation vs world size ($(nproc) cores, best of $reps)"
printf "%6s  %-16s %8s %10s %10s %12s %10s %8s\n" ranks layout groups grid_ms barrier_ms \
  in_barriers naive_ms naive/grid
for spec in "8 2 2 2" "16 2 2 4" "32 2 4 4" "64 4 2 8"; do
  read -r n tp pp dp <<<"$spec"
  nv=""
  [[ $n -le $naive_max ]] && nv=naive
  OMP_NUM_THREADS=1 timeout -k 5 300 mpirun "${extra[@]}" -np "$n" "$bin" "$tp" "$pp" "$dp" \
    "$reps" $nv
done
