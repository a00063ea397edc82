#!/usr/bin/env bash
# bench/gpu_kit.sh: the CUDA build, with the libraries it needs, carried to a
# GPU machine that has CUDA and PyTorch but none of our other dependencies
# (the device machine of this workplace: CUDA, PyTorch and Ubuntu's OpenMPI,
# no cJSON, PCRE2, OpenBLAS, cairo, libmicrohttpd, oneDNN, and nothing can
# be installed there).
#
#   bench/gpu_kit.sh pack [BUILD_DIR] [KIT]     here: KIT (default
#       .devkit/kit.tar.xz) holds megascale and the GPU test programs of
#       BUILD_DIR (a CUDA build; default build-gpu, configured and built
#       when missing), every shared library they and OpenMPI's mpirun and
#       plugins load except the C library, libstdc++ and CUDA's own (the
#       driver, cuBLASLt and NCCL come from the GPU machine), and OpenMPI's
#       and PMIx's plugin and help trees.
#   bench/gpu_kit.sh install KIT DIR            there: unpacks KIT into DIR
#       and writes DIR/bin, a wrapper per program that runs it on the kit's
#       libraries and the machine's CUDA ones. OpenMPI's trees go to their
#       own absolute paths only when the machine has no OpenMPI of its own
#       (nothing already there is overwritten); where it has one, the
#       kit's MPI libraries are dropped and its own are used
#       (MS_KIT_OWN_MPI=1: the kit's, always). Prints the
#       PATH to use. bench/gpu_step.sh calls this when KIT is set.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# what the GPU machine has, or must come from it
keep_out='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcublas|libcudart|libnvidia)'
mpi_libs='(libmpi|libopen-rte|libopen-pal|liboshmem|libpmix|libhwloc|libevent|libmca_common)'
mpi_trees=(usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 usr/share/openmpi
  usr/share/pmix etc/openmpi)

