#!/usr/bin/env bash
# RELIABILITY.md 1F, row 77: a reload whose new weights cannot be copied into
# the memory that is left (model_memory copy) is refused before anything is
# allocated: 503 insufficient_memory, the served model keeps serving, and the
# process is never OOM-killed. The new file is as large as the machine's RAM
# but sparse. The server runs under an address-space limit, so that were the
# check missing, the copy's allocation would fail (a 422) instead of pushing
# the test machine into the OOM killer.
set -euo pipefail
source "$(dirname "$0")/lib/server_port.sh"
build_dir=$(cd "$1" && pwd)
data_dir=$(cd "$2" && pwd)
test_name=reload_copy_memory
source "$(dirname "$0")/lib/background_server.sh"

"$build_dir/tools/colibri-convert" --input "$data_dir/fixtures/qwen3moe-tiny" --output "$work/model.colibri" \
  --quant int8 --no-progress > /dev/null 2>&1 || fail "conversion"
total_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
prlimit --as=$((total_kib * 1024 / 2)) "$build_dir/server/colibri-server" --model "$work/model.colibri" --port 0 \
  --grpc-port -1 --model-memory copy --watch-model off > "$work/server.out" 2> "$work/server.log" &
pid=$!
port=$(wait_for_port "$work/server.out") || fail "the server did not start"
url=http://127.0.0.1:$port
before=$(curl -sf "$url/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["checksum"])')

truncate -s "${total_kib}K" "$work/next.colibri"
mv "$work/next.colibri" "$work/model.colibri"
status=$(curl -s -o "$work/reload.json" -w '%{http_code}' -X POST "$url/admin/reload" -d '')
[[ $status == 503 ]] || fail "the reload answered $status, not 503: $(head -c 300 "$work/reload.json")"
grep -q '"insufficient_memory"' "$work/reload.json" || fail "not insufficient_memory: $(head -c 300 "$work/reload.json")"
grep -q "not enough memory to copy the weights into memory" "$work/reload.json" ||
  fail "the answer does not say why: $(head -c 300 "$work/reload.json")"
after=$(curl -sf "$url/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["checksum"])')
[[ $after == "$before" ]] || fail "the served model changed ($before -> $after)"
status=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/completions" -d '{"prompt": "x", "max_tokens": 2}')
[[ $status == 200 ]] || fail "the served model stopped answering ($status)"
kill -0 "$pid" || fail "the server died"
echo "reload_copy_memory: ok ($(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"][:160])' "$work/reload.json"))"
