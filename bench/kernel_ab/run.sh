#!/usr/bin/env bash
# A/B of an ISA file's kernels in one process (harness.cpp): REV's copy of
# engine/kernels/kernels_ISA.cpp against the build's (build it first).
#   bench/kernel_ab/run.sh REV [avx2|avx512|amx] -- ROWS COLS N TWO_PLANES [ROUNDS [q8|q4]]
# e.g. bench/kernel_ab/run.sh HEAD~1 avx2 -- 1024 2048 16 0 20
# amx compares REV's kernels_amx.cpp with its own kernels_avx512.cpp beneath
# it (what it falls back to) against the build's.
# Not part of the build or the tests: a tool for comparing kernels on a noisy host.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rev=$1 isa=${2:-avx2}
shift 2; [[ ${1:-} == -- ]] && shift
build=${BUILD_DIR:-$root/build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-mavx2 -mfma -mf16c)
[[ $isa == avx512 || $isa == amx ]] && flags+=(-mavx512f -mavx512bw -mavx512vl -mavx512vnni)
[[ $isa == amx ]] && flags+=(-mamx-tile -mamx-int8)
files=("$isa")
[[ $isa == amx ]] && files+=(avx512)
objects=()
for file in "${files[@]}"; do
  git -C "$root" show "$rev:engine/kernels/kernels_$file.cpp" >"$out/old_$file.cpp"
  g++ -std=c++20 -O2 "${flags[@]}" -ffp-contract=off -Dcolibri=colibri_old -I"$root/engine" \
    -I"$root/engine/include" -c "$out/old_$file.cpp" -o "$out/old_$file.o"
  objects+=("$out/old_$file.o")
done
g++ -std=c++20 -O2 "${flags[@]}" -DCOLIBRI_AB_TABLE="${isa}_kernel_table" -I"$root/engine" -I"$root/engine/include" \
  "$root/bench/kernel_ab/harness.cpp" "${objects[@]}" "$build/engine/libcolibri_engine.a" -lpthread -o "$out/harness"
if [[ -n ${KEEP_HARNESS:-} ]]; then cp "$out/harness" "$KEEP_HARNESS"; fi
"$out/harness" "$@"
