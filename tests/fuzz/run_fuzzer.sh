#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time (COLIBRI_FUZZ_SECONDS, default
# 20) from its committed seed corpus, under AddressSanitizer and UBSan. Fails on
# any finding (crash, sanitizer report, timeout, out-of-memory) and keeps the
# input that caused it in BUILD_DIR/fuzz/artifacts.
#
#   run_fuzzer.sh BUILD_DIR TARGET CORPUS SOURCE...
#
# TARGET names the binary (and tests/fuzz/TARGET.cpp, which SOURCE lists with
# the engine sources it needs, relative to the repository), CORPUS the folder
# under tests/fuzz/corpus. Called by the tests/scripts/fuzz_*.sh tests.
#
# The project builds with g++, which has no libFuzzer, so the target is compiled
# here with clang++. A missing clang++ or libFuzzer runtime is a FAILURE, not a
# skip: scripts/install-deps.sh installs both (clang, libclang-rt-dev), so their
# absence is a broken machine. A clang build of the project (tests/CMakeLists.txt)
# makes the target itself, and that one is used.
set -euo pipefail
build_dir=$1
target=$2
corpus=$3
shift 3
sources=("$@")
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${COLIBRI_FUZZ_SECONDS:-20}
out=$build_dir/fuzz
bin=$out/$target
mkdir -p "$out/artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL $target: $*" >&2; exit 1; }

# Compiles the target with clang++ into $bin unless it is newer than its
# sources and every engine and server header they could include.
build_with_clang() {
  local cxx=${COLIBRI_FUZZ_CXX:-clang++}
  command -v "$cxx" >/dev/null 2>&1 ||
    fail "$cxx not found. Install clang and the libFuzzer runtime: bash scripts/install-deps.sh (Debian: apt-get install clang libclang-rt-dev)"
  printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n' \
    > "$work/probe.cpp"
  "$cxx" -fsanitize=fuzzer "$work/probe.cpp" -o "$work/probe" 2> "$work/probe.err" ||
    { cat "$work/probe.err" >&2
      fail "$cxx cannot link with -fsanitize=fuzzer: the libFuzzer runtime is missing (Debian: apt-get install libclang-rt-dev, which bash scripts/install-deps.sh does)"; }

  local stale=0 f
  [[ -x $bin ]] || stale=1
  local headers
  mapfile -t headers < <(find "$root/engine" "$root/server" -name '*.h')
  for f in "${sources[@]/#/$root/}" "${headers[@]}" "$0"; do
    [[ $f -nt $bin ]] && stale=1
  done
  ((stale)) || return 0
  local flags=(-std=c++20 -O1 -g -fdebug-prefix-map="$root"=. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
               -Wall -Wextra -Wpedantic -I"$root/engine" -I"$root/server")
  local dep_cflags dep_libs
  read -r -a dep_cflags <<< "$(pkg-config --cflags libxxhash fmt nlohmann_json libpcre2-8 2>/dev/null || true)"
  read -r -a dep_libs <<< "$(pkg-config --libs libxxhash fmt libpcre2-8 2>/dev/null || echo -lxxhash -lfmt -lpcre2-8)"
  # Through ccache when there is one, as the project's own build: the
  # sanitized objects are rebuilt whenever a header changes, mostly unchanged.
  # Paths are made relative to the checkout (base dir, debug prefix map, no
  # working-directory hash), so another clone on the same machine hits too.
  local launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(env CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true ccache)
  # One compiler per source, two at a time (the CI box has two cores).
  local pids=() src obj status=0 pid
  for src in "${sources[@]}"; do
    obj=$work/$(basename "$src" .cpp).o
    "${launcher[@]}" "$cxx" "${flags[@]}" "${dep_cflags[@]}" -c "$root/$src" -o "$obj" 2> "$obj.log" & pids+=($!)
    if ((${#pids[@]} == 2)); then
      for pid in "${pids[@]}"; do wait "$pid" || status=1; done
      pids=()
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  cat "$work"/*.o.log >&2
  ((status == 0)) || fail "compiling the fuzz target failed"
  "$cxx" -fsanitize=fuzzer,address,undefined "$work"/*.o "${dep_libs[@]}" -o "$bin.new" ||
    fail "linking the fuzz target failed"
  mv "$bin.new" "$bin"
}

start=$(date +%s)
if [[ -x $build_dir/tests/$target ]]; then
  bin=$build_dir/tests/$target
else
  build_with_clang
fi
built=$(date +%s)

# A copy of the corpus: the fuzzer adds what it finds, and the committed corpus
# stays the curated one.
cp -r "$root/tests/fuzz/corpus/$corpus" "$work/corpus"
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
echo "$target: OK: $execs inputs in ${seconds}s, no findings ($stats)"
echo "$target: build $((built - start)) s, run $((done_at - built)) s"
