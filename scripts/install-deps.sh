#!/usr/bin/env bash
# Install the Debian packages MegaScale-C needs, if any are missing.
#   scripts/install-deps.sh          build + run dependencies
#   scripts/install-deps.sh --test   also what the test suite needs
# As root it runs apt-get; otherwise it prints the exact command to run.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libcjson-dev libpcre2-dev gzip openmpi-bin libopenmpi-dev)
if [[ "${1:-}" == "--test" ]]; then
  pkgs+=(python3 python3-numpy python3-torch nodejs npm)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "megascale: missing Debian packages: ${missing[*]}" >&2
  echo "megascale: run as root:  apt-get update && $cmd" >&2
  exit 1
fi
echo "megascale: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
$cmd >&2
