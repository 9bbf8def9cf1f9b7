#!/usr/bin/env bash
# Copies the headers of r3's Debian libraries (nlohmann-json, CLI11, spdlog, fmt) and GoogleTest's
# sources into .gpu-deps/, so that a machine without those -dev packages (the GPU machine) can
# build r3 with -DR3_DEPS_DIR=.gpu-deps (bench/gpu.sh does). Run here, after scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-deps
rm -rf "$out"
mkdir -p "$out/include"
for d in nlohmann CLI spdlog fmt; do cp -r "/usr/include/$d" "$out/include/"; done
cp -r /usr/src/googletest "$out/googletest"
grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
du -sh "$out"
