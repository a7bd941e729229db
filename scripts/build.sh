#!/usr/bin/env bash
# Configures and builds Colibri into ${BUILD_DIR:-build} (Release, Ninja, ccache).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
if [[ ! -f $build_dir/build.ninja ]]; then
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@" >/dev/null
fi
cmake --build "$build_dir" -j "$jobs"
