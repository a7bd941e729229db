#!/usr/bin/env bash
# Fuzzes the HTTP API's request parsing (server/http_json.cpp) for a bounded
# time from tests/fuzz/corpus/http_requests: see tests/fuzz/run_fuzzer.sh and
# tests/fuzz/fuzz_http_requests.cpp.
set -euo pipefail
exec bash "$(dirname "$0")/../fuzz/run_fuzzer.sh" "$1" fuzz_http_requests http_requests \
  tests/fuzz/fuzz_http_requests.cpp server/http_json.cpp engine/core/utf8.cpp server/api.cpp
