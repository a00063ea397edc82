#!/usr/bin/env bash
# Install the Debian packages MegaScale-C needs, if any are missing.
#   scripts/install-deps.sh          build + run dependencies
#   scripts/install-deps.sh --test   also what the test suite needs
# As root it runs apt-get; otherwise it prints the exact command to run.
# libdnnl-dev (oneDNN) runs the bf16 GEMMs of --cpu-dtype bf16.
# libmicrohttpd and Chart.js (libjs-chart.js) serve the dashboard; Chromium
# is the dashboard's browser test (with playwright-core from npm, which the
# test installs into tests/dashboard/node_modules; --test does it here too).
# Node.js and npm (js-tiktoken, the tokenizer's reference in one test) are
# looked for as commands, since they are often installed from outside
# Debian (nodesource ships its own npm, which conflicts with Debian's); when
# they cannot be installed, that one test says so and is skipped.
# clang with its libFuzzer runtime (libclang-rt-dev: libclang-rt-14-dev on
# Debian 12) builds the fuzz harnesses (tests/fuzz); without them their
# smoke test is skipped.
# procps (pgrep, sysctl) is what several tests look for processes with.
# iproute2 (ip netns, veth, tc netem) is the several-hosts test bed
# (scripts/test-hosts); without it, or without root, those tests are skipped.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libcjson-dev
      libpcre2-dev libcairo2-dev openmpi-bin libopenmpi-dev gzip libmicrohttpd-dev libjs-chart.js libdnnl-dev)
optional=()
if [[ "${1:-}" == "--test" ]]; then
  pkgs+=(python3 python3-numpy python3-torch iproute2 procps)
  command -v node > /dev/null || optional+=(nodejs)
  [[ -x /usr/bin/chromium ]] || optional+=(chromium)
  command -v npm > /dev/null || optional+=(npm)
  compgen -G '/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a' > /dev/null &&
    command -v clang > /dev/null || optional+=(clang libclang-rt-dev)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# The test-only npm packages, before the suite (pinned by each directory's
# package-lock.json): playwright-core for the dashboard's browser test,
# js-tiktoken for the tokenizer's parity test.
npm_test_tools() {
  [[ "${1:-}" == "--test" ]] || return 0
  command -v npm > /dev/null || return 0
  local root dir pkg
  root="$(cd "$(dirname "$0")/.." && pwd)"
  for dir_pkg in "dashboard playwright-core" "node js-tiktoken"; do
    read -r dir pkg <<< "$dir_pkg"
    [[ -f "$root/tests/$dir/node_modules/$pkg/package.json" ]] && continue
    echo "megascale: installing $pkg into $root/tests/$dir (a test-only tool)" >&2
    (cd "$root/tests/$dir" && npm ci --no-audit --no-fund --loglevel=error >&2) ||
      echo "megascale: npm ci of $pkg failed; the test that needs it will be skipped" >&2
  done
}
if [[ ${#missing[@]} -eq 0 && ${#optional[@]} -eq 0 ]]; then
  npm_test_tools "${1:-}"
  exit 0
fi

cmd="apt-get install -y --no-install-recommends"
if [[ $(id -u) -ne 0 ]]; then
  echo "megascale: missing Debian packages: ${missing[*]} ${optional[*]}" >&2
  echo "megascale: run as root:  apt-get update && $cmd ${missing[*]} ${optional[*]}" >&2
  [[ ${#missing[@]} -eq 0 ]] && exit 0
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "megascale: installing ${missing[*]}" >&2
  $cmd "${missing[@]}" >&2
fi
if [[ ${#optional[@]} -gt 0 ]]; then
  echo "megascale: installing ${optional[*]} (optional: the tokenizer parity, browser and fuzz tests)" >&2
  $cmd "${optional[@]}" >&2 ||
    echo "megascale: could not install ${optional[*]}; the tests that need them will say so and be skipped" >&2
fi
npm_test_tools "${1:-}"
