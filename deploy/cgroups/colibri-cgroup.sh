#!/usr/bin/env bash
# Runs several colibri-server instances side by side, each in its own cgroup
# with its own CPUs and memory limit, without systemd (with systemd use
# colibri@.service and a drop-in per instance instead; docs/DEPLOY.md).
#
#   colibri-cgroup.sh create NAME CPUS MEMORY   e.g. create app1 0-7 40G
#   colibri-cgroup.sh run NAME -- COMMAND...    exec COMMAND inside NAME's group
#   colibri-cgroup.sh show NAME                 the group's limits and usage
#   colibri-cgroup.sh remove NAME               (once its processes have exited)
#   colibri-cgroup.sh probe                     exit 0 if groups can be created here
#
# cgroup v2 (unified hierarchy): one group under $COLIBRI_CGROUP_ROOT
# (default /sys/fs/cgroup/colibri) with cpuset.cpus and memory.max (the cpuset
# and memory controllers are enabled in the parent's cgroup.subtree_control).
# cgroup v1 fallback: one group in each of the cpuset and memory hierarchies,
# below the caller's own groups (cpuset.cpus + cpuset.mems,
# memory.limit_in_bytes). Needs root, or a
# delegated subtree. Note: huge pages are charged to memory.max only when
# cgroup2 is mounted with memory_hugetlb_accounting; otherwise the hugetlb
# pool bounds them.
set -euo pipefail
die() { echo "colibri-cgroup: $*" >&2; exit 1; }
v2_root=/sys/fs/cgroup
mode() {
  if [[ -f $v2_root/cgroup.controllers ]]; then echo v2
  elif [[ -d $v2_root/cpuset && -d $v2_root/memory ]]; then echo v1
  else echo none; fi
}
to_bytes() {
  local v=${1^^}
  case $v in
    *T) echo $(( ${v%T} << 40 ));; *G) echo $(( ${v%G} << 30 ));;
    *M) echo $(( ${v%M} << 20 ));; *K) echo $(( ${v%K} << 10 ));;
    max) echo max;;
    *[!0-9]*|'') die "'$1' is not a size (e.g. 40G)";;
    *) echo "$v";;
  esac
}
own_v1() {  # this process's group in a v1 hierarchy ("" for the root)
  local path; path=$(awk -F: -v c="$1" '$2 == c {print $3}' /proc/self/cgroup)
  [[ $path == / ]] && path=
  echo "$path"
}
# v1 groups go below the caller's own groups (a container's or a delegated
# subtree), so the instances stay inside whatever limits the caller has.
v1_cpuset() { echo "${COLIBRI_CGROUP_CPUSET:-$v2_root/cpuset$(own_v1 cpuset)/colibri}"; }
v1_memory() { echo "${COLIBRI_CGROUP_MEMORY:-$v2_root/memory$(own_v1 memory)/colibri}"; }
group_dirs() {  # the group's directories, one per hierarchy
  local name=$1
  case $(mode) in
    v2) echo "${COLIBRI_CGROUP_ROOT:-$v2_root/colibri}/$name";;
    v1) echo "$(v1_cpuset)/$name $(v1_memory)/$name";;
    *) die "no cgroup hierarchy found under $v2_root";;
  esac
}
create() {
  local name=$1 cpus=$2 memory; memory=$(to_bytes "$3")
  case $(mode) in
    v2)
      local parent=${COLIBRI_CGROUP_ROOT:-$v2_root/colibri}
      mkdir -p "$parent"
      # Controllers flow down: enable cpuset and memory for the parent's children.
      echo "+cpuset +memory" > "$v2_root/cgroup.subtree_control" 2>/dev/null || true
      echo "+cpuset +memory" > "$parent/cgroup.subtree_control"
      mkdir -p "$parent/$name"
      echo "$cpus" > "$parent/$name/cpuset.cpus"
      echo "$memory" > "$parent/$name/memory.max"
      echo 0 > "$parent/$name/memory.swap.max" 2>/dev/null || true
      ;;
    v1)
      local cs mem; cs=$(v1_cpuset); mem=$(v1_memory)
      mkdir -p "$cs" "$mem"
      # v1 cpusets start empty: a child needs its parent's cpus and mems set.
      [[ -n $(cat "$cs/cpuset.cpus") ]] || cat "$(dirname "$cs")/cpuset.cpus" > "$cs/cpuset.cpus"
      [[ -n $(cat "$cs/cpuset.mems") ]] || cat "$(dirname "$cs")/cpuset.mems" > "$cs/cpuset.mems"
      mkdir -p "$cs/$name" "$mem/$name"
      echo "$cpus" > "$cs/$name/cpuset.cpus"
      cat "$cs/cpuset.mems" > "$cs/$name/cpuset.mems"
      [[ $memory == max ]] && memory=-1
      echo "$memory" > "$mem/$name/memory.limit_in_bytes"
      ;;
    *) die "no cgroup hierarchy found under $v2_root";;
  esac
  echo "colibri-cgroup: $name ($(mode)): cpus $cpus, memory $3"
}
run() {
  local name=$1; shift
  [[ ${1:-} == -- ]] && shift
  [[ $# -gt 0 ]] || die "run $name: no command"
  for dir in $(group_dirs "$name"); do
    [[ -d $dir ]] || die "group $dir does not exist: create it first"
    echo $$ > "$dir/cgroup.procs"
  done
  exec "$@"
}
show() {
  for dir in $(group_dirs "$1"); do
    echo "$dir:"
    for f in cpuset.cpus cpuset.cpus.effective memory.max memory.current memory.limit_in_bytes memory.usage_in_bytes; do
      [[ -f $dir/$f ]] && echo "  $f = $(cat "$dir/$f")"
    done
  done
}
remove() {
  for dir in $(group_dirs "$1"); do
    [[ -d $dir ]] && rmdir "$dir"
    # The shared parent goes with its last instance.
    rmdir "$(dirname "$dir")" 2>/dev/null || true
  done
  return 0
}
probe() {
  local name="probe-$$"
  ( create "$name" "$(cut -d, -f1 <<<"$(cat /sys/devices/system/cpu/online)" | cut -d- -f1)" 64M >/dev/null 2>&1 ) || { remove "$name" 2>/dev/null || true; return 1; }
  remove "$name"
}
case ${1:-} in
  create) [[ $# -eq 4 ]] || die "usage: create NAME CPUS MEMORY"; create "$2" "$3" "$4";;
  run) [[ $# -ge 3 ]] || die "usage: run NAME -- COMMAND..."; shift; run "$@";;
  show) [[ $# -eq 2 ]] || die "usage: show NAME"; show "$2";;
  remove) [[ $# -eq 2 ]] || die "usage: remove NAME"; remove "$2";;
  probe) probe;;
  *) sed -n '2,21p' "$0"; exit 2;;
esac
