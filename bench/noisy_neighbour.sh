#!/usr/bin/env bash
# Noisy neighbour (RELIABILITY.md row 88): two colibri-server instances on one
# box, each on its own core, as docs/DEPLOY.md sets them up with AllowedCPUs.
# Instance B is measured with colibri-loadgen while A is idle, then while A is
# saturated by 16 streaming clients with long prompts; rounds alternate the
# two so both halves of a pair fall in the same phase of a shared host.
#
#   bench/noisy_neighbour.sh MODEL [ROUNDS] [BUILD_DIR]
#
# Both instances map the model (model_memory map), so they share one copy in
# the page cache, as instances of one model on an edge box would. Cores:
# A on COLIBRI_CORE_A (0), B on COLIBRI_CORE_B (1); ports 18280-18281.
# Prints each round's B figures, quiet and noisy, and the noisy/quiet ratios;
# the whole report goes to noisy_neighbour.json (or $COLIBRI_OUT).
set -euo pipefail
model=${1:?usage: bench/noisy_neighbour.sh MODEL [ROUNDS] [BUILD_DIR]}
rounds=${2:-3}
build_dir=${3:-$(dirname "$0")/../build}
server=$build_dir/server/colibri-server
loadgen=$build_dir/server/colibri-loadgen
core_a=${COLIBRI_CORE_A:-0}
core_b=${COLIBRI_CORE_B:-1}
out=${COLIBRI_OUT:-noisy_neighbour.json}
source "$(dirname "$0")/../tests/scripts/lib/background_processes.sh"

start_instance() {  # NAME CORE PORT
  taskset -c "$2" "$server" --model "$model" --model-memory map --compute-threads 1 --compute-cores "$2" \
    --max-sessions 16 --context-length 512 --port "$3" --grpc-port -1 --watch-model off \
    > "$work/$1.out" 2> "$work/$1.log" &
  pids+=($!)
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$3/ready" > /dev/null && return 0
    sleep 0.5
  done
  echo "noisy_neighbour: instance $1 did not become ready:" >&2
  tail -5 "$work/$1.log" >&2
  exit 1
}
start_instance a "$core_a" 18280
start_instance b "$core_b" 18281

measure_b() {  # TAG ROUND
  "$loadgen" --url http://127.0.0.1:18281 --clients 4 --requests 8 --prompt-tokens 32 --max-tokens 64 \
    --baseline-requests 2 --seed "$2" --duration 600 > "$work/b-$1-$2.json" 2> /dev/null
}

# Warm-up, untimed: a mapped model's pages are faulted into each process on
# first use, which made a first quiet round 2.5x slower than the next ones.
for port in 18280 18281; do
  "$loadgen" --url "http://127.0.0.1:$port" --clients 4 --requests 8 --prompt-tokens 64 --max-tokens 32 \
    --baseline-requests 0 --duration 600 > /dev/null 2>&1 || true
done

for round in $(seq "$rounds"); do
  measure_b quiet "$round"
  # A saturated: 16 clients with 256-token prompts, more requests than the
  # measurement lasts; stopped once B's measurement ends.
  "$loadgen" --url http://127.0.0.1:18280 --clients 16 --requests 100000 --prompt-tokens 256 --max-tokens 64 \
    --baseline-requests 0 --duration 3600 > /dev/null 2>&1 &
  noise=$!
  sleep 5  # A's sessions fill and its prompts start
  measure_b noisy "$round"
  kill "$noise" 2> /dev/null || true
  wait "$noise" 2> /dev/null || true
  sleep 2
done

python3 - "$work" "$rounds" "$out" << 'EOF'
import json, statistics, sys
work, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
keys = [("single_stream", "tokens_per_s"), ("single_stream", "ttft_p99_s"), ("single_stream", "itl_p50_s"),
        ("single_stream", "itl_p99_s"), ("concurrent", "tokens_per_s"), ("concurrent", "ttft_p99_s"),
        ("concurrent", "itl_p50_s"), ("concurrent", "itl_p99_s")]
report = {"rounds": []}
ratios = {f"{a}.{b}": [] for a, b in keys}
for r in range(1, rounds + 1):
    quiet = json.load(open(f"{work}/b-quiet-{r}.json"))
    noisy = json.load(open(f"{work}/b-noisy-{r}.json"))
    row = {}
    for a, b in keys:
        q, n = quiet[a][b], noisy[a][b]
        row[f"{a}.{b}"] = {"quiet": q, "noisy": n, "ratio": n / q if q else None}
        if q:
            ratios[f"{a}.{b}"].append(n / q)
    report["rounds"].append(row)
    print(f"round {r}: B single stream {quiet['single_stream']['tokens_per_s']:.1f} -> "
          f"{noisy['single_stream']['tokens_per_s']:.1f} tok/s, ITL P99 {quiet['single_stream']['itl_p99_s']:.3f} -> "
          f"{noisy['single_stream']['itl_p99_s']:.3f} s; 4 clients TTFT P99 {quiet['concurrent']['ttft_p99_s']:.2f} -> "
          f"{noisy['concurrent']['ttft_p99_s']:.2f} s, ITL P99 {quiet['concurrent']['itl_p99_s']:.3f} -> "
          f"{noisy['concurrent']['itl_p99_s']:.3f} s")
report["ratio_noisy_to_quiet_median"] = {k: statistics.median(v) for k, v in ratios.items() if v}
for k, v in report["ratio_noisy_to_quiet_median"].items():
    print(f"  {k:28s} noisy/quiet median {v:.3f}")
json.dump(report, open(out, "w"), indent=2)
EOF
