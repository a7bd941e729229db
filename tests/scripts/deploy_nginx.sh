#!/usr/bin/env bash
# The shipped nginx config (deploy/nginx/colibri.conf) in front of two
# colibri-server instances on loopback: each pinned to its own CPU (taskset)
# and, where cgroups are writable, in its own cgroup with a memory limit
# (deploy/cgroups/colibri-cgroup.sh). nginx runs in the foreground from a temp
# prefix with the shipped file adapted by sed (test ports; TLS and the :80
# redirect moved to plain loopback ports). Requests go through nginx, one of
# them streaming (its first event must arrive long before its end: no
# buffering); then one instance is killed and requests must still succeed.
set -euo pipefail
source "$(dirname "$0")/lib/server_port.sh"
build_dir=$(cd "$1" && pwd)
data_dir=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
server=$build_dir/server/colibri-server
cgroup_tool=$src/deploy/cgroups/colibri-cgroup.sh
fail() { echo "FAIL deploy_nginx: $*" >&2; for f in "$work"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done; exit 1; }
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $nginx_bin ]] || { echo "FAIL deploy_nginx: nginx is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
work=$(mktemp -d)
chmod 755 "$work"  # nginx workers may run as another user
pids=()
groups=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for g in "${groups[@]}"; do bash "$cgroup_tool" remove "$g" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# CPUs: instance 1 on the first online CPU, instance 2 on the last.
cpus=$(python3 -c 'import os; c=sorted(os.sched_getaffinity(0)); print(c[0], c[-1])')
read -r cpu1 cpu2 <<<"$cpus"
use_cgroups=0
if bash "$cgroup_tool" probe 2>/dev/null; then use_cgroups=1; fi

start_instance() {  # start_instance N CPU
  local n=$1 cpu=$2 prefix=()
  if ((use_cgroups)); then
    local g="deploy-test-$$-$n"
    bash "$cgroup_tool" create "$g" "$cpu" 512M > /dev/null
    groups+=("$g")
    prefix=(bash "$cgroup_tool" run "$g" --)
  fi
  "${prefix[@]}" taskset -c "$cpu" "$server" --model "$data_dir/fixtures/qwen3moe-tiny" --port 0 --grpc-port -1 \
    --max-sessions 2 --context-length 1024 --compute-cores "$cpu" --watch-model off \
    > "$work/instance$n.out" 2> "$work/instance$n.log" &
  pids+=($!)
  started_port=$(wait_for_port "$work/instance$n.out") || fail "instance $n did not start"
}
# (Not in $(...): the pids and groups must be recorded in this shell.)
start_instance 1 "$cpu1"
port1=$started_port
pid1=${pids[0]}
start_instance 2 "$cpu2"
port2=$started_port
if ((use_cgroups)); then
  echo "deploy_nginx: instances in cgroups with memory.max 512M, pinned to CPUs $cpu1 and $cpu2"
  grep -q "colibri/deploy-test-$$-1" "/proc/$pid1/cgroup" || fail "instance 1 is not in its cgroup"
else
  echo "deploy_nginx: cgroups are not writable here: instances pinned to CPUs $cpu1 and $cpu2 (taskset) without memory limits"
fi
[[ $(taskset -pc "$pid1" | sed 's/.*: //') == "$cpu1" ]] || fail "instance 1 is not pinned to CPU $cpu1"

# The shipped config, adapted: instance ports, TLS listener -> plain loopback port.
nport=$(free_port)
rport=$(free_port)
sed -e "s#server 127.0.0.1:8081 #server 127.0.0.1:$port1 #" \
    -e "s#server 127.0.0.1:8082 #server 127.0.0.1:$port2 #" \
    -e "s#listen 443 ssl http2;#listen 127.0.0.1:$nport;#" \
    -e "s#listen 80;#listen 127.0.0.1:$rport;#" \
    -e '/^ *ssl_/d' \
    "$src/deploy/nginx/colibri.conf" > "$work/colibri.conf"
grep -q "127.0.0.1:$port1 max_fails" "$work/colibri.conf" || fail "the sed adaptation no longer matches deploy/nginx/colibri.conf"
grep -q "listen 127.0.0.1:$nport;" "$work/colibri.conf" || fail "the sed adaptation no longer matches the TLS listener"
mkdir -p "$work/tmp"
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
error_log $work/nginx-error.log info;
pid $work/nginx.pid;
events { worker_connections 256; }
http {
    access_log $work/nginx-access.log;
    client_body_temp_path $work/tmp/body;
    proxy_temp_path $work/tmp/proxy;
    fastcgi_temp_path $work/tmp/fastcgi;
    uwsgi_temp_path $work/tmp/uwsgi;
    scgi_temp_path $work/tmp/scgi;
    include $work/colibri.conf;
}
CONF
"$nginx_bin" -t -p "$work" -c "$work/nginx.conf" > "$work/nginx-test.log" 2>&1 || fail "nginx -t rejects the adapted config"
"$nginx_bin" -p "$work" -c "$work/nginx.conf" -g 'daemon off;' > "$work/nginx-stdout.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$nport/health" && break; sleep 0.1; done

url=http://127.0.0.1:$nport
code() { curl -s -o "$work/body" -w '%{http_code}' "$@"; }
[[ $(code "$url/ready") == 200 ]] || fail "/ready through nginx"
[[ $(code "$url/v1/models") == 200 ]] || fail "/v1/models through nginx"
grep -q qwen3moe-tiny "$work/body" || fail "/v1/models body"
[[ $(code "$url/admin/config") == 404 ]] || fail "admin routes must not be reachable through nginx"
for i in 1 2 3 4; do
  [[ $(code "$url/v1/completions" -H 'Content-Type: application/json' -d "{\"prompt\": \"hello $i\", \"max_tokens\": 8}") == 200 ]] \
    || fail "completion $i through nginx: $(cat "$work/body")"
done

# Streaming: events must arrive as they are produced.
python3 - "$nport" <<'PY' || fail "streaming through nginx"
import http.client, json, sys, time
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
body = json.dumps({"prompt": "stream", "max_tokens": 800, "ignore_eos": True, "stream": True})
start = time.monotonic()
conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
response = conn.getresponse()
assert response.status == 200, response.status
assert response.getheader("X-Accel-Buffering") == "no"
first = None
events = 0
done = False
for raw in response:
    line = raw.decode().strip()
    if not line.startswith("data: "):
        continue
    if first is None:
        first = time.monotonic() - start
    if line == "data: [DONE]":
        done = True
        break
    events += 1
total = time.monotonic() - start
assert done, "no [DONE]"
assert events > 10, events
# Buffered, the first event would come with the last: here the 800 tokens
# take 50 ms or more after it. (first < total / 2 failed on a loaded machine:
# the first event came after 111 ms, the other 800 within 63 ms.)
assert total - first > 0.02, (first, total)
print(f"deploy_nginx: stream through nginx: {events} events, first after {first*1000:.0f} ms, all after {total*1000:.0f} ms")
PY

# One instance dies: nginx notices (connection refused), marks it failed and
# sends every request to the other.
kill -9 "$pid1"
wait "$pid1" 2>/dev/null || true
ok=0
for i in $(seq 1 8); do
  c=$(code "$url/v1/completions" -H 'Content-Type: application/json' -d "{\"prompt\": \"after $i\", \"max_tokens\": 4}")
  [[ $c == 200 ]] || fail "request $i after the kill got $c: $(cat "$work/body")"
  ok=$((ok + 1))
done
grep -q "connect() failed" "$work/nginx-error.log" || fail "nginx never tried the dead instance (no passive health check seen)"
echo "deploy_nginx: $ok/8 requests succeeded after instance 1 was killed"
