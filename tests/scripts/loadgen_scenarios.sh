#!/usr/bin/env bash
# colibri-loadgen's scenarios (docs/SERVER.md, "Load generator") against
# colibri-server on the qwen3moe-tiny fixture, each a few seconds:
#   1. a closed-loop concurrency sweep with mixed prompt and output lengths,
#      more clients than sessions (requests queue);
#   2. open-loop Poisson arrivals where 60 % of the clients hang up, some while
#      their 900-token prompt is processed, some mid-stream;
#   3. 40 slowloris connections against a server with 4 HTTP threads and a
#      1 s read_timeout_s: every request still succeeds, each connection is
#      closed with a 408 and reopened, and the descriptors come back;
# after each, --check-idle: no session, nothing queued, descriptors back.
# Then the check itself must fail against a stub server whose /metrics still
# shows a busy session, or it could pass without looking; and the same stub
# answers what the fixture cannot be made to: an error inside the stream, a
# reset, a stall past --duration, tokens arriving together, a bad /v1/models.
set -euo pipefail
source "$(dirname "$0")/lib/server_port.sh"
build_dir=$(cd "$1" && pwd)
data_dir=$2
server=$build_dir/server/colibri-server
loadgen=$build_dir/server/colibri-loadgen

source "$(dirname "$0")/lib/background_processes.sh"
fail() {
  echo "FAIL loadgen_scenarios: $*" >&2
  [[ -f $work/server.log ]] && tail -20 "$work/server.log" >&2
  exit 1
}

# A queue that holds the open loop's 40 requests: on a loaded machine (CI
# runs the fuzzers beside this) the server falls behind 25/s, and the default
# 16 answered some with 429, which this scenario counted as failures; it
# tests hang-ups, not admission (AdmissionTest does).
"$server" --model "$data_dir/fixtures/qwen3moe-tiny" --port 0 --grpc-port -1 --max-sessions 2 \
  --max-queue 64 --context-length 1024 --watch-model off > "$work/server.out" 2> "$work/server.log" &
pids+=($!)
port=$(wait_for_port "$work/server.out") || fail "the server did not start"
url=http://127.0.0.1:$port

# 1. Sweep: 1 and 4 clients on 2 sessions, lengths 4-300 in and 2-40 out.
"$loadgen" --url "$url" --sweep 1,4 --requests 12 --baseline-requests 1 --prompt-tokens 4 \
  --prompt-tokens-max 300 --max-tokens 2 --max-tokens-max 40 --duration 120 --check-idle \
  > "$work/sweep.json" 2> "$work/sweep.err" || fail "sweep: $(cat "$work/sweep.err")"
python3 - "$work/sweep.json" << 'EOF' || fail "sweep report"
import json, sys
d = json.load(open(sys.argv[1]))
points = d["points"]
assert [p["point"] for p in points] == ["clients 1", "clients 4"], points
for p in points:
    load = p["load"]
    assert load["requests_ok"] == 12 and load["requests_failed"] == 0, load
    # Mixed lengths: 12 prompts of 4-300 tokens are not all the minimum.
    assert 12 * 4 < load["prompt_tokens"] <= 12 * 300, load
    assert 12 * 2 <= load["generated_tokens"] <= 12 * 40 and load["generated_tokens"] > 24, load
    assert 0 < load["ttft_p50_s"] <= load["ttft_p90_s"] <= load["ttft_p99_s"] <= load["ttft_max_s"], load
    assert load["e2e_p50_s"] >= load["ttft_p50_s"], load
    assert 0 <= load["goodput_fraction"] <= 1, load
# The server's side of each point, read from its /metrics before and after.
for p in d["rounds"][0]["points"]:
    load = p["load"]
    assert load["server_cpu_cores_busy"] > 0, load
    assert load["server_generated_tokens"] == load["generated_tokens"], load
assert d["server"]["idle"] is True, d["server"]
assert d["server"]["before"]["process_open_fds"] > 0, d["server"]
EOF

# 2. Open loop at 25 requests/s, 60 % hanging up.
"$loadgen" --url "$url" --rates 25 --requests 40 --baseline-requests 0 --prompt-tokens 900 \
  --max-tokens 24 --disconnect-fraction 0.6 --disconnect-wait-ms 15 --sample-seconds 0.5 \
  --duration 120 --check-idle > "$work/open.json" 2> "$work/open.err" || fail "open loop: $(cat "$work/open.err")"
