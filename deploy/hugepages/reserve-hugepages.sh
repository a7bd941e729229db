#!/usr/bin/env bash
# Reserves and/or checks 2 MiB huge pages for colibri-server.
#   reserve-hugepages.sh --reserve SIZE   write vm.nr_hugepages (root), then check
#   reserve-hugepages.sh --check SIZE     exit 0 if SIZE fits in free huge pages, 1 if not
#   reserve-hugepages.sh --status         print the pool
# SIZE: bytes, or with a K/M/G/T suffix (48G). A reservation can fall short when
# memory is fragmented: the script says how many pages the kernel really gave.
# For a permanent reservation install 60-colibri-hugepages.conf in /etc/sysctl.d.
set -euo pipefail
meminfo() { awk -v k="$1:" '$1 == k {print $2}' /proc/meminfo; }
to_bytes() {
  local v=${1^^}
  case $v in
    *T) echo $(( ${v%T} << 40 ));; *G) echo $(( ${v%G} << 30 ));;
    *M) echo $(( ${v%M} << 20 ));; *K) echo $(( ${v%K} << 10 ));;
    *[!0-9]*|'') echo "reserve-hugepages: '$1' is not a size (e.g. 48G)" >&2; exit 2;;
    *) echo "$v";;
  esac
}
page_kib=$(meminfo Hugepagesize)
[[ -n $page_kib ]] || { echo "reserve-hugepages: this kernel has no huge pages (no Hugepagesize in /proc/meminfo)" >&2; exit 1; }
status() {
  echo "huge page size $((page_kib / 1024)) MiB: total $(meminfo HugePages_Total), free $(meminfo HugePages_Free), reserved $(meminfo HugePages_Rsvd), surplus $(meminfo HugePages_Surp)"
}
pages_for() { local b; b=$(to_bytes "$1"); echo $(( (b + page_kib * 1024 - 1) / (page_kib * 1024) )); }
check() {
  local need free
  need=$(pages_for "$1"); free=$(meminfo HugePages_Free)
  if (( free >= need )); then echo "reserve-hugepages: OK: $1 needs $need pages, $free free"; return 0; fi
  echo "reserve-hugepages: NOT ENOUGH: $1 needs $need pages, only $free free ($(status))" >&2
  return 1
}
case ${1:-} in
  --status) status;;
  --check) [[ -n ${2:-} ]] || { echo "usage: $0 --check SIZE" >&2; exit 2; }; check "$2";;
  --reserve)
    [[ -n ${2:-} ]] || { echo "usage: $0 --reserve SIZE" >&2; exit 2; }
    want=$(pages_for "$2")
    total=$(( $(meminfo HugePages_Total) - $(meminfo HugePages_Free) + want ))
    echo "reserve-hugepages: asking for $total pages in the pool ($want free for $2)"
    echo 1 > /proc/sys/vm/compact_memory 2>/dev/null || true
    sysctl -q -w vm.nr_hugepages="$total" || { echo "reserve-hugepages: cannot write vm.nr_hugepages (root needed)" >&2; exit 1; }
    echo "reserve-hugepages: the kernel gave $(meminfo HugePages_Total) pages"
    check "$2";;
  *) sed -n '2,9p' "$0"; exit 2;;
esac
