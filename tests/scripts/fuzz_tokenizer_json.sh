#!/usr/bin/env bash
# Fuzzes reading tokenizer.json (Tokenizer::from_json, then a few encodes and
# decodes with whatever it built) for a bounded time from
# tests/fuzz/corpus/tokenizer_json: see tests/fuzz/run_fuzzer.sh and
# tests/fuzz/fuzz_tokenizer_json.cpp.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sources=(tests/fuzz/fuzz_tokenizer_json.cpp engine/core/text_file.cpp engine/core/utf8.cpp)
for f in "$root"/engine/tokenizer/*.cpp; do sources+=("engine/tokenizer/$(basename "$f")"); done
exec bash "$root/tests/fuzz/run_fuzzer.sh" "$1" fuzz_tokenizer_json tokenizer_json "${sources[@]}"
