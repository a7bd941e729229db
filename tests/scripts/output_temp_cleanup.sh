#!/usr/bin/env bash
# A tool writing a .colibri file leaves no temporary file (OUTPUT.tmp-PID) of
# many GB behind:
#  - Ctrl-C (SIGINT) or SIGTERM during the write removes it, the process ends
#    as the signal would have, and an existing output is unchanged;
#  - one left by a writer that could not clean up (SIGKILL) is removed by the
#    next write to that output, but not one a live writer holds (flock), nor a
#    symlink planted under such a name.
set -euo pipefail
build_dir=$1
data_dir=$2
convert=$build_dir/tools/colibri-convert
synth=$build_dir/tools/colibri-synth
work=$(mktemp -d)
holder=
cleanup() {
  [[ -n $holder ]] && kill "$holder" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL output_temp_cleanup: $*" >&2; exit 1; }

target=$work/model.colibri
"$convert" --input "$data_dir/fixtures/mixtral-tiny" --output "$target" --quant f32 --no-progress > /dev/null 2>&1 ||
  fail "first conversion"
before=$(sha256sum "$target" | cut -d' ' -f1)

# A 1-layer OLMoE-shaped file: 0.66 GB, several seconds of writing.
for signal in INT TERM; do
  # A background job of a script starts with SIGINT ignored (and the tool
  # keeps an ignored signal ignored, as nohup expects); a terminal's Ctrl-C
  # reaches a foreground tool with the default action, as here.
  env --default-signal=INT "$synth" olmoe-1b-7b --layers 1 --quant int8 --out "$target" > "$work/out" 2>&1 &
  writer=$!
  temp=
  for _ in $(seq 600); do
    temp=$(find "$work" -name 'model.colibri.tmp-*' | head -1)
    [[ -n $temp ]] && break
    sleep 0.01
  done
  [[ -n $temp ]] || fail "no temporary file appeared"
  sleep 0.2
  kill -s "$signal" "$writer"
  set +e
  wait "$writer"
  status=$?
  set -e
  [[ $status -ne 0 ]] || fail "SIG$signal: the write finished before the signal; nothing was tested"
  expected=$((128 + $(kill -l "$signal")))
  [[ $status -eq $expected ]] || fail "SIG$signal: exit status $status, not $expected (death by the signal)"
  leftover=$(find "$work" -name 'model.colibri.tmp-*' | head -1)
  [[ -z $leftover ]] || fail "SIG$signal left $leftover ($(stat -c %s "$leftover") bytes)"
  [[ $(sha256sum "$target" | cut -d' ' -f1) == "$before" ]] || fail "SIG$signal changed the existing output"
done

# Leftovers: a stale one (no holder), one held by a live writer's flock, and a
# symlink to a file that must survive.
stale=$target.tmp-999999001
held=$target.tmp-999999002
link=$target.tmp-999999003
echo stale > "$stale"
echo held > "$held"
echo precious > "$work/precious"
ln -s "$work/precious" "$link"
# The lock is taken on a descriptor of a process that then becomes the sleep,
# so killing $holder ends the only process holding it. (`flock FILE sleep`
# left its sleep behind, holding this test's output open: ctest waited the
# whole minute for it.)
bash -c 'exec 9< "$1" && flock 9 && exec sleep 60' _ "$held" < /dev/null > /dev/null 2>&1 &
holder=$!
for _ in $(seq 100); do
  flock -n "$held" true 2> /dev/null || break
  sleep 0.05
done
"$convert" --input "$data_dir/fixtures/mixtral-tiny" --output "$target" --quant int8 --no-progress > /dev/null 2>&1 ||
  fail "conversion beside leftovers"
[[ ! -e $stale ]] || fail "the stale temporary file was not removed"
[[ -f $held ]] || fail "a temporary file a live writer holds was removed"
[[ -L $link && $(cat "$work/precious") == precious ]] || fail "the planted symlink or its target was touched"
[[ $(sha256sum "$target" | cut -d' ' -f1) != "$before" ]] || fail "the conversion did not replace the output"
echo "output_temp_cleanup: ok"
