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
# iproute2 (ip netns, veth, tc netem) is the several-hosts test bed
# (scripts/test-hosts); without it, or without root, those tests are skipped.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libcjson-dev
      libpcre2-dev libcairo2-dev openmpi-bin libopenmpi-dev gzip libmicrohttpd-dev libjs-chart.js libdnnl-dev)
optional=()
if [[ "${1:-}" == "--test" ]]; then
  pkgs+=(python3 python3-numpy python3-torch iproute2)
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
# playwright-core for the browser test (test-only, pinned in tests/dashboard)
npm_test_tools() {
  [[ "${1:-}" == "--test" ]] || return 0
  local here
  here="$(cd "$(dirname "$0")/.." && pwd)/tests/dashboard"
  [[ -f "$here/node_modules/playwright-core/package.json" ]] && return 0
  command -v npm > /dev/null || return 0
  echo "megascale: installing playwright-core into $here (the dashboard's browser test)" >&2
  (cd "$here" && npm install --no-audit --no-fund --loglevel=error >&2) ||
    echo "megascale: npm install of playwright-core failed; the browser test will be skipped" >&2
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
