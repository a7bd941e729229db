#!/usr/bin/env bash
# With explicit huge pages reserved (vm.nr_hugepages), the thread team's
# scratch arenas and a copied model's weights get them, and say so
# (docs/BENCH.md, "Huge-page arenas"). Needs root and a writable
# /proc/sys/vm/nr_hugepages: elsewhere it is skipped (exit 77) and says why.
# The pool is raised by 16 pages (32 MiB) for the run and set back after.
set -euo pipefail
build_dir=$1
work=$(mktemp -d)
pool=/proc/sys/vm/nr_hugepages
before=$(cat "$pool")
cleanup() {
  echo "$before" > "$pool" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL hugetlb_pool: $*" >&2; exit 1; }
skip() { echo "SKIP hugetlb_pool: $*"; exit 77; }

[[ -w $pool ]] || skip "$pool is not writable here (needs root outside a read-only /proc/sys)"
wanted=$((before + 16))
echo "$wanted" > "$pool" 2> /dev/null || skip "cannot write $pool"
[[ $(cat "$pool") -ge $wanted ]] || skip "the kernel gave $(cat "$pool") of $wanted huge pages (memory fragmented)"

"$build_dir/tools/colibri-synth" olmoe-test-tiny --quant int8 --out "$work/tiny.colibri" > /dev/null 2>&1 ||
  fail "colibri-synth"
"$build_dir/tools/colibri-bench" --model "$work/tiny.colibri" --threads 2 --prompt-tokens 8 --gen-tokens 4 \
  --requests 1 --warmup 0 --weights copy --bandwidth-mib 64 --bandwidth-passes 1 --adjacent-bandwidth-passes 0 \
  --json > "$work/bench.json" 2> "$work/bench.err" || { cat "$work/bench.err"; fail "colibri-bench"; }
python3 - "$work/bench.json" <<'PY' || fail "huge pages were not used"
import json, sys
doc = json.load(open(sys.argv[1]))
arenas = doc["scratch_arenas"]
bad = [a for a in arenas if a["kind"] != "hugetlb" or a["huge_backed_bytes"] != a["capacity_bytes"]]
if len(arenas) != 2 or bad:
    print("scratch arenas:", json.dumps(arenas)); sys.exit(1)
if "hugetlb pages" not in doc["weights_memory"]:
    print("weights:", doc["weights_memory"]); sys.exit(1)
print("hugetlb_pool: ok (scratch arenas hugetlb, weights", doc["weights_memory"] + ")")
PY
