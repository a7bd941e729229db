# Sourced by the script tests that run one colibri-server in the background
# (not a test itself: tests/CMakeLists.txt takes only tests/scripts/*.sh).
# Set `test_name` first. Gives:
#   work   a temporary directory, removed on exit;
#   pid    the server's pid, to be set when it starts: it is stopped on exit;
#   fail MESSAGE   prints "FAIL test_name: MESSAGE" and the tail of
#                  $work/server.log, then exits 1.
work=$(mktemp -d)
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2> /dev/null && { wait "$pid" 2> /dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL $test_name: $*" >&2
  [[ -f $work/server.log ]] && tail -5 "$work/server.log" >&2
  exit 1
}
