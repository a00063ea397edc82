#!/usr/bin/env bash
# bench/gpu_step: the one script for the GPU (H200) machine.  It
#   1. builds megascale with the CUDA backend (Release, sm_90);
#   2. runs the GPU tests: op-by-op parity with the CPU backend and the
#      end-to-end CUDA-vs-CPU and several-ranks-on-one-GPU runs (ctest -L gpu);
#      then bench/overlap --device cuda: exposed communication per parallel
#      dimension, --overlap all against none, the ranks sharing the GPU;
#   3. trains GPT-2 124M (d12, B=64, T=1024) and 350M (d24, B=32, T=1024)
#      with megascale and, in the same run, with PyTorch (eager and
#      torch.compile; bf16 autocast, SDPA, fused AdamW) on the same shapes,
#      and prints tokens/s, MFU (6N + 12*L*T*C flops per token against
#      989 TFLOP/s dense bf16), peak device memory and the ratios.
# Medians over the steps after warm-up; the numbers go into docs/perf.md.
# usage: bench/gpu_step.sh [OUT_DIR]   (env: STEPS=30, SKIP_TESTS=1, SKIP_OVERLAP=1,
#        OVERLAP_PAIRS=1, OVERLAP_TIMEOUT=240 (s), BUDGET=540 (s: leaves out,
#        with a line saying so, each part that would not fit in what is left;
#        0, the default, runs everything),
#        SKIP_STEPS=1 (tests and overlap only), SKIP_TORCH=1, SKIP_EAGER=1,
#        SKIP_VARIANTS=1, SKIP_PROFILE=1,
#        CASES="d12:64 d24:32",
#        JOBS=16, KIT=FILE, KIT_TEST_TIMEOUT=150, KIT_TRAIN_TIMEOUT=240 (s)).
#        KIT: a kit made by `bench/gpu_kit.sh pack` on a build machine, for a
#        GPU machine without our dependencies (this workplace's: CUDA, PyTorch
#        and OpenMPI, no cJSON, PCRE2, OpenBLAS, cairo, libmicrohttpd): it is
#        installed and used instead of building, and the GPU tests run from it
#        one by one (not through CTest), a failing kernel test again under
#        compute-sanitizer.  The call there:
#          KIT=.devkit/kit.tar.xz BUDGET=540 bench/gpu_step.sh /tmp/gs
#        with .devkit carried, then summary.txt and the logs copied to $OUT.
#        "megascale gelu*" is d12 with MS_CUDA_FUSE_GELU=0 (GeLU as our
#        kernel, not cuBLASLt's epilogue); the ratios use the default.
#        On d12 a short MS_CUDA_PROFILE=1 run prints the per-op device times.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in
  -h | --help)
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  -*)
    echo "bench/gpu_step.sh: unknown option '$1' (usage: bench/gpu_step.sh [OUT_DIR]; --help)" >&2
    exit 2
    ;;
esac
# a GPU first: without one nothing here can run (it went on to a CUDA build and its tests)
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "bench/gpu_step.sh: skipped: no NVIDIA GPU here (nvidia-smi $(command -v nvidia-smi \
> /dev/null 2>&1 && echo "lists none" || echo "not found")); it runs on the GPU machine" >&2
  exit 77
fi
out=${1:-${OUT:-$root/runs/gpu_step}}
steps=${STEPS:-30}
cases=${CASES:-"d12:64 d24:32"}
jobs=${JOBS:-$(nproc)}
build=$root/build-gpu
mkdir -p "$out"
log() { echo "[gpu_step $(date +%H:%M:%S)] $*" | tee -a "$out/summary.txt"; }
start=$(date +%s)
budget=${BUDGET:-0}
# seconds of BUDGET left
left_s() { echo $(( budget - ($(date +%s) - start) )); }
# time_for SECS WHAT: true when BUDGET is 0 (no limit) or at least SECS of it
# are left; else logs that WHAT is left out, and why
time_for() {
  local need=$1 left; shift
  (( budget <= 0 )) && return 0
  left=$(left_s)
  (( left >= need )) && return 0
  log "left out: $* (about $need s needed, $left s of BUDGET=$budget left)"
  return 1
}

