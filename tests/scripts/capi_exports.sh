#!/usr/bin/env bash
# libcolibri.so exports only the C interface: every defined dynamic symbol is
# a colibri_ function (the engine, fmt, nlohmann, ... stay internal).
set -euo pipefail
build_dir=$1
library=$build_dir/lib/libcolibri.so
if [[ ! -f $library ]]; then echo "FAIL: $library is not built"; exit 1; fi
symbols=$(nm -D --defined-only "$library" | awk '{print $NF}')
count=$(grep -c . <<<"$symbols" || true)
others=$(grep -v '^colibri_' <<<"$symbols" || true)
if [[ -n $others ]]; then
  echo "FAIL: libcolibri.so exports symbols outside colibri_*:"
  echo "$others" | head -50
  exit 1
fi
if [[ $count -lt 26 ]]; then
  echo "FAIL: only $count colibri_ symbols exported"; echo "$symbols"; exit 1
fi
echo "libcolibri.so exports $count symbols, all colibri_*"
