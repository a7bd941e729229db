#!/usr/bin/env bash
# systemd/colibri.service and systemd/colibri@.service pass `systemd-analyze
# verify` with no complaint at all (it exits 0 on unknown keys and bad values,
# so any output fails the test). ExecStart must name an existing binary for
# verify, so the units are checked from a temp copy whose path is rewritten to
# the built colibri-server; the template is checked as instance colibri@app1.
# A unit with a deliberate mistake must be caught, so the check can fail.
set -euo pipefail
build_dir=$(cd "$1" && pwd)
server=$build_dir/server/colibri-server
src=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL systemd_units: $*" >&2; exit 1; }
command -v systemd-analyze >/dev/null || fail "systemd-analyze is missing (scripts/install-deps.sh installs systemd)"
[[ -x $server ]] || fail "$server is not built"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

verify() {  # verify UNIT_FILE: prints what systemd-analyze said; fails on any output
  local out
  out=$(cd "$work" && systemd-analyze verify "./$1" 2>&1) || { echo "$out"; return 1; }
  # Messages about units this one does not ship (e.g. the host's own) are not ours.
  out=$(grep -F "$1" <<<"$out" || true)
  [[ -z $out ]] || { echo "$out"; return 1; }
}

adapt() {  # adapt SOURCE TARGET
  sed "s#/usr/local/bin/colibri-server#$server#g" "$1" > "$work/$2"
}

adapt "$src/systemd/colibri.service" colibri.service
adapt "$src/systemd/colibri@.service" colibri@app1.service
cp "$src/systemd/colibri.slice" "$work/colibri.slice"
verify colibri.service || fail "colibri.service does not verify"
verify colibri@app1.service || fail "colibri@.service (as colibri@app1) does not verify"

# What the units must contain (the issue's list).
for unit in colibri.service colibri@app1.service; do
  for key in Type=notify WatchdogSec= NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
             ReadWritePaths= LimitMEMLOCK= TimeoutStopSec= ExecReload= User=colibri MemoryMax=; do
    grep -q "^$key" "$work/$unit" || fail "$unit has no $key"
  done
done
grep -q '^AllowedCPUs=' "$work/colibri@app1.service" || fail "colibri@.service has no AllowedCPUs"
grep -q '^CPUAffinity=' "$work/colibri@app1.service" || fail "colibri@.service has no CPUAffinity"
grep -q -- '--config /etc/colibri/%i.json' "$work/colibri@app1.service" || fail "colibri@.service does not read /etc/colibri/%i.json"
# TimeoutStopSec must exceed the default drain grace (drain_timeout_s).
drain=$("$server" --print-config | python3 -c 'import json,sys; print(json.load(sys.stdin)["drain_timeout_s"])')
for unit in colibri.service colibri@app1.service; do
  stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$work/$unit")
  [[ -n $stop && $stop -gt $drain ]] || fail "$unit: TimeoutStopSec=${stop}s is not longer than drain_timeout_s=$drain"
done

# The check itself must catch a broken unit.
sed 's/^NoNewPrivileges=yes/NoNewPrivileges=yes\nMemoryMax=lots/' "$work/colibri.service" > "$work/broken.service"
if verify broken.service >/dev/null; then fail "a unit with MemoryMax=lots passed verification"; fi
echo "systemd_units: colibri.service and colibri@.service verify cleanly (systemd $(systemd-analyze --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p'))"