log "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
kit=${KIT:-}
if [[ -n $kit ]]; then
  # the programs and libraries carried from a build machine
  kdir=${KIT_DIR:-/tmp/mskit}
  kbin=$("$root/bench/gpu_kit.sh" install "$kit" "$kdir" 2> "$out/kit.log") ||
    { log "kit install failed"; cat "$out/kit.log"; exit 1; }
  log "kit $(cat "$kdir/COMMIT") installed in $kdir; $(tr '\n' ' ' < "$out/kit.log")"
  export PATH=$kbin:$PATH
  # ranks share the GPU and the host: no binding, shared memory only (its
  # single-copy reads work there, and move a large message 2-5x faster
  # than fragments: docs/perf.md), and no warnings from network plugins
  export OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
  export OMPI_MCA_mca_base_component_show_load_errors=0
  # the kit's programs name the build machine's data directory: this
  # checkout's instead (data prepare, sample and plan read MS_DATA_DIR)
  export MS_DATA_DIR="$root/data"
  bin=$kbin/megascale
  "$bin" --version 2>&1 | head -2 | tee -a "$out/summary.txt"
else
  log "build ($jobs jobs)"
  t0=$(date +%s)
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMS_CUDA=ON > "$out/cmake.log" 2>&1 ||
    { log "cmake failed"; tail -30 "$out/cmake.log"; exit 1; }
  grep -q "CUDA backend: nvcc" "$out/cmake.log" || { log "CUDA not found by cmake"; exit 1; }
  cmake --build "$build" -j"$jobs" > "$out/build.log" 2>&1 ||
    { log "build failed"; grep -E "error|Error" "$out/build.log" | head -30; exit 1; }
  log "built in $(( $(date +%s) - t0 )) s"
  bin=$build/megascale
fi

# kit_test NAME CMD...: one GPU test from the kit, bounded; on a failure of
# a C test, compute-sanitizer's memcheck names the first bad access
kit_test() {
  local name=$1 rc; shift
  timeout -k 5 "${KIT_TEST_TIMEOUT:-150}" "$@" > "$out/test_$name.log" 2>&1
  rc=$?
  case $rc in
    0) log "test $name: passed" ;;
    77) log "test $name: skipped ($(tail -1 "$out/test_$name.log"))" ;;
    *) log "test $name: FAILED (exit $rc)"; tail -25 "$out/test_$name.log" | tee -a "$out/summary.txt"
       if [[ $name == cu_* ]] && command -v compute-sanitizer > /dev/null && time_for 90 "memcheck of $name"; then
         timeout -k 5 80 compute-sanitizer --tool memcheck --print-limit 5 "$@" > "$out/memcheck_$name.log" 2>&1
         grep -E -A6 "Invalid|Error|error" "$out/memcheck_$name.log" | head -40 | tee -a "$out/summary.txt"
       fi ;;
  esac
}

if [[ -n $kit && -z ${SKIP_TESTS:-} ]] && time_for 150 "the GPU tests"; then
  log "GPU tests (from the kit)"
  [[ -x $kdir/real/test_cu_lt ]] && kit_test cu_lt "$kbin/test_cu_lt"
  kit_test cu_ops "$kbin/test_cu_ops"
  kit_test cu_attention "$kbin/test_cu_attention"
  if [[ -x $kdir/real/test_comm_nccl ]]; then
    kit_test comm_nccl env MS_COMM_TIMEOUT=60 OMP_NUM_THREADS=1 "$kbin/test_comm_nccl"
    kit_test comm_nccl_np2 env MS_COMM_TIMEOUT=60 OMP_NUM_THREADS=1 \
      "$root/tests/comm/mpirun.sh" mpirun -np 2 "$kbin/test_comm_nccl"
  fi
  KIT_TEST_TIMEOUT=${KIT_TRAIN_TIMEOUT:-240} kit_test gpu_train env MS_BIN="$bin" OMP_NUM_THREADS=1 \
    python3 -u "$root/tests/gpu/test_train_cuda.py"
  grep -hE "worst|rel|passed|FAIL" "$out"/test_*.log | tail -60 > "$out/tests_numbers.txt"
  grep -E "cuda vs cpu|loss curve|passed, " "$out/test_gpu_train.log" | tee -a "$out/summary.txt"
