#!/usr/bin/env bash
# colibri-store-bench end to end on a tiny converted fixture: every section
# runs and prints its figures, each I/O mode reports the mode in effect, and
# the decode-shaped run reads experts. --fadvise-only keeps it from emptying
# the machine's page cache.
set -euo pipefail
build_dir=$1
data_dir=$2
convert=$build_dir/tools/colibri-convert
bench=$build_dir/tools/colibri-store-bench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL store_bench_smoke: $*" >&2; exit 1; }

"$convert" --input "$data_dir/fixtures/mixtral-tiny" --output "$work/m.colibri" --quant int8 --no-progress 2>/dev/null
"$bench" "$work/m.colibri" --runs 1 --tokens 4 --fadvise-only > "$work/out.txt" 2>&1 || { cat "$work/out.txt"; fail "exit $?"; }
grep -q "16 expert blocks" "$work/out.txt" || { cat "$work/out.txt"; fail "no block count"; }
for mode in "pread " "pread-direct " "mmap "; do
  grep -qE "^$mode +[a-z-]+ +[0-9.]+ +[0-9.]+" "$work/out.txt" || { cat "$work/out.txt"; fail "no row for $mode"; }
done
grep -qE "budget \(slot hit\) +[0-9.]+ ns" "$work/out.txt" || { cat "$work/out.txt"; fail "no hit cost"; }
# No prefetch: a cold store over 16 blocks with 8 slots must miss and read.
awk '$1 == "off" && $2 > 0 && $5 > 0 && $6 == "0/0" { found = 1 } END { exit !found }' "$work/out.txt" ||
  { cat "$work/out.txt"; fail "no decode row with bytes read"; }
grep -qE "^cur\+next x2 " "$work/out.txt" || { cat "$work/out.txt"; fail "no prefetch row"; }
echo "store_bench_smoke: ok"
