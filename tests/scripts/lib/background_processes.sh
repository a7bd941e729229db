# Sourced by scripts that start several processes in the background (not a
# test itself: tests/CMakeLists.txt takes only tests/scripts/*.sh). Gives:
#   work   a temporary directory, removed on exit;
#   pids   add each background process's pid (pids+=($!)): all are stopped
#          on exit.
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null && { wait "$pid" 2> /dev/null || true; }; done
  rm -rf "$work"
}
trap cleanup EXIT
