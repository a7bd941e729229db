#!/usr/bin/env bash
# RELIABILITY.md 1B, row 29: a conversion that cannot finish writing (here the
# file-size limit, as a full disk would) exits non-zero with the system's
# reason, leaves an existing output file exactly as it was, and leaves no
# temporary file behind. The same conversion without the limit succeeds.
set -euo pipefail
build_dir=$1
data_dir=$2
convert=$build_dir/tools/colibri-convert
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL convert_write_failure: $*" >&2; exit 1; }

fixture=$data_dir/fixtures/mixtral-tiny
target=$work/model.colibri
"$convert" --input "$fixture" --output "$target" --quant f32 --no-progress > /dev/null 2>&1 || fail "first conversion"
before=$(sha256sum "$target" | cut -d' ' -f1)
size=$(stat -c %s "$target")

# int8 is smaller than f32 but still far above a 64 KiB limit. SIGXFSZ is
# ignored so the write fails with EFBIG instead of killing the process.
set +e
(trap '' XFSZ; ulimit -f 64; exec "$convert" --input "$fixture" --output "$target" --quant int8 --no-progress) \
  > "$work/out" 2> "$work/err"
status=$?
set -e
[[ $status -ne 0 ]] || fail "the conversion reported success past the file-size limit"
grep -qi "file too large" "$work/err" || fail "the error does not give the reason: $(cat "$work/err")"
[[ $(sha256sum "$target" | cut -d' ' -f1) == "$before" && $(stat -c %s "$target") == "$size" ]] ||
  fail "the existing output was changed by a failed conversion"
leftover=$(find "$work" -name 'model.colibri.tmp-*' | head -1)
[[ -z $leftover ]] || fail "a temporary file was left behind: $leftover"

"$convert" --input "$fixture" --output "$target" --quant int8 --no-progress > /dev/null 2>&1 || fail "the retry failed"
[[ $(sha256sum "$target" | cut -d' ' -f1) != "$before" ]] || fail "the retry did not replace the file"

# RELIABILITY.md 1B, row 30: an output that names the input (a GGUF file, or a
# file of a Hugging Face directory, however spelt) is refused, the input untouched.
cp "$data_dir/fixtures/olmoe-tiny/model.gguf" "$work/in.gguf"
cp -r "$fixture" "$work/hf"
for pair in "$work/in.gguf:$work/in.gguf" "$work/in.gguf:$work/./in.gguf" "$work/hf:$work/hf/model.safetensors"; do
  in=${pair%%:*} out=${pair#*:}
  sum=$(sha256sum "$out" | cut -d' ' -f1)
  set +e
  "$convert" --input "$in" --output "$out" --quant int8 --no-progress > /dev/null 2> "$work/err2"
  status=$?
  set -e
  [[ $status -eq 2 ]] || fail "converting $in onto $out exited $status, not 2"
  grep -q "which the conversion would replace" "$work/err2" || fail "no reason given: $(cat "$work/err2")"
  [[ $(sha256sum "$out" | cut -d' ' -f1) == "$sum" ]] || fail "$out was changed"
done
echo "convert_write_failure: ok ($(head -c 200 "$work/err"))"
