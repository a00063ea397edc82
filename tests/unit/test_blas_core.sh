#!/usr/bin/env bash
# test_blas_core.sh - the OpenBLAS kernels megascale runs on (src/cli/main.c,
# src/backend/cpu/cpu_blas_core.c): OPENBLAS_CORETYPE set by the user is
# obeyed; without it the kernels in use fit the CPU's instruction set (an
# OpenBLAS older than the CPU falls back to SSE3 kernels, and megascale runs
# itself again with the right ones), the arguments survive that, and
# MS_BLAS_CORE=keep keeps OpenBLAS's own choice.
set -u
bin=${MS_BIN:?}
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; echo "$out"; fi; }
clean=(env -u OPENBLAS_CORETYPE -u MS_BLAS_CORE_FROM -u MS_BLAS_CORE)
core_of() { sed -n 's/.*OpenBLAS core \([^ ;]*\).*/\1/p' <<< "$1"; }
# the tier of a core name as OpenBLAS's x86-64 kernels go: 3 AVX-512, 2 AVX2, else lower
tier() { case "$1" in SkylakeX|Cooperlake|SapphireRapids) echo 3 ;; Haswell|Zen) echo 2 ;; *) echo 0 ;; esac; }
flags=$(grep -m1 '^flags' /proc/cpuinfo)
want=0
[[ $flags == *" avx2"* && $flags == *" fma"* ]] && want=2
[[ $flags == *" avx512f"* && $flags == *" avx512cd"* && $flags == *" avx512bw"* &&
   $flags == *" avx512dq"* && $flags == *" avx512vl"* ]] && want=3

out=$("${clean[@]}" OPENBLAS_CORETYPE=Prescott "$bin" --version 2>&1); rc=$?
check "OPENBLAS_CORETYPE from the user is obeyed and named" \
  '[[ $rc -eq 0 && $(core_of "$out") == Prescott && $out == *"(OPENBLAS_CORETYPE)"* ]]'
if [[ -n ${OPENBLAS_CORETYPE:-} ]]; then
  # this machine's environment chose the kernels (some older OpenBLAS builds compute wrong
  # results or crash on some CPUs without it): obeyed, and never run without it here
  out=$(env -u MS_BLAS_CORE_FROM -u MS_BLAS_CORE "$bin" --version 2>&1); rc=$?
  check "the environment's OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE is obeyed" \
    '[[ $rc -eq 0 && $out == *"(OPENBLAS_CORETYPE)"* ]]'
  echo "note: OPENBLAS_CORETYPE is set here; OpenBLAS's own choice is not tried"
  echo "$pass passed, $fail failed"
  [[ $fail -eq 0 ]]
  exit
fi

out=$("${clean[@]}" "$bin" --version 2>&1); rc=$?
core=$(core_of "$out")
check "without it the kernels fit the CPU (tier $(tier "$core") >= $want: $core)" \
  '[[ $rc -eq 0 && -n $core && $(tier "$core") -ge $want ]]'
default=$out

out=$("${clean[@]}" MS_BLAS_CORE=keep "$bin" --version 2>&1); rc=$?
own=$(core_of "$out")
if [[ $out == *"this CPU could run"* ]]; then
  echo "note: OpenBLAS picks $own on this CPU by itself; megascale runs $core"
  check "MS_BLAS_CORE=keep keeps OpenBLAS's own choice and says what could run" \
    '[[ $rc -eq 0 && $(tier "$own") -lt $want && $out == *"could run $core"* ]]'
  out=$default
  check "the default run says megascale chose it, and what OpenBLAS detected" \
    '[[ $out == *"(set by megascale: OpenBLAS detected $own)"* ]]'
  out=$("${clean[@]}" "$bin" train --steps notanumber 2>&1); rc=$?
  check "the arguments survive running again (a bad value is still named)" \
    '[[ $rc -eq 2 && $out == *notanumber* ]]'
else
  echo "note: OpenBLAS's own choice ($own) fits this CPU; nothing to replace"
  check "nothing replaced: same core, no note" '[[ $rc -eq 0 && $own == "$core" && $default != *"set by megascale"* ]]'
fi
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
