#!/usr/bin/env bash
# colibri-run on every fixture prompt: its --logits-out output must pass
# compare_logits.py against the fixture's reference.json.
set -euo pipefail
build_dir=$1
data_dir=$2
here=$(cd "$(dirname "$0")" && pwd)
run=$build_dir/tools/colibri-run
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for fixture in mixtral-tiny qwen2moe-tiny qwen3moe-tiny olmoe-tiny; do
  dir=$data_dir/fixtures/$fixture
  count=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["prompts"]))' "$dir/reference.json")
  for ((i = 0; i < count; i++)); do
    python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["prompt"])' \
      "$dir/reference.json" "$i" > "$work/prompt.txt"
    id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["prompt_id"])' "$dir/reference.json" "$i")
    "$run" --model "$dir" --prompt-file "$work/prompt.txt" --max-tokens 32 --ignore-eos --quiet \
      --logits-out "$work/out.json" > "$work/text.txt" 2>"$work/err.txt" && status=0 || status=$?
    if [[ $status -ne 0 ]]; then
      echo "FAIL $fixture $id: colibri-run exited $status"; cat "$work/err.txt"; exit 1
    fi
    if [[ ! -s $work/text.txt ]]; then echo "FAIL $fixture $id: no text printed"; exit 1; fi
    echo -n "$fixture "
    python3 "$here/../tools/compare_logits.py" "$work/out.json" "$dir/reference.json" --prompt-id "$id"
  done
done
