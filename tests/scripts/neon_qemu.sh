#!/usr/bin/env bash
# The aarch64 kernels (NEON with dot product, and the portable path) checked
# on this x86 machine: cross-compiles engine/kernels and the plain test
# program tests/unit/kernel_checks_main.cpp with aarch64-linux-gnu-g++ -static
# and runs it under qemu-aarch64 -cpu max (which has dotprod). The program
# checks matvec against the scalar reference and the exact integer product,
# matmat against matvec bit for bit, attention over f32 and f16 KV caches
# against the scalar reference, and the f32 -> f16 conversion bit for bit, on
# every path the emulated CPU has.
# Skips (exit 0) only when the cross compiler or qemu is missing;
# scripts/install-deps.sh installs both.
#   usage: neon_qemu.sh <build_dir> [data_dir]
set -euo pipefail

build_dir=${1:?usage: neon_qemu.sh <build_dir> [data_dir]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cxx=${COLIBRI_AARCH64_CXX:-aarch64-linux-gnu-g++}
qemu=${COLIBRI_QEMU_AARCH64:-qemu-aarch64}

for tool in "$cxx" "$qemu"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "skipped: $tool is not installed (scripts/install-deps.sh installs g++-aarch64-linux-gnu and qemu-user)"
    exit 0
  fi
done

# Reruns are nearly free with ccache (the project build uses it too).
launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(ccache); fi

out="$build_dir/neon_qemu"
mkdir -p "$out"
engine="$root/engine"
# Only the kernels and what they include; the flags of engine/CMakeLists.txt
# for the path files.
common=(-std=c++20 -O2 -Wall -Wextra -Wpedantic -Wshadow=local -I"$engine" -I"$root/tests/unit")
declare -A extra=(
  [kernels/kernels_neon.cpp]="-march=armv8.2-a+dotprod -ffp-contract=off"
  [kernels/kernels_scalar.cpp]="-ffp-contract=off"
)
sources=(kernels/dispatch.cpp kernels/kernels_scalar.cpp kernels/kernels_neon.cpp kernels/quantize.cpp
         kernels/reference.cpp kernels/weight_format.cpp core/dtype.cpp)

pids=() objects=()
for src in "${sources[@]}"; do
  obj="$out/$(basename "${src%.cpp}").o"
  objects+=("$obj")
  # shellcheck disable=SC2086  # the extra flags are words
  "${launcher[@]}" "$cxx" "${common[@]}" ${extra[$src]:-} -c "$engine/$src" -o "$obj" &
  pids+=($!)
  # Two compilers at a time: the machine has two cores.
  if ((${#pids[@]} % 2 == 0)); then wait "${pids[-2]}" "${pids[-1]}"; fi
done
wait
"${launcher[@]}" "$cxx" "${common[@]}" -c "$root/tests/unit/kernel_checks_main.cpp" -o "$out/kernel_checks_main.o"
"$cxx" -static -o "$out/kernel_checks" "$out/kernel_checks_main.o" "${objects[@]}"

log="$out/kernel_checks.log"
if ! "$qemu" -cpu max "$out/kernel_checks" 40 >"$log" 2>&1; then
  cat "$log"
  echo "FAIL: kernel checks under $qemu"
  exit 1
fi
cat "$log"
# A CPU model without dotprod would quietly test the portable path only.
if ! grep -q '^neon ' "$log"; then
  echo "FAIL: the NEON path did not run (no dotprod in the emulated CPU?)"
  exit 1
fi
echo "neon_qemu: ok"
