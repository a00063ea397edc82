#!/usr/bin/env bash
# tests/fuzz/smoke.sh - build the libFuzzer harnesses (tests/fuzz/fuzz_*.c)
# with clang, run each over its seed corpus (tests/fuzz/corpus/NAME/), then
# fuzz it for a while: the suite's test `fuzz_smoke` (label fuzz), and the
# way to fuzz for longer by hand.
#
#   tests/fuzz/smoke.sh                                  every harness, 10 s each
#   tests/fuzz/smoke.sh --seconds 600 fuzz_safetensors   one harness for 10 minutes
#   tests/fuzz/smoke.sh --seconds 600 --merge manifest   ... and add what it found
#                                                        to the corpus (minimised)
# Options: --seconds N (time per harness, the corpus included; 0: the
# corpus only), --build DIR (default: $MS_BUILD/fuzz under CTest, else
# build-fuzz), --merge (merge the inputs that reached new code into
# tests/fuzz/corpus/NAME).  Harnesses: safetensors llmc manifest shard tokenizer
# docs config beat dash (with or without the fuzz_ prefix); none named: all.
#
# Any crash, sanitizer report (AddressSanitizer, UBSan, LeakSanitizer), input
# slower than 25 s or memory over 2 GB fails the run (exit 1); the log's
# tail is printed and the input that did it is kept in DIR/artifacts/NAME/,
# to replay with `DIR/fuzz_NAME FILE`.  Inputs that reached new code are in
# DIR/work/NAME/ until the next run.  Where clang or its libFuzzer runtime
# (Debian: clang, libclang-rt-dev) is missing: "SKIP: ..." and exit 77.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=${MS_SRC:-$(cd "$here/../.." && pwd)}
build=${MS_BUILD:+$MS_BUILD/fuzz}
build=${build:-$src/build-fuzz}
seconds=10
merge=0
names=()
all=(safetensors llmc manifest shard tokenizer docs config beat dash)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --merge) merge=1; shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "smoke.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) names+=("${1#fuzz_}"); shift ;;
  esac
done
[[ $seconds =~ ^[0-9]+$ ]] || { echo "smoke.sh: --seconds $seconds: not a number" >&2; exit 2; }
[[ ${#names[@]} -gt 0 ]] || names=("${all[@]}")
for n in "${names[@]}"; do
  [[ -d $here/corpus/$n ]] || { echo "smoke.sh: no harness '$n' (${all[*]})" >&2; exit 2; }
done

# clang with libFuzzer: the first that links a fuzz target.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' > "$probe/p.c"
cc=""
for c in ${CC:-} clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
  if command -v "$c" > /dev/null &&
     "$c" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2> /dev/null; then
    cc=$(command -v "$c")
    break
  fi
done
if [[ -z $cc ]]; then
  echo "SKIP: clang / libFuzzer not available (install clang and libclang-rt-dev:" \
       "scripts/install-deps.sh --test)"
  exit 77
fi

t0=$SECONDS
if ! cmake -S "$here" -B "$build" -DCMAKE_C_COMPILER="$cc" > "$probe/cmake.log" 2>&1 ||
   ! cmake --build "$build" -j2 >> "$probe/cmake.log" 2>&1; then
  tail -40 "$probe/cmake.log"
  echo "smoke.sh: building the harnesses with $cc failed"
  exit 1
fi
echo "smoke.sh: built ${#all[@]} harnesses with $("$cc" --version | head -1) in $((SECONDS - t0)) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
for n in "${names[@]}"; do
  bin=$build/fuzz_$n work=$build/work/$n art=$build/artifacts/$n log=$build/fuzz_$n.log
  rm -rf "$work" "$art" "$build/tmp"
  mkdir -p "$work" "$art" "$build/tmp"
  limit=(-max_total_time="$seconds")
  [[ $seconds -eq 0 ]] && limit=(-runs=0) # the corpus only (libFuzzer's 0 s is no limit)
  opts=("${limit[@]}" -timeout=25 -rss_limit_mb=2048 -malloc_limit_mb=2048
        -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$art/")
  [[ -f $here/dict/$n.dict ]] && opts+=(-dict="$here/dict/$n.dict")
  t=$SECONDS
  # New inputs go to $work (the first directory), never into the tree's corpus.
  # The harness's files go to $build/tmp (removed after it, also after a crash).
  TMPDIR=$build/tmp timeout -k 10 $((seconds + 300)) "$bin" "${opts[@]}" "$work" \
    "$here/corpus/$n" > "$log" 2>&1
  rc=$?
  rm -rf "$build/tmp"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [[ $rc -ne 0 ]]; then
    failed=$((failed + 1))
    tail -60 "$log"
    echo "smoke.sh: fuzz_$n FAILED (exit $rc) after $((SECONDS - t)) s; log $log;" \
         "input: $(ls "$art" | head -1 | sed "s|^|$art/|")"
    continue
  fi
  echo "smoke.sh: fuzz_$n: ok, ${runs:-?} runs (from $(ls "$here/corpus/$n" | wc -l) seeds) in" \
       "$((SECONDS - t)) s, ${cov:-cov: ?} edges, $(ls "$work" | wc -l) new inputs"
  if [[ $merge -eq 1 && -n $(ls "$work") ]]; then
    mkdir -p "$build/tmp"
    if ! TMPDIR=$build/tmp "$bin" -merge=1 "$here/corpus/$n" "$work" > "$log.merge" 2>&1; then
      tail -20 "$log.merge"
      echo "smoke.sh: merge into corpus/$n failed"
      failed=$((failed + 1))
    fi
    rm -rf "$build/tmp"
    echo "smoke.sh: corpus/$n: $(ls "$here/corpus/$n" | wc -l) seeds after the merge"
  fi
done
echo "smoke.sh: $((${#names[@]} - failed)) passed, $failed failed in $((SECONDS - t0)) s"
[[ $failed -eq 0 ]]
