#!/usr/bin/env bash
# Fresh-machine entry point for the main job: installs what is missing, builds,
# and generates text with the bundled default model. Extra arguments go to
# colibri-run (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh" >/dev/null
build_dir=${BUILD_DIR:-$root/build}
model=${COLIBRI_MODEL:-$root/models/default}
if [[ ! -f $model/config.json ]]; then
  echo "run-default: no bundled model at $model; using the random-weight test fixture" >&2
  model=$root/tests/data/fixtures/mixtral-tiny
fi
if [[ $# -eq 0 ]]; then
  set -- --prompt "And God said" --max-tokens 48 --temperature 0.7 --seed 1
fi
exec "$build_dir/tools/colibri-run" --model "$model" "$@"