elif [[ -z ${SKIP_TESTS:-} ]] && time_for 240 "the GPU tests"; then
  log "GPU tests (ctest -L gpu)"
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 600) > "$out/tests.log" 2>&1
  tail -15 "$out/tests.log" | tee -a "$out/summary.txt"
  grep -hE "worst|rel|passed, " "$out/tests.log" | tail -60 > "$out/tests_numbers.txt"
fi

# issue 14's comparison: exposed communication per dimension with --overlap
# all against none, every rank on this one GPU (device buffers staged through
# pinned host memory by MPI); short, and before the long runs so that a
# time limit on the whole script still leaves it measured
if [[ -z ${SKIP_OVERLAP:-} ]] && time_for 200 "the overlap comparison"; then
  log "overlap on/off, ranks sharing the GPU (bench/overlap --device cuda)"
  limit=${OVERLAP_TIMEOUT:-240}
  # with a budget, at most half of what is left: the step comparison follows
  # (all of it, less a margin, with SKIP_STEPS)
  if (( budget > 0 )); then
    half=$(( $(left_s) / 2 )); [[ -n ${SKIP_STEPS:-} ]] && half=$(( $(left_s) - 15 ))
    (( half < limit )) && limit=$half
  fi
  PYTHONUNBUFFERED=1 timeout "$limit" python3 "$root/bench/overlap" --bin "$bin" --device cuda \
    --pairs "${OVERLAP_PAIRS:-1}" --steps 6 --layers 4 --dim 1024 --heads 16 --vocab 8192 \
    --seq 512 --batch 8 > "$out/overlap.log" 2>&1 || log "bench/overlap failed or timed out"
  tee -a "$out/summary.txt" < "$out/overlap.log" | tail -60 # with its reason when it failed
fi

# (the data below is the training comparison's only: the overlap runs above
# used all but 15 s of BUDGET with SKIP_STEPS)
[[ -n ${SKIP_STEPS:-} ]] && { log "done (SKIP_STEPS: no training comparison); logs in $out"; exit 0; }

# data: the embedded corpus with the GPT-2 tokenizer (1M tokens; the steps
# wrap around it, which changes nothing for speed)
data=$out/data
if [[ ! -f $data/kjv_train_000000.bin ]]; then
  mkdir -p "$data"
  gzip -dc "$root/data/kjv.txt.gz" > "$data/kjv.txt"
  "$bin" data prepare --input "$data/kjv.txt" --tokenizer gpt2 --out "$data" --name kjv \
    --val-fraction 0.005 > "$out/prepare.log" 2>&1 || { log "data prepare failed"; exit 1; }
fi

declare -A PRESET=([d12]="12 768 12" [d24]="24 1024 16")
# the python with torch: $PYTHON, else the first of these that imports it
py=${PYTHON:-}
if [[ -z $py ]]; then
  for cand in python3 /usr/bin/python3 /usr/local/bin/python3 python; do
    if command -v "$cand" > /dev/null && "$cand" -c "import torch" 2> /dev/null; then
      py=$(command -v "$cand"); break
    fi
  done
  [[ -z $py ]] && { py=$(command -v python3); log "no python with torch found (set PYTHON); torch runs will fail"; }
