#!/usr/bin/env bash
# Copies the headers of r3's Debian libraries (nlohmann-json, CLI11, spdlog, fmt, the part of Boost
# the HTTP server includes, zlib's) and GoogleTest's sources into .gpu-deps/, so that a machine
# without those -dev packages (the GPU machine) can build r3, its HTTP server included, with
# -DR3_DEPS_DIR=.gpu-deps (bench/gpu.sh does). Run here, after scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-deps
rm -rf "$out"
mkdir -p "$out/include"
for d in nlohmann CLI spdlog fmt; do cp -r "/usr/include/$d" "$out/include/"; done
cp /usr/include/zlib.h /usr/include/zconf.h "$out/include/"
# Boost: the headers the HTTP server's sources include, as g++ and clang see them here (the same
# platform as the GPU machine's), plus the whole of config/, which picks its headers by compiler.
# The rest of Boost (180 MB) stays behind: a device call carries at most 64 MiB with the tree.
server_sources=(src/server/http_server.cpp src/server/body_encoding.cpp)
boost_headers() {
  for compiler in g++ clang++; do
    command -v "$compiler" >/dev/null || continue
    for f in "${server_sources[@]}"; do
      "$compiler" -std=c++20 -Isrc -M "$f" 2>/dev/null | tr ' \\' '\n\n' | grep '^/usr/include/boost/' || true
    done
  done | sort -u
}
mapfile -t headers < <(boost_headers)
[ ${#headers[@]} -gt 0 ] || { echo "gpu-deps: no Boost headers found (run scripts/install-deps.sh)"; exit 1; }
for h in "${headers[@]}"; do
  mkdir -p "$out/include/$(dirname "${h#/usr/include/}")"
  cp "$h" "$out/include/${h#/usr/include/}"
done
cp -r /usr/include/boost/config "$out/include/boost/"
cp -r /usr/src/googletest "$out/googletest"
grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
# The same as one compressed file, what a device call carries (bench/gpu.sh unpacks it there).
tar -cJf "$out.tar.xz" "$out"
grep -qx '/.gpu-deps.tar.xz' .git/info/exclude 2>/dev/null || echo '/.gpu-deps.tar.xz' >> .git/info/exclude
du -sh "$out" "$out.tar.xz"
