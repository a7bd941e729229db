#!/usr/bin/env bash
# lock_memory (RELIABILITY.md 1F, row 78): with the locked-memory limit at 0
# and no CAP_IPC_LOCK the server still starts and serves, and says why the
# weights are not locked and how to allow it; with room to lock, the weights
# (here a checkpoint converted at load) are locked, as VmLck shows through
# colibri_process_locked_memory_bytes. With require_locked_memory the refused
# lock fails the start instead.
set -euo pipefail
source "$(dirname "$0")/lib/server_port.sh"
build_dir=$(cd "$1" && pwd)
data_dir=$(cd "$2" && pwd)
server=$build_dir/server/colibri-server
test_name=lock_memory
source "$(dirname "$0")/lib/background_server.sh"
chmod 755 "$work"
command -v prlimit > /dev/null || fail "prlimit (util-linux) is missing"
# A copy any user can read: the refused case runs as nobody when this runs as root.
cp -r "$data_dir/fixtures/qwen3moe-tiny" "$work/model"
chmod -R a+rX "$work/model"

# Runs the server under "$@" (a wrapper, possibly empty), waits for its port.
start() {
  "$@" "$server" --model "$work/model" --port 0 --grpc-port -1 --lock-memory true --watch-model off \
    > "$work/server.out" 2> "$work/server.log" &
  pid=$!
  port=$(wait_for_port "$work/server.out") || fail "the server did not start under: $*"
}
stop() {
  kill "$pid"
  wait "$pid" || true
  pid=
}
locked_bytes() { curl -sf "http://127.0.0.1:$port/metrics" | sed -n 's/^colibri_process_locked_memory_bytes //p'; }

as_unprivileged=()
[[ $(id -u) -eq 0 ]] && as_unprivileged=(setpriv --reuid=65534 --regid=65534 --clear-groups)
start prlimit --memlock=0:0 "${as_unprivileged[@]}"
status=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" -d '{"prompt": "x", "max_tokens": 2}')
[[ $status == 200 ]] || fail "a refused mlock stopped the server from serving (HTTP $status)"
[[ $(locked_bytes) == 0 ]] || fail "memory locked under a zero limit: $(locked_bytes)"
grep -q "lock_memory: mlock of [0-9]* bytes failed" "$work/server.log" || fail "the refusal was not logged"
grep -q "LimitMEMLOCK=infinity" "$work/server.log" || fail "the log does not say how to allow locking"
failed=$(curl -sf "http://127.0.0.1:$port/metrics" | sed -n 's/^colibri_model_lock_failed //p')
[[ $failed == 1 ]] || fail "colibri_model_lock_failed is '$failed', not 1, with the lock refused"
stop

# require_locked_memory: the same refusal fails the start instead.
set +e
prlimit --memlock=0:0 "${as_unprivileged[@]}" "$server" --model "$work/model" --port 0 --grpc-port -1 \
  --lock-memory true --require-locked-memory true --watch-model off > "$work/required.out" 2> "$work/required.log"
status=$?
set -e
[[ $status -eq 1 ]] || fail "with require_locked_memory a refused lock exited $status, not 1"
grep -q "not enough memory may be locked: .*mlock of [0-9]* bytes failed.*require_locked_memory is set" \
  "$work/required.log" || fail "the refusal does not say why: $(tail -c 400 "$work/required.log")"

# Locking is expected where this process could lock 4 MiB: as root (CAP_IPC_LOCK)
# or with such a limit (raising it needs CAP_SYS_RESOURCE, which containers drop).
limit=$(ulimit -l)
if [[ $(id -u) -ne 0 && $limit != unlimited && $limit -lt 4096 ]]; then
  echo "lock_memory: ok (refused and said so at limit 0; locking itself not checked: limit ${limit} KiB, not root)"
  exit 0
fi
start
locked=$(locked_bytes)
[[ -n $locked && $locked -gt 1000000 ]] || fail "the converted weights were not locked (VmLck $locked bytes)"
failed=$(curl -sf "http://127.0.0.1:$port/metrics" | sed -n 's/^colibri_model_lock_failed //p')
[[ $failed == 0 ]] || fail "colibri_model_lock_failed is '$failed' with the weights locked"
stop
echo "lock_memory: ok (refused and said so at limit 0; $locked bytes locked otherwise)"