fi
log "python for torch: $py"
printf "%-5s %-4s %-16s %10s %10s %7s %10s\n" model B program ms/step tok/s MFU peakMB | tee -a "$out/summary.txt"
for c in $cases; do
  m=${c%%:*}; B=${c##*:}; T=1024
  read -r L C H <<< "${PRESET[$m]}"
  # flops per token: 6N + 12 L T C (N: parameters with the padded vocabulary)
  N=$(( 50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C ))
  fpt=$(( 6 * N + 12 * L * T * C ))
  # ours (on d12 also with GeLU as our kernel instead of cuBLASLt's epilogue)
  variants=(fused); [[ $m == d12 && -z ${SKIP_VARIANTS:-} ]] && variants+=(unfused)
  for v in "${variants[@]}"; do
    tag=$m; [[ $v == unfused ]] && tag=${m}_unfused_gelu
    time_for 45 "megascale $tag" || continue
    met=$out/ours_$tag.jsonl
    rm -f "$met"
    fuse=1; [[ $v == unfused ]] && fuse=0
    MS_CUDA_FUSE_GELU=$fuse "$bin" train --train-data "$data/kjv_train_*.bin" --device cuda \
      --model "$m" --batch "$B" --seq $T --steps "$steps" --lr 6e-4 --warmup 10 --log-every 10 \
      --val-every 0 --peak-flops 989e12 --metrics "$met" > "$out/ours_$tag.log" 2>&1 ||
      { log "megascale $tag failed:"; tail -20 "$out/ours_$tag.log" | tee -a "$out/summary.txt"; }
    ours=$($py - "$met" "$out/ours_$tag.log" "$B" "$T" "$fpt" <<'EOF2'
import json, re, statistics, sys
met, logf, B, T, fpt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
try:
    ms = [json.loads(l)["ms"] for l in open(met) if '"ms"' in l]
except OSError:
    ms = []
if len(ms) < 2:
    print("nan nan nan nan"); sys.exit()
med = statistics.median(ms[5:] if len(ms) > 8 else ms[1:])
tok = B * T / med * 1e3
m = re.search(r"peak device memory ([0-9.]+) MB", open(logf).read())
print(f"{med:.2f} {tok:.0f} {100 * tok * fpt / 989e12:.1f} {float(m.group(1)) if m else float('nan'):.0f}")
EOF2
)
    read -r vms vtok vmfu vmem <<< "$ours"
    name=megascale; [[ $v == unfused ]] && name="megascale gelu*"
    printf "%-5s %-4s %-16s %10s %10s %6s%% %10s\n" "$m" "$B" "$name" "$vms" "$vtok" "$vmfu" "$vmem" | tee -a "$out/summary.txt"
    if [[ $v == fused ]]; then oms=$vms; otok=$vtok; omfu=$vmfu; omem=$vmem; fi
  done
  # where the time goes: per-op device times
  if [[ $m == d12 && -z ${SKIP_PROFILE:-} ]] && time_for 40 "the $m profile run"; then
    MS_CUDA_PROFILE=1 "$bin" train --train-data "$data/kjv_train_*.bin" --device cuda \
      --model "$m" --batch "$B" --seq $T --steps 6 --log-every 10 --val-every 0 \
      --peak-flops 989e12 > "$out/ours_${m}_profile.log" 2>&1 || log "profile run $m failed"
    grep -A28 "cuda profile (" "$out/ours_${m}_profile.log" | sed 's/^\[megascale r0 info\] //' |
      tee -a "$out/summary.txt"
  fi
  [[ -n ${SKIP_TORCH:-} ]] && continue
  for mode in compile eager; do
    [[ $mode == eager && -n ${SKIP_EAGER:-} ]] && continue
    time_for $([[ $mode == compile ]] && echo 150 || echo 60) "torch $mode $m" || continue
    flag=(); [[ $mode == compile ]] && flag=(--compile)
    $py "$root/bench/gpu_torch.py" --layers "$L" --dim "$C" --heads "$H" --batch "$B" --seq $T \
      --steps "$steps" "${flag[@]}" > "$out/torch_${mode}_$m.log" 2> "$out/torch_${mode}_$m.err" ||
      { log "torch $mode $m failed:"; tail -5 "$out/torch_${mode}_$m.err" | tee -a "$out/summary.txt"; continue; }
    tor=$($py - "$out/torch_${mode}_$m.log" "$B" "$T" "$fpt" <<'EOF'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
B, T, fpt = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"{s['median_ms']:.2f} {s['tok_s']:.0f} {100 * s['tok_s'] * fpt / 989e12:.1f} {s['peak_reserved_mb'] * 1.048576:.0f}")
EOF
)
    read -r tms ttok tmfu tmem <<< "$tor"
    printf "%-5s %-4s %-16s %10s %10s %6s%% %10s\n" "$m" "$B" "torch $mode" "$tms" "$ttok" "$tmfu" "$tmem" | tee -a "$out/summary.txt"
    ratio=$($py -c "import sys; a,b=map(float,sys.argv[1:]); print(f'{a/b:.3f}')" "$otok" "$ttok" 2>/dev/null || echo nan)
    log "ratio megascale / torch $mode ($m): ${ratio}x tokens/s; memory ${omem} MB vs ${tmem} MB (torch: peak reserved)"
  done
done
log "done; logs in $out"
