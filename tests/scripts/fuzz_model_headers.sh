#!/usr/bin/env bash
# Fuzzes the GGUF, safetensors and config.json readers (every input goes to all
# three) for a bounded time from tests/fuzz/corpus/model_headers: see
# tests/fuzz/run_fuzzer.sh and tests/fuzz/fuzz_model_headers.cpp.
set -euo pipefail
exec bash "$(dirname "$0")/../fuzz/run_fuzzer.sh" "$1" fuzz_model_headers model_headers \
  tests/fuzz/fuzz_model_headers.cpp engine/format/gguf.cpp engine/format/ggml_blocks.cpp engine/format/safetensors.cpp \
  engine/core/dtype.cpp engine/core/mapped_file.cpp engine/core/system_memory.cpp engine/core/arena.cpp engine/core/text_file.cpp engine/model/model_config.cpp \
  engine/arch/arch_spec.cpp
