#!/usr/bin/env bash
# colibri-inspect end to end: a converted fixture verifies (exit 0) and its
# --json document describes it; after one byte inside expert block (layer 1,
# expert 3) is flipped, --verify exits 3 and names exactly that block; a file
# that does not parse exits 1 with the parser's message. A GGUF file gets a
# summary by tensor type and a verdict on whether colibri-convert can read it.
set -euo pipefail
build_dir=$1
data_dir=$2
convert=$build_dir/tools/colibri-convert
inspect=$build_dir/tools/colibri-inspect
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL inspect_verify: $*" >&2; exit 1; }

"$convert" --input "$data_dir/fixtures/mixtral-tiny" --output "$work/a.colibri" --quant int8 --no-progress 2>/dev/null

# A whole file: exit 0, every checksum OK.
"$inspect" "$work/a.colibri" --verify > "$work/out.txt" 2>&1 && status=0 || status=$?
[[ $status -eq 0 ]] || { cat "$work/out.txt"; fail "--verify on a whole file exited $status"; }
grep -q "Mixtral (model_type mixtral)" "$work/out.txt" || { cat "$work/out.txt"; fail "no architecture line"; }
grep -q "header OK; 65 tensors and 16 expert blocks OK" "$work/out.txt" || { cat "$work/out.txt"; fail "no checksum line"; }

# --json: one document with the expected counts; it gives the block's position.
"$inspect" "$work/a.colibri" --json > "$work/a.json"
offset=$(python3 - "$work/a.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["experts"]["count"] == 16, doc["experts"]["count"]
assert len(doc["expert_blocks"]) == 16
assert [l["count"] for l in doc["experts"]["per_layer"]] == [8, 8]
assert doc["hyperparameters"]["experts"] == 8 and doc["hyperparameters"]["top_k"] == 2
assert len(doc["tensors"]) == doc["tensor_count"] == 65
assert doc["architecture"]["model_type"] == "mixtral"
assert doc["quantization"]["recorded"]["scheme"] == "int8"
assert doc["checksums"]["header"] == "ok" and doc["checksums"]["verified"] is False
block = next(b for b in doc["expert_blocks"] if b["layer"] == 1 and b["expert"] == 3)
print(block["file_offset"] + 17)
EOF
) || fail "--json document is not as expected"

# Flip one byte inside block (1, 3).
python3 - "$work/a.colibri" "$offset" <<'EOF'
import sys
path, at = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(at)
    byte = f.read(1)[0]
    f.seek(at)
    f.write(bytes([byte ^ 0x5A]))
EOF
"$inspect" "$work/a.colibri" --verify > "$work/out.txt" 2>&1 && status=0 || status=$?
[[ $status -eq 3 ]] || { cat "$work/out.txt"; fail "--verify on a damaged block exited $status, not 3"; }
grep -q "checksum mismatch in layer 1 expert 3" "$work/out.txt" || { cat "$work/out.txt"; fail "layer 1 expert 3 not named"; }
others=$(grep -oE "layer [0-9]+ expert [0-9]+" "$work/out.txt" | sort -u | grep -vx "layer 1 expert 3" || true)
[[ -z $others ]] || { cat "$work/out.txt"; fail "blocks other than layer 1 expert 3 named: $others"; }

"$inspect" "$work/a.colibri" --verify --json > "$work/bad.json" 2>/dev/null && status=0 || status=$?
[[ $status -eq 3 ]] || fail "--verify --json on a damaged block exited $status, not 3"
python3 - "$work/bad.json" <<'EOF' || fail "--verify --json does not report the failure"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["checksums"]["ok"] is False
assert doc["checksums"]["failures"][0]["what"] == "layer 1 expert 3", doc["checksums"]["failures"]
EOF

# A file that does not parse: exit 1 with the parser's message (also as JSON).
head -c 1000 "$work/a.colibri" > "$work/short.colibri"
"$inspect" "$work/short.colibri" > "$work/out.txt" 2>&1 && status=0 || status=$?
[[ $status -eq 1 ]] || fail "a truncated file exited $status, not 1"
grep -q "truncated: the header says" "$work/out.txt" || { cat "$work/out.txt"; fail "no truncation message"; }
"$inspect" "$work/short.colibri" --json 2>/dev/null > "$work/short.json" && status=0 || status=$?
[[ $status -eq 1 ]] || fail "--json on a truncated file exited $status, not 1"
python3 -c 'import json,sys; assert "truncated" in json.load(open(sys.argv[1]))["error"]' "$work/short.json" ||
  fail "--json on a truncated file does not print an error document"
"$inspect" "$work/missing.colibri" > "$work/out.txt" 2>&1 && status=0 || status=$?
[[ $status -eq 1 ]] && grep -q "cannot open" "$work/out.txt" || fail "a missing file exited $status"
# A GGUF file: what it holds and whether colibri-convert can take it.
"$inspect" "$data_dir/fixtures/olmoe-tiny/model.gguf" > "$work/gguf.txt" 2>&1 && status=0 || status=$?
[[ $status -eq 0 ]] || { cat "$work/gguf.txt"; fail "a convertible GGUF exited $status"; }
grep -q "model          OLMoE, 2 layers, hidden 64, 16 experts top-8" "$work/gguf.txt" &&
  grep -Eq "F32 +27 tensors" "$work/gguf.txt" && grep -q "convertible    yes" "$work/gguf.txt" ||
  { cat "$work/gguf.txt"; fail "GGUF summary"; }
# One IQ2_XXS tensor (256 values in 66 bytes) and no model metadata: exit 1, both reasons named.
python3 - "$work/iq2.gguf" <<'PY'
import struct, sys
def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b
kv = s("general.architecture") + struct.pack("<I", 8) + s("olmoe")
info = s("blk.0.ffn_down_exps.weight") + struct.pack("<IQIQ", 1, 256, 16, 0)
head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv + info
head += b"\0" * (-len(head) % 32)
open(sys.argv[1], "wb").write(head + bytes(66))
PY
"$inspect" "$work/iq2.gguf" > "$work/iq2.txt" 2>&1 && status=0 || status=$?
[[ $status -eq 1 ]] || { cat "$work/iq2.txt"; fail "an unconvertible GGUF exited $status, not 1"; }
grep -Eq "IQ2_XXS +1 tensors, .*\(not readable\)" "$work/iq2.txt" &&
  grep -q "convertible    no: cannot read IQ2_XXS (first: blk.0.ffn_down_exps.weight); " "$work/iq2.txt" ||
  { cat "$work/iq2.txt"; fail "unconvertible GGUF summary"; }
"$inspect" "$work/iq2.gguf" --json > "$work/iq2.json" 2>/dev/null || true
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["convertible"] is False and d["unreadable_types"] == ["IQ2_XXS"] and d["model_error"], d' "$work/iq2.json" ||
  fail "--json on an unconvertible GGUF"

# A path that is not UTF-8 (any byte but '/' and NUL is allowed): --json still
# prints one document, the byte replaced, and exits 1. The JSON writer threw on
# it and the tool aborted.
bad=$work/$'bad\xff.colibri'
printf 'not a model at all' > "$bad"
"$inspect" "$bad" --json > "$work/bad.json" 2>/dev/null && status=0 || status=$?
[[ $status -eq 1 ]] || fail "--json on a non-UTF-8 path exited $status, not 1"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "bad" in d["file"] and "not a .colibri file" in d["error"], d' "$work/bad.json" ||
  fail "--json on a non-UTF-8 path"

echo "inspect_verify: OK"
