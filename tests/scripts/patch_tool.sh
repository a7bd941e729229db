#!/usr/bin/env bash
# colibri-patch end to end: a donor converted from a copy of the fixture whose
# expert (1, 3) holds expert (1, 5)'s values is patched into the fixture's own
# conversion, in place; the result equals converting that copy, verifies, and
# the tool reports the block size. Errors exit 1 with a clear message.
set -euo pipefail
build_dir=$1
data_dir=$2
convert=$build_dir/tools/colibri-convert
inspect=$build_dir/tools/colibri-inspect
patch=$build_dir/tools/colibri-patch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL patch_tool: $*" >&2; exit 1; }

fixture=$data_dir/fixtures/mixtral-tiny
mkdir "$work/donor"
cp "$fixture"/{config.json,tokenizer.json,tokenizer_config.json} "$work/donor/"
# Rewrite the safetensors file with expert 5's bytes under expert 3's names.
python3 - "$fixture/model.safetensors" "$work/donor/model.safetensors" <<'EOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
def blob(name):
    lo, hi = header[name]["data_offsets"]
    return data[lo:hi]
out_header, out_data = {}, b""
for name, entry in header.items():
    if name == "__metadata__":
        continue
    source = name
    if name.startswith("model.layers.1.block_sparse_moe.experts.3."):
        source = name.replace(".experts.3.", ".experts.5.")
    piece = blob(source)
    out_header[name] = {"dtype": entry["dtype"], "shape": entry["shape"],
                        "data_offsets": [len(out_data), len(out_data) + len(piece)]}
    out_data += piece
text = json.dumps(out_header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + out_data)
EOF
"$convert" -i "$fixture" -o "$work/a.colibri" --no-progress 2>/dev/null
"$convert" -i "$work/donor" -o "$work/d.colibri" --no-progress 2>/dev/null
"$convert" -i "$work/donor" -o "$work/d4.colibri" --quant int4 --no-progress 2>/dev/null
cmp -s "$work/a.colibri" "$work/d.colibri" && fail "the donor equals the target: the swap did nothing"

# In place (no --output): the target becomes the donor's conversion.
status=0
"$patch" --target "$work/a.colibri" --from "$work/d.colibri" --layer 1 --expert 3 > "$work/out.txt" 2>&1 || status=$?
[[ $status -eq 0 ]] || { cat "$work/out.txt"; fail "patch exited $status"; }
grep -qE "block [0-9]+ bytes, [1-9][0-9]* bytes changed" "$work/out.txt" || { cat "$work/out.txt"; fail "no report"; }
cmp "$work/a.colibri" "$work/d.colibri" || fail "the patched file differs from converting the patched source"
"$inspect" "$work/a.colibri" --verify > /dev/null || fail "the patched file does not verify"
ls "$work" | grep -q "\.tmp-" && fail "a temporary file was left behind"

expect_error() {  # expect_error PHRASE ARGS...
  local phrase=$1 status=0
  shift
  "$patch" "$@" > "$work/out.txt" 2>&1 || status=$?
  [[ $status -eq 1 ]] || { cat "$work/out.txt"; fail "'$*' exited $status, not 1"; }
  grep -qF -- "$phrase" "$work/out.txt" || { cat "$work/out.txt"; fail "'$*': no '$phrase'"; }
}
expect_error "differs in layout: q8" --target "$work/a.colibri" --from "$work/d4.colibri" --layer 1 --expert 3 -o "$work/x.colibri"
expect_error "has no block for layer 7 expert 3" --target "$work/a.colibri" --from "$work/d.colibri" --layer 7 --expert 3
expect_error "has no block for layer 0 expert 99" --target "$work/a.colibri" --from "$work/d.colibri" --layer 0 --expert 99
expect_error "nothing.colibri: cannot open" --target "$work/nothing.colibri" --from "$work/d.colibri" --layer 0 --expert 0
[[ -e $work/x.colibri ]] && fail "a refused patch wrote its output"
echo "patch_tool: OK"
