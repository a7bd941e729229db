#!/usr/bin/env bash
# colibri-server on the qwen3moe-tiny fixture, with an API key, driven by the
# official OpenAI and Anthropic Node.js clients (tests/clients/node/
# openai_test.mjs and anthropic_test.mjs): completions, chat and messages,
# streamed and not, logprobs, echo, JSON output, and the clients' typed errors.
# The clients are pinned in that folder's package-lock.json and installed by
# scripts/install-deps.sh (npm ci).
set -euo pipefail
source "$(dirname "$0")/lib/server_port.sh"
build_dir=$(cd "$1" && pwd)
data_dir=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
client_dir=$src/tests/clients/node
server=$build_dir/server/colibri-server
command -v node > /dev/null || { echo "FAIL node_clients: node is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
for package in openai @anthropic-ai/sdk; do
  [[ -f $client_dir/node_modules/$package/package.json ]] ||
    { echo "FAIL node_clients: $package is not installed: run scripts/install-deps.sh (npm ci in $client_dir)" >&2; exit 1; }
done

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
port=$(wait_for_port "$work/server.out") || { echo "FAIL node_clients: the server did not start" >&2; tail -20 "$work/server.log" >&2; exit 1; }
for test in openai_test.mjs anthropic_test.mjs; do
  if ! node "$client_dir/$test" "http://127.0.0.1:$port" client-test-key; then
    echo "FAIL node_clients: $test; --- server log" >&2
    tail -30 "$work/server.log" >&2
    exit 1
  fi
done
