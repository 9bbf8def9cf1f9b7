#!/usr/bin/env bash
# Installs the Debian packages r3 needs to build and test, only those missing.
# Every dependency is a Debian package: no downloads at build or run time.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  nlohmann-json3-dev   # config.json, safetensors headers, --json output
  libcli11-dev         # command-line parsing with per-command --help
  libspdlog-dev        # logging, progress and timing lines on stderr
  libgtest-dev libgmock-dev  # unit and parity tests (CTest via gtest_discover_tests)
  libbenchmark-dev     # bench/ micro-benchmarks
  libboost1.81-dev     # r3 serve: Boost.Beast over Asio, the event-driven HTTP/1.1 layer (header-only)
  zlib1g-dev           # r3 serve: gzip and deflate request bodies, inflated within the body limit
  libcpp-httplib-dev   # the HTTP tests' client library (one of the real clients the server is tested with)
  clang libclang-rt-dev  # libFuzzer for `make fuzz` (fuzz/)
  python3              # tools/: writes the malformed-input suite and checks it in `make test`
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
