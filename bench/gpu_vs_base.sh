#!/usr/bin/env bash
# One call on the GPU machine, after bench/gpu.sh has built build-gpu from this tree: the same
# binaries built from the tree minus $R3_BASE_PATCH (made here with `git diff <base> HEAD -- src/
# > base.patch` and sent with the tree), then both measured on this machine: the base's kernel
# bench (R3_KERNEL_SECTIONS, as gpu.sh; base_kernels.jsonl) and decode at batch 1 and 8
# (R3_VS_BASE_BATCHES="1,8,64": others) and prefill in bf16 and FP8, new and base in turn,
# R3_AB_ROUNDS times (default 2; vs_base.jsonl). The tree is
# left as it came. Usage there: R3_BASE_PATCH=base.patch bash bench/gpu_vs_base.sh; or, with the
# base's r3 built already in another folder (no base kernel bench then),
# R3_BASE_BUILD=<its build folder> bash bench/gpu_vs_base.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out" build-ab/new build-ab/base
cp build-gpu/r3 build-ab/new/
if [[ -n "${R3_BASE_BUILD:-}" ]]; then
  # The base's r3 built already (in another copy of the tree, beside this tree's GPU tests).
  cp "$R3_BASE_BUILD/r3" build-ab/base/
else
  patch_file=${R3_BASE_PATCH:?set R3_BASE_PATCH to the diff from the base to this tree, or R3_BASE_BUILD}
  cp build-gpu/r3_gpu_kernels_bench build-ab/new/
  patch -R -p1 < "$patch_file" > "$out/base_patch.log" 2>&1 || { cat "$out/base_patch.log"; exit 1; }
  cmake --build build-gpu -j"$(nproc)" --target r3 r3_gpu_kernels_bench > "$out/base_build.log" 2>&1
  built=$?
  cp build-gpu/r3 build-gpu/r3_gpu_kernels_bench build-ab/base/
  patch -p1 < "$patch_file" >> "$out/base_patch.log" 2>&1 || { echo "could not reapply $patch_file"; exit 1; }
  (( built == 0 )) || { grep -m5 -A5 error "$out/base_build.log"; exit 1; }
  ./build-ab/base/r3_gpu_kernels_bench ${R3_KERNEL_SECTIONS:-} > "$out/base_kernels.jsonl" 2>&1
fi
for round in $(seq "${R3_AB_ROUNDS:-2}"); do
  for which in new base; do
    for weights in bf16 fp8; do
      ./build-ab/$which/r3 bench --device cuda --synthetic qwen3-30b-a3b --synthetic-weights $weights \
        --synthetic-batches "${R3_VS_BASE_BATCHES:-1,8}" --json 2>>"$out/vs_base.log" > "$out/vs_base.json"
      python3 bench/decode_ms.py "$out/vs_base.json" which=$which weights=$weights round=$round | tee -a "$out/vs_base.jsonl"
    done
  done
done
rm -f "$out/vs_base.json"
