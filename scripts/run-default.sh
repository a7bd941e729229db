#!/usr/bin/env bash
# Fresh-machine entry point for the main job: installs what is missing, builds,
# and serves the bundled default model with colibri-server on 127.0.0.1:8080
# (OpenAI-compatible HTTP; gRPC on 50051). Extra arguments go to colibri-server
# (e.g. --port 9000). With --generate, runs one colibri-run generation instead
# and passes the remaining arguments to it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh" >/dev/null
build_dir=${BUILD_DIR:-$root/build}
model=${COLIBRI_MODEL:-$root/models/default}

if [[ ${1:-} == --generate ]]; then
  shift
  if [[ $# -eq 0 ]]; then set -- --prompt "And God said" --max-tokens 48 --temperature 0.7 --seed 1; fi
  exec "$build_dir/tools/colibri-run" --model "$model" "$@"
fi

cat >&2 <<'MSG'
colibri: serving the bundled default model. Try, from another terminal:
  curl -N http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"Tell me of the flood."}],"max_tokens":64,"stream":true}'
Stop with Ctrl-C.
MSG
exec "$build_dir/server/colibri-server" --model "$model" "$@"
