# Sourced by the script tests that start colibri-server with --port 0 (it is
# not a test itself: tests/CMakeLists.txt takes only tests/scripts/*.sh).
#
# wait_for_port FILE: prints the HTTP port once the server's stdout, FILE,
# announces it ("listening on http://127.0.0.1:PORT", printed when it serves);
# returns 1 if that has not happened within 10 s.
wait_for_port() {
  local file=$1 port
  for _ in $(seq 100); do
    port=$(sed -n 's#.*listening on http://127.0.0.1:\([0-9]*\).*#\1#p' "$file")
    [[ -n $port ]] && { echo "$port"; return 0; }
    sleep 0.1
  done
  return 1
}
