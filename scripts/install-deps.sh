#!/usr/bin/env bash
# Installs every Debian package Colibri's build and tests need. Idempotent and
# quiet when everything is already there; safe to run on every build.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libpcre2-dev libxxhash-dev libcli11-dev
  libspdlog-dev libfmt-dev libcpp-httplib-dev
  python3
  # clang's libFuzzer (tests/fuzz/run_fuzzer.sh); libclang-rt-dev pulls
  # the runtime matching the default clang (libclang-rt-14-dev on Debian 12).
  clang libclang-rt-dev
  # The aarch64 kernels cross-compiled and run under emulation (tests/scripts/neon_qemu.sh).
  g++-aarch64-linux-gnu qemu-user
  # The Python binding's tests (tests/scripts/python_binding.sh); run with /usr/bin/python3.
  python3-numpy python3-pytest
  # colibri-server's gRPC API: protoc + grpc_cpp_plugin generate code from
  # proto/colibri.proto at build time.
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # Operations tests: systemd-analyze verify on systemd/*.service
  # (tests/scripts/systemd_units.sh); Debian's nginx in front of two instances,
  # driven with curl and pinned with taskset (tests/scripts/deploy_nginx.sh).
  systemd nginx curl util-linux
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node.js runs the official OpenAI and Anthropic clients against the server
# (tests/scripts/node_clients.sh) and regenerates tokenizer expectations
# (tests/tokenizer/gen). Machines of this kind ship node+npm already; Debian's
# npm conflicts with that build, so Debian's is installed only when there is none.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "install-deps: installing nodejs npm"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# The client packages at the versions package-lock.json pins, from the npm
# registry, only when that lock file changed since the last install.
client_dir=$(cd "$(dirname "$0")/.." && pwd)/tests/clients/node
wanted=$(sha256sum "$client_dir/package-lock.json" | cut -d' ' -f1)
installed=$(cat "$client_dir/node_modules/.colibri-lock-sha256" 2>/dev/null || true)
if [[ $installed != "$wanted" ]]; then
  echo "install-deps: installing the npm packages of tests/clients/node (openai, @anthropic-ai/sdk)"
  (cd "$client_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$wanted" > "$client_dir/node_modules/.colibri-lock-sha256"
fi