python3 - "$work/open.json" << 'EOF' || fail "open-loop report"
import json, sys
d = json.load(open(sys.argv[1]))
load = d["points"][0]["load"]
assert d["points"][0]["rate_per_s"] == 25, d["points"][0]
# The one point's own load, not the unused --clients default.
assert d["concurrent"]["rate_per_s"] == 25 and "clients" not in d["concurrent"], d["concurrent"]
assert load["requests_ok"] + load["requests_hung_up"] == 40, load
assert load["requests_failed"] == 0, load
assert 10 <= load["requests_hung_up"] <= 35, load  # 60 % of 40, give or take the draw
# Waits of 1-15 ms against a prefill of about 10-20 ms here: some leave before any token.
assert load["requests_hung_up_before_first_token"] >= 1, load
assert load["requests_ok"] > 0 and load["generated_tokens"] == 24 * load["requests_ok"], load
assert d["server"]["idle"] is True, d["server"]
assert len(d["samples"]) >= 2 and "process_resident_memory_bytes" in d["samples"][0], d.get("samples")
EOF
grep -q "finish=cancelled stream=true" "$work/server.log" || fail "no hung-up request was logged as cancelled"

# 3. Slowloris: 40 connections trickling header bytes hold none of the 4 HTTP
# threads (else the requests below would wait for them and time out); the
# 2.5 s lead lets the server close each one with its 408 at least once. The
# API key file ends in CRLF, which both sides must drop.
printf 'sekrit\r\n' > "$work/key"
"$server" --model "$data_dir/fixtures/qwen3moe-tiny" --port 0 --grpc-port -1 --http-threads 4 \
  --read-timeout-s 1 --watch-model off --api-key-file "$work/key" > "$work/slow.out" 2> "$work/slow.log" &
pids+=($!)
slow_port=$(wait_for_port "$work/slow.out") || fail "the slowloris server did not start"
"$loadgen" --url "http://127.0.0.1:$slow_port" --api-key-file "$work/key" --clients 2 --requests 6 \
  --baseline-requests 1 --max-tokens 16 --slowloris 40 --slowloris-interval-ms 200 --slowloris-lead-ms 2500 \
  --duration 120 --check-idle \
  > "$work/slow.json" 2> "$work/slow.err" || fail "slowloris: $(cat "$work/slow.err")"
python3 - "$work/slow.json" << 'EOF' || fail "slowloris report"
import json, sys
d = json.load(open(sys.argv[1]))
under = d["slowloris"]
assert under["connections"] == 40 and under["interval_ms"] == 200, under
assert under["single_stream"]["requests_ok"] == 1 and under["single_stream"]["requests_failed"] == 0, under
load = under["points"][0]["load"]
assert load["requests_ok"] == 6 and load["requests_failed"] == 0, load
attack = d["rounds"][0]["slowloris"]["attack"]
assert attack["connect_failures"] == 0, attack
# Each closed with its 408 readable: the server drops the unread header bytes
# before closing, so the close is a FIN, not a reset that can discard the
# answer (5-10 % of them were lost before). Two spare for a byte sent in the
# instant between the drop and the close.
assert attack["closed_by_server"] >= 40, attack
assert attack["answered_408"] >= attack["closed_by_server"] - 2, attack
assert attack["opened"] >= 80, attack  # each reopened at least once
# The server let each live about read_timeout_s (1 s) from its first byte.
assert 0.8 <= attack["server_closed_after_s"]["p50"] <= 2.5, attack
ratios = under["ratio_to_plain_median_of_rounds"]
# Each figure over the same figure without the attack (ITL ratios are left out
# where the fixture's tokens arrive too close together to time).
assert ratios["clients 2 tokens_per_s"] > 0 and ratios["clients 2 ttft_p99"] > 0, ratios
assert d["server"]["idle"] is True, d["server"]
EOF

# 4. --check-idle against a server that stays busy: it must say so and exit 1.
# Its streams depend on max_tokens: 2 ends in an error event (then [DONE],
# status 200, as colibri-server reports a failure after the headers), 3 sends
# its 2nd and 3rd tokens in one event 0.4 s after the 1st, 4 breaks off after
# the headers, 5 stalls for 3 s; any other gives one token. Its /v1/models
# depends on the API key.
python3 - "$work/stub.port" << 'EOF' > "$work/stub.log" 2>&1 &
import http.server, json, sys, time
def event(value):
    return ("data: " + (value if isinstance(value, str) else json.dumps(value)) + "\n\n").encode()
def tokens(ids, finish=None):
    return event({"choices": [{"text": "x", "token_ids": ids, "finish_reason": finish}]})
