#!/usr/bin/env bash
# examples/c/generate.c must build, run, and print what colibri-run prints for
# the same prompt (both greedy); a bad model path must be a clean error.
set -euo pipefail
build_dir=$1
data_dir=$2
example=$build_dir/examples/colibri-example-generate
run=$build_dir/tools/colibri-run
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

model=$data_dir/fixtures/mixtral-tiny
prompt="The quick brown fox jumps over the lazy dog"
"$example" "$model" "$prompt" 24 >"$work/example.txt" 2>"$work/example.err" || {
  echo "FAIL: the example exited $?"; cat "$work/example.err"; exit 1; }
"$run" --model "$model" --prompt "$prompt" --max-tokens 24 --quiet >"$work/run.txt" 2>"$work/run.err"
if ! cmp -s "$work/example.txt" "$work/run.txt"; then
  echo "FAIL: the example's text differs from colibri-run's"
  echo "--- example"; od -c "$work/example.txt" | head; echo "--- colibri-run"; od -c "$work/run.txt" | head
  exit 1
fi
grep -q "^route: expert" "$work/example.err" || { echo "FAIL: no routing line"; cat "$work/example.err"; exit 1; }
grep -q "expected error: COLIBRI_ERR_NULL_POINTER" "$work/example.err" || { echo "FAIL: no error line"; exit 1; }

status=0
"$example" /nonexistent/model "hi" >"$work/bad.txt" 2>"$work/bad.err" || status=$?
if [[ $status -ne 1 ]] || ! grep -q "COLIBRI_ERR_LOAD" "$work/bad.err"; then
  echo "FAIL: a missing model should exit 1 with COLIBRI_ERR_LOAD (exit $status)"; cat "$work/bad.err"; exit 1
fi
echo "c example: same text as colibri-run ($(wc -c <"$work/example.txt") bytes)"
cat "$work/example.err"
