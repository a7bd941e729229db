#!/usr/bin/env bash
# Only the instruction-set kernel files (engine/kernels/kernels_avx2.cpp,
# kernels_avx512.cpp and kernels_amx.cpp) may contain AVX/AVX-512/AMX instructions, and only in their
# internal functions: anything else (an inline template instantiated there
# and picked by the linker for everyone, say) would run on CPUs without them.
# Checked on the linked colibri-run: every function using ymm/zmm/mask/tile
# registers must be in colibri::kernels' anonymous namespace, or be a GCC
# target_clones clone ("[clone .avx2]"): those run only through an ifunc whose
# resolver checks CPUID when the program loads.
set -euo pipefail
build_dir=$1
run=$build_dir/tools/colibri-run
if [[ $(uname -m) != x86_64 ]]; then
  echo "isa_isolation: not x86-64, nothing to check"
  exit 0
fi
if ! command -v objdump >/dev/null; then
  echo "isa_isolation: objdump not found (binutils)" >&2
  exit 1
fi
# A whole-build -mavx2 / -march=native makes every file vector code: then there is nothing to isolate.
if objdump -d --no-show-raw-insn "$build_dir/engine/CMakeFiles/colibri_engine.dir/kernels/dispatch.cpp.o" |
  grep -qE '%(ymm|zmm)[0-9]'; then
  echo "isa_isolation: the build compiles everything with AVX flags; skipped"
  exit 0
fi
offenders=$(objdump -d --no-show-raw-insn -C "$run" |
  awk '/^[0-9a-f]+ <.*>:$/ { fn = $0; next } /%(ymm|zmm|tmm)[0-9]|%k[0-7]|ldtilecfg|tilerelease/ { print fn }' |
  sort -u | grep -v 'colibri::kernels::(anonymous namespace)::' | grep -v '\[clone \.avx2\]>:$' || true)
if [[ -n $offenders ]]; then
  echo "isa_isolation: AVX code outside the dispatched kernel files:" >&2
  echo "$offenders" >&2
  exit 1
fi
count=$(objdump -d --no-show-raw-insn -C "$run" |
  awk '/^[0-9a-f]+ <.*>:$/ { fn = $0; next } /%(ymm|zmm)[0-9]/ { print fn }' | sort -u | wc -l)
if [[ $count -eq 0 ]]; then
  echo "isa_isolation: no AVX code found at all: are the kernel files built?" >&2
  exit 1
fi
echo "isa_isolation: $count functions use AVX registers, all inside the dispatched kernel files"
