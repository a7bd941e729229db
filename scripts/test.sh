#!/usr/bin/env bash
# Fresh-machine entry point for the whole test suite: installs what is missing,
# builds, and runs every ctest test. Extra arguments go to ctest (e.g. -L golden).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
build_dir=${BUILD_DIR:-$root/build}
cd "$build_dir"
# A hung test fails after 10 minutes instead of holding CI to its limit.
ctest --output-on-failure --timeout 600 -j "${JOBS:-$(nproc)}" "$@"
