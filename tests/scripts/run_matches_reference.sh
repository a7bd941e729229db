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

# --json-object: whatever the model would say, what it prints is the start of a
# JSON object, and a generation that ends by itself is a whole one.
for seed in 1 2 3; do
  "$run" --model "$data_dir/fixtures/qwen3moe-tiny" --prompt "Reply in JSON:" --json-object --max-tokens 48 \
    --temperature 1 --seed "$seed" > "$work/json.txt" 2> "$work/err.txt" || { echo "FAIL --json-object: exit $?"; cat "$work/err.txt"; exit 1; }
  finish=$(sed -n 's/.*finish=\([a-z_]*\).*/\1/p' "$work/err.txt")
  python3 - "$work/json.txt" "$finish" <<'PY' || exit 1
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()[:-1]  # colibri-run ends with a newline
finish = sys.argv[2]
if not text.startswith("{"):
    sys.exit(f"FAIL --json-object: the text does not start with an object: {text!r}")
if finish == "json_complete":
    if not isinstance(json.loads(text), dict):
        sys.exit(f"FAIL --json-object: not an object: {text!r}")
elif finish != "length":
    sys.exit(f"FAIL --json-object: finish={finish}")
print(f"--json-object: finish={finish}, {len(text)} characters")
PY
done

# A max_tokens far past the context ends when the context is full; the
# history was reserved for max_tokens, 8 GB here, and under a 3 GB address
# space limit the run died of an uncaught std::bad_alloc.
( ulimit -v 3000000
  "$run" --model "$data_dir/fixtures/qwen3moe-tiny" --prompt "hi" --max-tokens 2000000000 --ignore-eos --context 256 \
    > /dev/null 2> "$work/err.txt" ) || { echo "FAIL --max-tokens 2000000000: exit $?"; cat "$work/err.txt"; exit 1; }
grep -q "generated" "$work/err.txt" || { echo "FAIL --max-tokens 2000000000: no summary"; cat "$work/err.txt"; exit 1; }
echo "--max-tokens 2000000000: $(tail -1 "$work/err.txt")"

# A prompt file that is not a readable regular file (a directory read as an
# empty prompt and the run went on), and a context the model does not have
# (it was cut to the model's silently), are refused with exit 2.
mkdir -p "$work/not-a-file"
for args in "--prompt-file $work/not-a-file" "--prompt hi --context 100000000"; do
  set +e
  # shellcheck disable=SC2086
  "$run" --model "$data_dir/fixtures/qwen3moe-tiny" $args --max-tokens 2 > /dev/null 2> "$work/err.txt"
  status=$?
  set -e
  [[ $status -eq 2 ]] || { echo "FAIL $args: exit $status, not 2"; cat "$work/err.txt"; exit 1; }
  echo "refused ($args): $(head -1 "$work/err.txt")"
done

# The expert-store flags: a bad value, or one given without a budget, is an
# error (they were accepted and did nothing).
for args in "--cache-policy bogus" "--pinned-experts x" "--expert-cache-mb -5" "--expert-cache-mb nan" "--pinned-experts 0:1" "--prefetch on"; do
  set +e
  # shellcheck disable=SC2086
  "$run" --model "$data_dir/fixtures/qwen3moe-tiny" --prompt hi $args --max-tokens 2 > /dev/null 2> "$work/err.txt"
  status=$?
  set -e
  [[ $status -ne 0 ]] || { echo "FAIL $args: accepted"; exit 1; }
  grep -Eq "cache-policy|pinned|expert-cache-mb|prefetch" "$work/err.txt" || { echo "FAIL $args: $(cat "$work/err.txt")"; exit 1; }
done

# An unwritable --logits-out is refused before the run, not after it.
set +e
"$run" --model "$data_dir/fixtures/qwen3moe-tiny" --prompt hi --max-tokens 2 --logits-out "$work/no/such/dir/x.json" \
  > "$work/out.txt" 2> "$work/err.txt"
status=$?
set -e
[[ $status -ne 0 && ! -s $work/out.txt ]] || { echo "FAIL --logits-out unwritable: exit $status, printed $(cat "$work/out.txt")"; exit 1; }

# --decode-activations (the server's decode_activations) sets the generated
# tokens' modes: on an int8 file the tensors of generated positions move with
# it, the prompt's (prefill modes either way) do not. A bad value is refused.
"$build_dir/tools/colibri-convert" --input "$data_dir/fixtures/olmoe-tiny" --output "$work/olmoe-int8.colibri" \
  --quant int8 > /dev/null 2>&1 || { echo "FAIL converting olmoe-tiny to int8"; exit 1; }
for mode in same int8-ffn; do
  "$run" --model "$work/olmoe-int8.colibri" --prompt "The" --max-tokens 3 --ignore-eos --quiet \
    --decode-activations "$mode" --dump-tensors "$work/tensors-$mode.jsonl" > /dev/null 2> "$work/err.txt" \
    || { echo "FAIL --decode-activations $mode: exit $?"; cat "$work/err.txt"; exit 1; }
done
python3 - "$work/tensors-same.jsonl" "$work/tensors-int8-ffn.jsonl" <<'PY' || exit 1
import json, sys
def load(path):
    return {(r["name"], r["layer"], r["pos"]): r["values"] for r in map(json.loads, open(path))}
same, ffn = load(sys.argv[1]), load(sys.argv[2])
prompt = {k for k in same if k[2] < 2}
generated = {k for k in same if k[2] >= 2}
moved_prompt = [k for k in prompt if same[k] != ffn[k]]
moved_generated = [k for k in generated if same[k] != ffn[k]]
if moved_prompt:
    sys.exit(f"FAIL --decode-activations moved prompt tensors: {moved_prompt[:3]}")
if ("ffn_out", 0, 2) not in moved_generated:
    sys.exit("FAIL --decode-activations int8-ffn left the generated tokens' FFN output unchanged")
print(f"--decode-activations: {len(moved_generated)} of {len(generated)} generated-position tensors moved")
PY
set +e
"$run" --model "$work/olmoe-int8.colibri" --prompt hi --max-tokens 2 --decode-activations bogus > /dev/null 2> "$work/err.txt"
status=$?
set -e
[[ $status -ne 0 ]] && grep -q "decode-activations" "$work/err.txt" || { echo "FAIL --decode-activations bogus: exit $status"; exit 1; }
