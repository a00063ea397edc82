#!/usr/bin/env bash
# test_blas_core.sh - the OpenBLAS kernels megascale runs on (src/cli/main.c,
# src/backend/cpu/cpu_blas_core.c): the kernels in use fit the CPU's
# instruction set, whether OpenBLAS chose older ones by itself (a release
# older than the CPU falls back to SSE3 kernels) or the environment's
# OPENBLAS_CORETYPE named them: megascale runs itself again with the right
# ones, the arguments survive that, and MS_BLAS_CORE=keep keeps what
# OpenBLAS runs.
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
# the tier of kernels kept as they are: AVX2 ones too on a CPU that runs each 512-bit
# operation as two halves (AMD before family 26, Zen 4), whose AVX-512 kernels are no faster
accept=$want
family=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)
[[ $want -eq 3 && $(grep -m1 '^vendor_id' /proc/cpuinfo) == *AuthenticAMD* && ${family:-0} -lt 26 ]] &&
  accept=2

# OPENBLAS_CORETYPE naming older kernels than the CPU runs (a machine image that pins
# one set for every program) is replaced, and the lines say what it had; MS_BLAS_CORE=keep
# obeys it.  A CPU with neither AVX2 nor AVX-512 has nothing better: obeyed.
out=$("${clean[@]}" OPENBLAS_CORETYPE=Prescott "$bin" --version 2>&1); rc=$?
if [[ $want -gt 0 ]]; then
  check "OPENBLAS_CORETYPE=Prescott is replaced by kernels of the CPU's tier ($want)" \
    '[[ $rc -eq 0 && $(tier "$(core_of "$out")") -ge $want &&
       $out == *"(set by megascale: the environment had OPENBLAS_CORETYPE=Prescott)"* ]]'
  out=$("${clean[@]}" OPENBLAS_CORETYPE=Prescott MS_BLAS_CORE=keep "$bin" --version 2>&1); rc=$?
  check "MS_BLAS_CORE=keep obeys OPENBLAS_CORETYPE and says what could run" \
    '[[ $rc -eq 0 && $(core_of "$out") == Prescott &&
       $out == *"(OPENBLAS_CORETYPE, kept: MS_BLAS_CORE=keep; this CPU could run "* ]]'
  out=$("${clean[@]}" OPENBLAS_CORETYPE=Prescott "$bin" train --steps notanumber 2>&1); rc=$?
  check "the arguments survive running again (a bad value is still named)" \
    '[[ $rc -eq 2 && $out == *notanumber* ]]'
else
  check "OPENBLAS_CORETYPE is obeyed and named on a CPU without AVX2" \
    '[[ $rc -eq 0 && $(core_of "$out") == Prescott && $out == *"(OPENBLAS_CORETYPE)"* ]]'
fi
# kernels of the CPU's own tier, or newer, are never replaced
if [[ $want -eq 3 ]]; then top=SkylakeX; elif [[ $want -eq 2 ]]; then top=Haswell; else top=; fi
if [[ -n $top ]]; then
  out=$("${clean[@]}" OPENBLAS_CORETYPE=$top "$bin" --version 2>&1); rc=$?
  check "OPENBLAS_CORETYPE=$top (this CPU's tier) is obeyed" \
    '[[ $rc -eq 0 && $(core_of "$out") == "$top" && $out == *"(OPENBLAS_CORETYPE)"* ]]'
fi
if [[ -n ${OPENBLAS_CORETYPE:-} ]]; then
  out=$(env -u MS_BLAS_CORE_FROM -u MS_BLAS_CORE "$bin" --version 2>&1); rc=$?
  echo "note: this machine's environment sets OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE; megascale runs $(core_of "$out")"
  check "the environment's OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE: kernels of the CPU's tier" \
    '[[ $rc -eq 0 && $(tier "$(core_of "$out")") -ge $accept ]]'
fi

out=$("${clean[@]}" "$bin" --version 2>&1); rc=$?
core=$(core_of "$out")
check "without it the kernels fit the CPU (tier $(tier "$core") >= $accept: $core)" \
  '[[ $rc -eq 0 && -n $core && $(tier "$core") -ge $accept ]]'
default=$out

out=$("${clean[@]}" MS_BLAS_CORE=keep "$bin" --version 2>&1); rc=$?
own=$(core_of "$out")
if [[ $out == *"this CPU could run"* ]]; then
  echo "note: OpenBLAS picks $own on this CPU by itself; megascale runs $core"
  check "MS_BLAS_CORE=keep keeps OpenBLAS's own choice and says what could run" \
    '[[ $rc -eq 0 && $(tier "$own") -lt $accept && $out == *"could run $core"* ]]'
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
