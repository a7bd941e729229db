#!/usr/bin/env bash
# Fuzzes the .colibri parser for a bounded time from tests/fuzz/corpus/colibri:
# see tests/fuzz/run_fuzzer.sh and tests/fuzz/fuzz_colibri_parser.cpp.
set -euo pipefail
exec bash "$(dirname "$0")/../fuzz/run_fuzzer.sh" "$1" fuzz_colibri_parser colibri \
  tests/fuzz/fuzz_colibri_parser.cpp engine/format/colibri_file.cpp engine/kernels/weight_format.cpp