pack() {
  local build=${1:-$root/build-gpu} kit=${2:-$root/.devkit/kit.tar.xz}
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMS_CUDA=ON > /dev/null
  fi
  grep -q '^MS_CUDA:BOOL=ON' "$build/CMakeCache.txt" || { echo "gpu_kit: $build is not a CUDA build" >&2; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target megascale test_cu_ops test_cu_attention test_cu_lt > /dev/null
  cmake --build "$build" -j"$(nproc)" --target test_comm_nccl > /dev/null 2>&1 || true
  # the CUDA backend loads cuBLASLt by its soname (src/backend/cuda/cu_lt.cu)
  grep -a -q 'libcublasLt\.so\.[0-9]' "$build/megascale" || { echo "gpu_kit: $build/megascale has no CUDA backend" >&2; exit 1; }
  stage=$(mktemp -d) # global: the EXIT trap runs after pack has returned
  trap 'rm -rf "$stage"' EXIT # also when set -e ends the script mid-pack
  mkdir -p "$stage/real" "$stage/lib" "$stage/root"
  local progs=("$build/megascale")
  for t in test_cu_ops test_cu_attention test_cu_lt test_comm_nccl; do
    [[ -x $build/tests/$t ]] && progs+=("$build/tests/$t")
  done
  cp "${progs[@]}" "$stage/real/"
  local mpirun
  mpirun=$(readlink -f "$(command -v mpirun)")
  cp "$mpirun" "$stage/real/mpirun"
  [[ -x /usr/bin/orted ]] && cp "$(readlink -f /usr/bin/orted)" "$stage/real/orted"
  for t in "${mpi_trees[@]}"; do
    [[ -d /$t ]] && { mkdir -p "$stage/root/$(dirname "$t")"; cp -a "/$t" "$stage/root/$t"; }
  done
  # every library loaded by the programs and by the plugins (dlopened)
  find "$stage/real" "$stage/root" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
    xargs -0 -n 50 ldd 2> /dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    while read -r lib; do
      base=$(basename "$lib")
      [[ $base =~ $keep_out ]] && continue
      cp -L "$lib" "$stage/lib/$base"
    done
  printf '%s\n' "$(git -C "$root" describe --always --dirty 2> /dev/null || echo unknown)" > "$stage/COMMIT"
  mkdir -p "$(dirname "$kit")"
  tar -C "$stage" -cf - . | xz -T0 -6 > "$kit.tmp"
  mv "$kit.tmp" "$kit"
  echo "gpu_kit: $kit ($(du -h "$kit" | cut -f1); $(ls "$stage/real" | tr '\n' ' ')$(ls "$stage/lib" | wc -l) libraries)"
}

# the directory of the first file named $1 under the usual places
find_lib() {
  local d f
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda*/lib* \
    /usr/lib/x86_64-linux-gnu /opt /usr/local/lib; do
    [[ -d $d ]] || continue
    f=$(find -L "$d" -maxdepth 10 -name "$1" -print -quit 2> /dev/null)
    [[ -n $f ]] && { dirname "$f"; return 0; }
  done
  return 1
}

install_kit() {
  local kit=$1 dir=$2 cudalibs="" d n up=$2
  # what mkdir -p makes here (DIR, or its first missing parent) goes again
  # when the install fails (set -e ends the script)
  made=""
  while [[ ! -e $up ]]; do made=$up up=$(dirname "$up"); done
  trap '[[ -z $made ]] || rm -rf "$made"' EXIT
  mkdir -p "$dir"
  xz -dc "$kit" | tar -C "$dir" -xf - ||
    { echo "gpu_kit: $kit: unpacking failed (a kit is the xz tar of bench/gpu_kit.sh pack)" >&2; exit 1; }
  if [[ -z ${MS_KIT_OWN_MPI:-} && -d /usr/lib/x86_64-linux-gnu/openmpi ]] &&
    command -v mpirun > /dev/null; then
    echo "gpu_kit: this machine's OpenMPI ($(command -v mpirun)) is used" >&2
    # its plugins must load the libraries it was built with: the kit's MPI
    # libraries go, and so does every library the machine has itself (the
    # same soname is the same interface); the kit keeps only what is missing
    find "$dir/lib" -maxdepth 1 -regextype posix-extended -regex ".*/${mpi_libs}[^/]*" -delete
    # x86-64 ones only: a 32-bit library of the same name is not ours
    ldconfig -p | awk '/x86-64/ {print $1}' | sort -u > "$dir/system.libs"
    for f in "$dir"/lib/*; do
      grep -qxF "$(basename "$f")" "$dir/system.libs" && rm -f "$f"
    done
    rm -f "$dir/real/mpirun" "$dir/real/orted"
  else
    # cp -n: nothing of the machine's own is replaced
    (cd "$dir/root" && find . -mindepth 1 -type d -exec mkdir -p "/{}" \; &&
      find . \( -type f -o -type l \) -exec sh -c 'for f; do [ -e "/$f" ] || cp -a "$f" "/$f"; done' sh {} +)
  fi
  # the cuBLASLt the backend loads (dlopen: on LD_LIBRARY_PATH, as the wrapper sets it)
  local lt
  lt=$(grep -a -o -m1 'libcublasLt\.so\.[0-9]*' "$dir/real/megascale" || true)
  lt=${lt%%$'\n'*}
  for n in ${lt:-libcublasLt.so.13} libnccl.so.2; do
    if d=$(find_lib "$n"); then
      [[ :$cudalibs: == *:$d:* ]] || cudalibs=$cudalibs:$d
    else
      echo "gpu_kit: $n not found on this machine" >&2
    fi
  done
  mkdir -p "$dir/bin"
  for p in "$dir"/real/*; do
    n=$(basename "$p")
    printf '#!/bin/bash\nLD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %q "$@"\n' \
      "$dir/lib$cudalibs" "$p" > "$dir/bin/$n"
    chmod +x "$dir/bin/$n"
  done
  made="" # installed: DIR stays
  echo "$dir/bin"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  install)
    [[ $# -eq 3 && -n $3 ]] || { echo "usage: $0 install KIT DIR" >&2; exit 2; }
    [[ -r $2 && ! -d $2 ]] || { echo "gpu_kit: install: KIT $2: not a readable file" >&2; exit 2; }
    install_kit "$2" "$3" ;;
  -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
