#!/usr/bin/env bash
# RELIABILITY.md 1F, row 77: a Hugging Face checkpoint served directly is
# converted to f32 in the process's memory. One that cannot fit is refused by
# arithmetic, before any allocation, with the sizes and the way out (convert it
# offline), instead of being half-filled and OOM-killed: colibri-run exits 1,
# and colibri-server refuses to start. The checkpoint here is the Qwen3-MoE
# fixture with hidden 2^20 and vocabulary 65536 (about 140 G weights, 550 GB as
# f32), written as a sparse file: only its header and a few bytes are real, and
# nothing reads the rest. The same for a .colibri file copied into memory, and
# for a small checkpoint whose KV caches would not fit beside it.
set -euo pipefail
build_dir=$1
data_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL convert_at_load_memory: $*" >&2; exit 1; }

fixture=$data_dir/fixtures/qwen3moe-tiny
big=$work/huge
mkdir "$big"
cp "$fixture/tokenizer.json" "$fixture/tokenizer_config.json" "$big/"
python3 - "$fixture" "$big" <<'PY'
import json, struct, sys
fixture, out = sys.argv[1], sys.argv[2]
HIDDEN, VOCAB = 1 << 20, 65536
config = json.load(open(f"{fixture}/config.json"))
config.update(hidden_size=HIDDEN, vocab_size=VOCAB)
json.dump(config, open(f"{out}/config.json", "w"))
raw = open(f"{fixture}/model.safetensors", "rb").read()
header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
header.pop("__metadata__", None)
def reshaped(name, shape):
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return shape
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return [VOCAB, HIDDEN]
    if len(shape) == 1:
        return [HIDDEN]
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return [HIDDEN, shape[1]]
    return [shape[0], HIDDEN]
offset, entries = 0, {}
for name in sorted(header):
    shape = reshaped(name, header[name]["shape"])
    size = 2
    for d in shape:
        size *= d
    entries[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
    offset += size
text = json.dumps(entries).encode()
text += b" " * (-len(text) % 8)
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    f.truncate(8 + len(text) + offset)  # a hole: no disk blocks behind it
print(f"{offset / 2**30:.0f} GiB of BF16 declared", file=sys.stderr)
PY

set +e
"$build_dir/tools/colibri-run" --model "$big" --prompt "x" --max-tokens 1 > "$work/run.out" 2> "$work/run.err"
status=$?
set -e
[[ $status -ne 0 ]] || fail "colibri-run loaded a checkpoint larger than memory"
grep -q "not enough memory to convert this checkpoint at load" "$work/run.err" ||
  fail "colibri-run's error does not say why: $(head -c 400 "$work/run.err")"
grep -q "colibri-convert" "$work/run.err" || fail "the error does not give the way out: $(head -c 400 "$work/run.err")"

set +e
timeout 60 "$build_dir/server/colibri-server" --model "$big" --port 0 --grpc-port -1 > "$work/server.out" 2> "$work/server.err"
status=$?
set -e
[[ $status -eq 1 ]] || fail "colibri-server exited $status, not 1: $(tail -c 400 "$work/server.err")"
grep -q "not enough memory to convert this checkpoint at load" "$work/server.err" ||
  fail "colibri-server's error does not say why: $(tail -c 400 "$work/server.err")"
# A checkpoint whose weights fit but whose KV caches (max_sessions x
# context_length, about 1 TB here) do not is refused before the conversion,
# not after it: the message says nothing was converted.
set +e
timeout 60 "$build_dir/server/colibri-server" --model "$fixture" --port 0 --grpc-port -1 --max-sessions 1024 \
  --context-length 1048576 > "$work/kv.out" 2> "$work/kv.err"
status=$?
set -e
[[ $status -eq 1 ]] || fail "colibri-server with 1 TB of KV caches exited $status, not 1: $(tail -c 400 "$work/kv.err")"
grep -q "nothing was converted" "$work/kv.err" ||
  fail "the KV caches were not checked before the conversion: $(tail -c 400 "$work/kv.err")"
grep -q "lower max_sessions or context_length" <(tr 'A-Z' 'a-z' < "$work/kv.err") ||
  fail "the error does not give the way out: $(tail -c 400 "$work/kv.err")"
# The same for a .colibri file copied into memory (--weights copy,
# model_memory copy): a file as large as the machine's RAM (sparse here) is
# refused before the copy is allocated. The address-space limit turns a
# missing check into a failed allocation instead of an OOM kill of the test.
total_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
truncate -s "${total_kib}K" "$work/ram-sized.colibri"
set +e
(ulimit -v $((total_kib / 2)); exec "$build_dir/tools/colibri-run" --model "$work/ram-sized.colibri" --weights copy \
  --prompt x --max-tokens 1) > "$work/copy.out" 2> "$work/copy.err"
status=$?
set -e
[[ $status -ne 0 ]] || fail "colibri-run copied a file as large as the RAM"
grep -q "not enough memory to copy the weights into memory" "$work/copy.err" ||
  fail "the copy's refusal does not say why: $(head -c 400 "$work/copy.err")"
grep -q "map it instead" "$work/copy.err" || fail "the copy's refusal does not give the way out"

echo "convert_at_load_memory: ok ($(grep -o 'weights need [0-9]* MiB as f32, [0-9]* MiB are available' "$work/run.err"))"
