#!/usr/bin/env bash
# Install the Debian packages MegaScale-C needs, if any are missing.
#   scripts/install-deps.sh          build + run dependencies
#   scripts/install-deps.sh --test   also what the test suite needs
# As root it runs apt-get; otherwise it prints the exact command to run.
# Node.js and npm (js-tiktoken, the tokenizer's reference in one test) are
# looked for as commands, since they are often installed from outside
# Debian (nodesource ships its own npm, which conflicts with Debian's); when
# they cannot be installed, that one test says so and is skipped.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libcjson-dev
      libpcre2-dev libcairo2-dev openmpi-bin libopenmpi-dev gzip)
optional=()
if [[ "${1:-}" == "--test" ]]; then
  pkgs+=(python3 python3-numpy python3-torch)
  command -v node > /dev/null || optional+=(nodejs)
  command -v npm > /dev/null || optional+=(npm)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 && ${#optional[@]} -eq 0 ]] && exit 0

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
  echo "megascale: installing ${optional[*]} (optional, for the tokenizer parity test)" >&2
  $cmd "${optional[@]}" >&2 ||
    echo "megascale: could not install ${optional[*]}; the js-tiktoken parity test will be skipped" >&2
fi
