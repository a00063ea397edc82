#!/usr/bin/env bash
# test_cpu_isa.sh - the instruction-set check before main (src/base/cpu_isa.c):
# a binary compiled for an extension this CPU lacks (isa_probe_amx: built with
# -mamx-tile) stops at once with exit 2, naming the extension and the build
# that runs here; MS_ISA_CHECK=0 skips the check; megascale --version names
# what the real binary was compiled for.  Skipped on a CPU with AMX.
set -u
probe=${MS_PROBE:?}
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; echo "$out"; fi; }
out=$(MS_ISA_CHECK=0 "$probe" 2>&1); rc=$?
if [[ $rc -eq 0 && $out == *"missing: "$'\n'* || $out == *"missing: " ]]; then
  echo "SKIP: this CPU has AMX, every extension the probe was built for"
  exit 77
fi
check "MS_ISA_CHECK=0 runs it and lists amx-tile as missing" '[[ $rc -eq 0 && $out == *"missing: "*amx-tile* ]]'
out=$("$probe" 2>&1); rc=$?
check "the probe is refused before main with exit 2" '[[ $rc -eq 2 && $out != *"built for:"* ]]'
check "... naming the missing extension and how to build" \
  '[[ $out == *"this CPU lacks"*amx-tile* && $out == *"-DMS_NATIVE=OFF"* ]]'
out=$("${MS_BIN:?}" --version 2>&1); rc=$?
check "megascale --version runs and names its instruction set" '[[ $rc -eq 0 && $out == *"compiled for x86-64 with "* ]]'
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