class Stub(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def send(self, body, kind="application/json", length=None):
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
    def do_GET(self):
        if self.path == "/v1/models":
            key = self.headers.get("Authorization", "")
            if key == "Bearer models-empty":
                self.send(json.dumps({"object": "list", "data": []}))
            elif key == "Bearer models-text":
                self.send("<html>not here</html>", "text/html")
            else:
                self.send(json.dumps({"data": [{"id": "stub", "vocab": 100}]}))
        else:
            self.send("# TYPE colibri_active_sessions gauge\ncolibri_active_sessions 1\n"
                      "# TYPE colibri_queue_depth gauge\ncolibri_queue_depth 0\n", "text/plain")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n, done = body["max_tokens"], tokens([], "length") + event("[DONE]")
        if n == 2:
            error = {"error": {"message": "decoding failed: stub", "type": "server_error"}}
            self.send(tokens([7]) + event(error) + event("[DONE]"), "text/event-stream")
        elif n == 4:
            self.send(b"data: ", "text/event-stream", length=100000)
        elif n in (3, 5):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(tokens([7]))
            self.wfile.flush()
            time.sleep(0.4 if n == 3 else 3)
            self.wfile.write(tokens([8, 9]) + (tokens([10]) if n == 5 else b"") + done)
        else:
            self.send(tokens([7]) + done, "text/event-stream")
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
server.daemon_threads = True
open(sys.argv[1], "w").write(str(server.server_address[1]))
server.serve_forever()
EOF
pids+=($!)
for _ in $(seq 50); do [[ -s $work/stub.port ]] && break; sleep 0.1; done
[[ -s $work/stub.port ]] || fail "the stub server did not start: $(cat "$work/stub.log")"
stub=http://127.0.0.1:$(cat "$work/stub.port")
if "$loadgen" --url "$stub" --clients 1 --requests 1 --baseline-requests 0 \
  --max-tokens 1 --duration 30 --check-idle --idle-wait 1 > "$work/stub.json" 2> "$work/stub.err"; then
  fail "--check-idle passed while /metrics showed an active session"
fi
grep -q "colibri_active_sessions is 1" "$work/stub.err" || fail "--check-idle did not name the busy session: $(cat "$work/stub.err")"

# 5. The stub's failures. `stub_run NAME FLAGS...` leaves NAME.json, NAME.err, NAME.rc.
stub_run() {
  local name=$1
  shift
  local rc=0
  "$loadgen" --url "$stub" --clients 1 --baseline-requests 0 --idle-wait 0 "$@" \
    > "$work/$name.json" 2> "$work/$name.err" || rc=$?
  echo "$rc" > "$work/$name.rc"
}
stub_run error --requests 1 --max-tokens 2 --duration 30  # an error event after a token, then [DONE]
stub_run short --requests 1 --max-tokens 6 --duration 30  # [DONE] after 1 of 6 tokens
stub_run reset --requests 4 --max-tokens 4 --disconnect-fraction 1 --disconnect-wait-ms 5000 --duration 30
stub_run itl --requests 1 --max-tokens 3 --duration 30
stub_run cut --requests 1 --max-tokens 5 --duration 1
python3 - "$work" << 'EOF' || fail "stub runs: $(cat "$work"/{error,short,reset,itl,cut}.err)"
import json, sys
def run(name):
    rc = int(open(f"{sys.argv[1]}/{name}.rc").read())
    return rc, json.load(open(f"{sys.argv[1]}/{name}.json"))["concurrent"], open(f"{sys.argv[1]}/{name}.err").read()
rc, load, err = run("error")
assert rc == 1 and load["requests_ok"] == 0 and load["errors"] == {"stream error: decoding failed: stub": 1}, load
# No ok request, no latency: null, not a perfect 0.
assert load["ttft_p99_s"] is None and load["itl_p99_s"] is None and load["goodput_fraction"] is None, load
assert "TTFT P50 n/a" in err, err
rc, load, _ = run("short")
assert rc == 1 and load["requests_failed"] == 1 and load["generated_tokens"] == 0, load
# Every request planned to hang up, but the server broke off first: failures.
rc, load, _ = run("reset")
assert rc == 1 and load["requests_failed"] == 4 and load["requests_hung_up"] == 0, load
# One gap per event: the 0.4 s wait is not split over the two tokens it delivered.
rc, load, _ = run("itl")
assert rc == 0 and load["requests_ok"] == 1 and load["generated_tokens"] == 3, load
assert 0.3 <= load["itl_max_s"] < 2 and load["itl_p50_s"] == load["itl_max_s"], load
# Still streaming at --duration: cut, neither ok nor failed.
rc, load, _ = run("cut")
assert rc == 0 and load["requests_cut_by_deadline"] == 1 and load["requests_failed"] == 0, load
EOF

# 6. What it is given must make sense: exit 2 naming the problem.
for case in "models-empty:lists no model" "models-text:is not JSON" "missing:cannot read --api-key-file"; do
  key=${case%%:*} message=${case#*:}
  [[ $key == missing ]] || echo "$key" > "$work/$key.key"
  rc=0
  "$loadgen" --url "$stub" --api-key-file "$work/$key.key" --clients 1 --requests 1 --baseline-requests 0 \
    --max-tokens 1 --idle-wait 0 --duration 30 > /dev/null 2> "$work/$key.err" || rc=$?
  [[ $rc == 2 ]] && grep -q "$message" "$work/$key.err" || fail "$key: exit $rc, $(cat "$work/$key.err")"
done
echo "loadgen_scenarios: ok"
