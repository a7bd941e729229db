#!/usr/bin/env bash
# Fuzzes the .colibri parser for a bounded time (COLIBRI_FUZZ_SECONDS, default
# 20) from the committed seed corpus, under AddressSanitizer and UBSan. Fails on
# any finding (crash, sanitizer report, timeout, out-of-memory) and keeps the
# input that caused it in BUILD_DIR/fuzz/artifacts.
#
# The project builds with g++, which has no libFuzzer, so the target is compiled
# here with clang++ from the few engine sources the parser needs. A missing
# clang++ or libFuzzer runtime is a FAILURE, not a skip: scripts/install-deps.sh
# installs both (clang, libclang-rt-dev), so their absence is a broken machine.
set -euo pipefail
build_dir=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${COLIBRI_FUZZ_SECONDS:-20}
out=$build_dir/fuzz
bin=$out/fuzz_colibri_parser
mkdir -p "$out/artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL fuzz_colibri_parser: $*" >&2; exit 1; }

# Compiles the target with clang++ into $bin unless it is newer than its sources.
build_with_clang() {
  local cxx=${COLIBRI_FUZZ_CXX:-clang++}
  command -v "$cxx" >/dev/null 2>&1 ||
    fail "$cxx not found. Install clang and the libFuzzer runtime: bash scripts/install-deps.sh (Debian: apt-get install clang libclang-rt-dev)"
  printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n' \
    > "$work/probe.cpp"
  "$cxx" -fsanitize=fuzzer "$work/probe.cpp" -o "$work/probe" 2> "$work/probe.err" ||
    { cat "$work/probe.err" >&2
      fail "$cxx cannot link with -fsanitize=fuzzer: the libFuzzer runtime is missing (Debian: apt-get install libclang-rt-dev, which bash scripts/install-deps.sh does)"; }

  local sources=(
    "$root/engine/format/colibri_file.cpp"
    "$root/engine/kernels/weight_format.cpp"
    "$root/tests/fuzz/fuzz_colibri_parser.cpp"
  )
  local headers=(
    "$root/engine/format/colibri_file.h"
    "$root/engine/kernels/weight_format.h"
    "$root/engine/core/result.h"
  )
  local stale=0 f
  [[ -x $bin ]] || stale=1
  for f in "${sources[@]}" "${headers[@]}" "$0"; do [[ $f -nt $bin ]] && stale=1; done
  ((stale)) || return 0
  local flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
               -Wall -Wextra -Wpedantic -I"$root/engine")
  local dep_cflags dep_libs
  read -r -a dep_cflags <<< "$(pkg-config --cflags libxxhash fmt 2>/dev/null || true)"
  read -r -a dep_libs <<< "$(pkg-config --libs libxxhash fmt 2>/dev/null || echo -lxxhash -lfmt)"
  # One compiler per source, in parallel: the three take about as long as the slowest.
  local pids=() src obj status=0 pid
  for src in "${sources[@]}"; do
    obj=$work/$(basename "$src" .cpp).o
    "$cxx" "${flags[@]}" "${dep_cflags[@]}" -c "$src" -o "$obj" 2> "$obj.log" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  cat "$work"/*.o.log >&2
  ((status == 0)) || fail "compiling the fuzz target failed"
  "$cxx" -fsanitize=fuzzer,address,undefined "$work"/*.o "${dep_libs[@]}" -o "$bin.new" ||
    fail "linking the fuzz target failed"
  mv "$bin.new" "$bin"
}

start=$(date +%s)
if [[ -x $build_dir/tests/fuzz_colibri_parser ]]; then
  # A build whose compiler has libFuzzer (clang) made the target already (tests/CMakeLists.txt).
  bin=$build_dir/tests/fuzz_colibri_parser
else
  build_with_clang
fi
built=$(date +%s)

# A copy of the corpus: the fuzzer adds what it finds, and the committed corpus
# stays the curated one.
cp -r "$root/tests/fuzz/corpus/colibri" "$work/corpus"
status=0
"$bin" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=1024 -print_final_stats=1 \
  -artifact_prefix="$out/artifacts/" "$work/corpus" > "$work/fuzz.log" 2>&1 || status=$?
done_at=$(date +%s)
if ((status != 0)); then
  grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$work/fuzz.log" | tail -60 >&2
  fail "the fuzzer found a problem (exit $status); reproduce with: $bin $out/artifacts/<file>"
fi
stats=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$work/fuzz.log" | tail -1)
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")
echo "fuzz_colibri_parser: OK: $execs inputs in ${seconds}s, no findings ($stats)"
echo "fuzz_colibri_parser: build $((built - start)) s, run $((done_at - built)) s"
