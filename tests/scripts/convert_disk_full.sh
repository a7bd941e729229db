#!/usr/bin/env bash
# RELIABILITY.md 1H, row 76: a conversion onto a disk that fills up (a real
# ENOSPC: a 512 KiB tmpfs, smaller than the 1 MB model) exits non-zero naming
# the file and the system's reason, leaves no temporary file taking the space,
# and keeps an existing output as it was. The converter writes with write(),
# not into a mapping, so a full disk is an error, not a SIGBUS. Mounting needs
# root; elsewhere the test is skipped (77). convert_write_failure.sh covers the
# same path with a file-size limit on any machine.
set -euo pipefail
build_dir=$1
data_dir=$2
convert=$build_dir/tools/colibri-convert
work=$(mktemp -d)
disk=$work/disk
mkdir "$disk"
if ! mount -t tmpfs -o size=512k tmpfs "$disk" 2> "$work/mount.err"; then
  echo "SKIP convert_disk_full: cannot mount a small tmpfs here: $(cat "$work/mount.err")"
  rm -rf "$work"
  exit 77
fi
trap 'umount "$disk" 2> /dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL convert_disk_full: $*" >&2; exit 1; }

fixture=$data_dir/fixtures/mixtral-tiny
# A small existing output on the disk first (int4 fits in 512 KiB), then an f32
# conversion to the same path, which cannot.
"$convert" --input "$fixture" --output "$disk/model.colibri" --quant int4 --no-progress > /dev/null 2> "$work/first.err" ||
  fail "the int4 conversion did not fit: $(cat "$work/first.err")"
before=$(sha256sum "$disk/model.colibri" | cut -d' ' -f1)
set +e
"$convert" --input "$fixture" --output "$disk/model.colibri" --quant f32 --no-progress > "$work/out" 2> "$work/err"
status=$?
set -e
[[ $status -eq 1 ]] || fail "a conversion onto a full disk exited $status, not 1: $(cat "$work/err")"
grep -q "No space left on device" "$work/err" || fail "the error does not give the reason: $(cat "$work/err")"
grep -q "$disk/model.colibri" "$work/err" || fail "the error does not name the file: $(cat "$work/err")"
[[ $(sha256sum "$disk/model.colibri" | cut -d' ' -f1) == "$before" ]] || fail "the existing output was changed"
leftover=$(find "$disk" -name '*.tmp-*' | head -1)
[[ -z $leftover ]] || fail "a temporary file was left on the full disk: $leftover"
echo "convert_disk_full: ok"
