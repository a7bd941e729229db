#!/usr/bin/env bash
# Fuzzes the tokenizer (encode, decode, streaming decode; round trips) for a
# bounded time from tests/fuzz/corpus/tokenizer, with the fixtures', the
# bundled model's and Llama 2's tokenizers: see tests/fuzz/run_fuzzer.sh and
# tests/fuzz/fuzz_tokenizer.cpp.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export COLIBRI_FUZZ_TOKENIZERS="$root/tests/data/fixtures/olmoe-tiny:$root/models/default:$root/tests/data/tokenizers/llama2"
sources=(tests/fuzz/fuzz_tokenizer.cpp)
for f in "$root"/engine/tokenizer/*.cpp; do sources+=("engine/tokenizer/$(basename "$f")"); done
sources+=(engine/core/text_file.cpp engine/core/utf8.cpp)  # files are read, and UTF-8 checked, through them
exec bash "$root/tests/fuzz/run_fuzzer.sh" "$1" fuzz_tokenizer tokenizer "${sources[@]}"
