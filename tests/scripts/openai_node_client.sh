#!/usr/bin/env bash
# colibri-server on the qwen3moe-tiny fixture, with an API key, driven by the
# official OpenAI Node.js client (tests/clients/openai-node/client_test.mjs):
# models, completions and chat streamed and not, logprobs, and the client's
# typed errors for 400/401/404. The client is pinned in that folder's
# package-lock.json and installed by scripts/install-deps.sh (npm ci).
set -euo pipefail
build_dir=$(cd "$1" && pwd)
data_dir=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
client_dir=$src/tests/clients/openai-node
server=$build_dir/server/colibri-server
command -v node > /dev/null || { echo "FAIL openai_node_client: node is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
[[ -f $client_dir/node_modules/openai/package.json ]] ||
  { echo "FAIL openai_node_client: the openai client is not installed: run scripts/install-deps.sh (npm ci in $client_dir)" >&2; exit 1; }

work=$(mktemp -d)
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
echo "client-test-key" > "$work/key"
"$server" --model "$data_dir/fixtures/qwen3moe-tiny" --port 0 --grpc-port -1 --max-sessions 2 \
  --context-length 1024 --api-key-file "$work/key" --watch-model off > "$work/server.out" 2> "$work/server.log" &
pid=$!
port=
for _ in $(seq 100); do
  port=$(sed -n 's#.*listening on http://127.0.0.1:\([0-9]*\).*#\1#p' "$work/server.out")
  [[ -n $port ]] && break
  sleep 0.1
done
[[ -n $port ]] || { echo "FAIL openai_node_client: the server did not start" >&2; tail -20 "$work/server.log" >&2; exit 1; }
if ! node "$client_dir/client_test.mjs" "http://127.0.0.1:$port" client-test-key; then
  echo "--- server log" >&2
  tail -30 "$work/server.log" >&2
  exit 1
fi
