#!/usr/bin/env bash
# One call on the GPU machine: build r3 with its CUDA backend (sm_90a) from the carried library
# headers (scripts/gpu-deps.sh, carried as .gpu-deps.tar.xz), run the GPU tests and the kernel
# benchmarks (R3_TESTS_ONLY=1: none; with R3_BREAKDOWN=1, a per-kernel profile of a decode step;
# with R3_AB=<kernel choice>, that choice measured forced each way; with R3_AB_CONFIGS, whole
# settings of kernel choices compared; with R3_TIMELINE=1, each kernel's place in the step's graph as it ran; with
# R3_DEEP_PROFILE=1, a batch-1 layer's kernels profiled in depth; with R3_SASS_PROFILE=1, the
# small kernels' stalls by SASS line; with R3_RESIDENT_MEMORY=1, the host memory a 61 GB model
# leaves resident once placed;
# R3_TESTS_FILTER, R3_KERNEL_SECTIONS, R3_DECODE_BENCH=0 and R3_BENCH_ONLY=1 narrow a call down), and leave the logs
# in $OUT (or ./gpu-out). Usage there: R3_COMMIT=<commit the tree was sent from> bash bench/gpu.sh
# (the copy of the tree on that machine may carry an older .git).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
# The carried library headers come as one compressed file (scripts/gpu-deps.sh).
[[ -d .gpu-deps || ! -f .gpu-deps.tar.xz ]] || tar -xJf .gpu-deps.tar.xz
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: ${R3_COMMIT:-unknown (set R3_COMMIT)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
} > "$out/device.txt" 2>&1
# NCCL for expert parallelism across GPUs: the toolkit's, else PyTorch's wheel (nvidia.nccl).
nccl_dir=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DR3_DEPS_DIR="$PWD/.gpu-deps" \
  ${nccl_dir:+-DR3_NCCL_DIR="$nccl_dir"} -DR3_BUILD_BENCH=OFF > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
grep -E "r3: (NCCL|CUDA)" "$out/configure.log" >> "$out/device.txt"
# R3_BENCH_ONLY=1: r3 alone, no GPU tests and no kernel bench (the standard decode benches of a
# commit whose tests passed on another call, in the least device time: each test binary and the
# kernel bench add to the build).
bench_only=${R3_BENCH_ONLY:-0}
targets="r3_gpu_tests r3_gpu_kernels_bench r3"
[[ "$bench_only" == 1 ]] && targets=r3
cmake --build build-gpu -j"$(nproc)" --target $targets > "$out/build.log" 2>&1 || { grep -B2 -A10 -m5 error "$out/build.log"; exit 1; }
status=0
# R3_TESTS_FILTER=<gtest filter>: only those GPU tests (a short call that checks one change).
if [[ "$bench_only" != 1 ]]; then
  ./build-gpu/r3_gpu_tests ${R3_TESTS_FILTER:+--gtest_filter="$R3_TESTS_FILTER"} 2>&1 | tee "$out/gpu_tests.log" || status=1
fi
# R3_TESTS_ONLY=1: the build and the GPU tests, no benchmarks.
if [[ "${R3_TESTS_ONLY:-0}" == 1 ]]; then cat "$out/device.txt"; exit $status; fi
# R3_KERNEL_SECTIONS="<section> ...": only those sections of the kernel bench (default: all;
# "none": no kernel bench).
if [[ "${R3_KERNEL_SECTIONS:-}" != none && "$bench_only" != 1 ]]; then
  ./build-gpu/r3_gpu_kernels_bench ${R3_KERNEL_SECTIONS:-} 2>&1 | tee "$out/gpu_kernels_bench.jsonl" || status=1
fi
# R3_DECODE_BENCH=0: none of the three decode benches below (R3_AB's comparisons still run).
if [[ "${R3_DECODE_BENCH:-1}" != 0 ]]; then
  ./build-gpu/r3 bench --device cuda --synthetic qwen3-30b-a3b --json 2>"$out/gpu_decode_bench.log" | tee "$out/gpu_decode_bench.json" || status=1
  # The same shape published as FP8 (e4m3, a float32 scale per 128x128 block), read as stored.
  ./build-gpu/r3 bench --device cuda --synthetic qwen3-30b-a3b --synthetic-weights fp8 --json \
    2>>"$out/gpu_decode_bench.log" | tee "$out/gpu_decode_bench_fp8.json" || status=1
  # llama.cpp's reference ran 128-token prompts and 128 generated tokens per sequence: the same
  # sizes at its mean context, 192.
  ./build-gpu/r3 bench --device cuda --synthetic qwen3-30b-a3b --synthetic-batches 2,4,8,16,32 --synthetic-context 192 \
    --json 2>>"$out/gpu_decode_bench.log" | tee "$out/gpu_decode_bench_192.json" || status=1
fi
# With two GPUs or more: expert parallelism, the synthetic model served by 1 and by 2 ranks (a
# GPU each), the same requests (its step times are the engine's, eager under --ep).
if (( $(nvidia-smi -L | wc -l) >= 2 )); then
  for ep in 1 2; do
    ./build-gpu/r3 bench --device cuda --synthetic qwen3-30b-a3b --synthetic-engine --ep $ep --num-prompts 16 \
      --prompt-len 128 --output-len 64 --json 2>>"$out/gpu_ep_bench.log" | tee "$out/gpu_ep${ep}_bench.json" || status=1
  done
fi
# R3_AB="<kernel choice> ...": each kernel choice (backend/cuda/kernel_choices.h) measured against
# itself, the same binary: decode at batch 1 and 8 (R3_AB_BATCHES="1,8,64": others) and prefill in
# bf16 and FP8 with the choice forced never and always in turn (R3_AB_VALUES="never rule always":
# those values), R3_AB_ROUNDS times (default 2; ab.jsonl; R3_AB_WEIGHTS=fp8: the FP8 weights only),
# and the kernel bench's projections under each value (ab_linear.jsonl). Each run passes
# --kernel-choice NAME=VALUE.
for choice in ${R3_AB:-}; do
  for round in $(seq "${R3_AB_ROUNDS:-2}"); do
    for value in ${R3_AB_VALUES:-never always}; do
      for weights in ${R3_AB_WEIGHTS:-bf16 fp8}; do
        ./build-gpu/r3 bench --device cuda --kernel-choice "$choice=$value" --synthetic qwen3-30b-a3b \
          --synthetic-weights $weights --synthetic-batches "${R3_AB_BATCHES:-1,8}" --json \
          2>>"$out/gpu_decode_bench.log" > "$out/ab.json" || status=1
        python3 bench/decode_ms.py "$out/ab.json" "$choice=$value" weights=$weights round=$round | tee -a "$out/ab.jsonl"
      done
    done
  done
  for value in ${R3_AB_VALUES:-never always}; do
    [[ "$bench_only" == 1 ]] && break  # (no kernel bench built)
    ./build-gpu/r3_gpu_kernels_bench --kernel-choice "$choice=$value" linear |
      sed "s/^{/{\"$choice\":\"$value\",/" >> "$out/ab_linear.jsonl"
  done
  rm -f "$out/ab.json"
done
# R3_AB_CONFIGS="<NAME=VALUE ...>;<NAME=VALUE ...>;...": whole settings of kernel choices compared,
# the same binary (each a space-separated list of NAME=VALUE, each passed as --kernel-choice; "-"
# for none): for each, R3_AB_ROUNDS rounds of decode at R3_AB_BATCHES (default 1,8) for
# R3_AB_WEIGHTS (default bf16 fp8), rounds interleaved across the settings (ab_configs.jsonl), and
# the kernel bench's MoE layer lines (ab_configs_moe.jsonl).
choice_args() {  # "NAME=VALUE ..." or "-" -> --kernel-choice NAME=VALUE ..., one word a line
  local setting
  for setting in ${1/#-/}; do printf '%s\n' --kernel-choice "$setting"; done
}
if [[ -n "${R3_AB_CONFIGS:-}" ]]; then
  IFS=';' read -r -a configs <<< "$R3_AB_CONFIGS"
  for config in "${configs[@]}"; do
    [[ "$bench_only" == 1 ]] && break  # (no kernel bench built)
    mapfile -t args < <(choice_args "$config")
    ./build-gpu/r3_gpu_kernels_bench ${args[@]+"${args[@]}"} moe_layer 2>&1 | grep '"moe_layer"' |
      sed "s/^{/{\"config\":\"$config\",/" >> "$out/ab_configs_moe.jsonl" || status=1
  done
  for round in $(seq "${R3_AB_ROUNDS:-2}"); do
    for config in "${configs[@]}"; do
      mapfile -t args < <(choice_args "$config")
      for weights in ${R3_AB_WEIGHTS:-bf16 fp8}; do
        ./build-gpu/r3 bench --device cuda ${args[@]+"${args[@]}"} --synthetic qwen3-30b-a3b --synthetic-weights $weights \
          --synthetic-batches "${R3_AB_BATCHES:-1,8}" --json 2>>"$out/gpu_decode_bench.log" > "$out/ab.json" || status=1
        python3 bench/decode_ms.py "$out/ab.json" "config=$config" weights=$weights round=$round | tee -a "$out/ab_configs.jsonl"
      done
    done
  done
  rm -f "$out/ab.json"
fi
# R3_BREAKDOWN=1: each kernel's time in one eager decode step at batch 1, or R3_BREAKDOWN_BATCH
# (Nsight Compute, kernels serialised, clocks and caches left alone; the launches skipped are the
# synthetic model's weight fills: 490 for bf16 weights, 760 for FP8, whose scales are filled
# too). The same for the FP8 weights (kernel_breakdown_fp8.txt), for the FP8 batch-1 criterion.
if [[ "${R3_BREAKDOWN:-0}" == 1 ]] && command -v ncu > /dev/null; then
  for weights in bf16 fp8; do
    suffix=$([[ $weights == fp8 ]] && echo _fp8)
    skip=$([[ $weights == fp8 ]] && echo 760 || echo 490)
    ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum --launch-skip "${R3_BREAKDOWN_SKIP:-$skip}" --launch-count 600 \
      ./build-gpu/r3 bench --device cuda --synthetic qwen3-30b-a3b --synthetic-weights $weights \
      --synthetic-batches "${R3_BREAKDOWN_BATCH:-1}" > "$out/ncu_step$suffix.csv" 2> "$out/ncu_step$suffix.log"
    python3 bench/kernel_breakdown.py "$out/ncu_step$suffix.csv" | tee "$out/kernel_breakdown$suffix.txt"
  done
fi
# R3_TIMELINE=1: every kernel's start and end as it ran inside the decode step's graph (CUPTI,
# bench/kernel_timeline.cpp), bf16 and FP8 at batch 1 (R3_TIMELINE_BATCH: another), and where the
# step's time goes: each kernel's exposed time and the idle gaps (timeline*.txt, bench/kernel_timeline.py),
# and what equal shares of the floor ask of the short links both types share (floor_shares.txt).
if [[ "${R3_TIMELINE:-0}" == 1 ]] &&
  { cmake --build build-gpu --target r3_kernel_timeline >> "$out/build.log" 2>&1 || { echo "no kernel timeline (CUPTI?)"; false; }; }; then
  for weights in bf16 fp8; do
    suffix=$([[ $weights == fp8 ]] && echo _fp8)
    CUDA_INJECTION64_PATH="$PWD/build-gpu/libr3_kernel_timeline.so" R3_TIMELINE_OUT="$out/timeline$suffix.csv" \
      ./build-gpu/r3 bench --device cuda --synthetic qwen3-30b-a3b --synthetic-weights $weights \
      --synthetic-batches "${R3_TIMELINE_BATCH:-1}" --json > "$out/timeline_bench$suffix.json" 2> "$out/timeline$suffix.log" || status=1
    python3 bench/kernel_timeline.py "$out/timeline$suffix.csv" --json "$out/timeline$suffix.json" | tee "$out/timeline$suffix.txt" || status=1
    gzip -f "$out/timeline$suffix.csv"
  done
  # What equal shares of the floor would ask of the two (issue 15's criterion; bench/floor_shares.py).
  python3 bench/floor_shares.py "$out/timeline.json" "$out/timeline_fp8.json" \
    --floors-from "$out/timeline_bench.json" "$out/timeline_bench_fp8.json" | tee "$out/floor_shares.txt" || status=1
fi
# R3_RESIDENT_MEMORY=1: issue 51's host-memory criterion. A sharded bf16 checkpoint of
# Qwen3-30B-A3B's shape (about 61 GB of zeros, bench/resident_memory.py) written to memory-backed
# /dev/shm (R3_RESIDENT_MEMORY_DIR: elsewhere), then `r3 generate --device cuda` on it, whose log
# names the host memory still resident once the weights are on the device, and its peak
# (resident_memory.txt). The checkpoint is deleted after.
if [[ "${R3_RESIDENT_MEMORY:-0}" == 1 ]]; then
  dir=${R3_RESIDENT_MEMORY_DIR:-/dev/shm/r3-qwen3-30b-a3b-shape}
  { python3 bench/resident_memory.py --out "$dir" &&
    ./build-gpu/r3 generate --device cuda --model "$dir" --ids 1,2,3,4 --max-new-tokens 4 2>&1 | grep -E "loaded|host memory|error"
  } 2>&1 | tee "$out/resident_memory.txt" || status=1
  rm -rf "$dir"
fi
# R3_DEEP_PROFILE=1: one batch-1 layer's kernels (past the first steps), each with Nsight Compute's
# throughput, memory, warp-stall and occupancy sections, bf16 and FP8 (deep_profile*.txt): where
# each link of the chain spends its time.
if [[ "${R3_DEEP_PROFILE:-0}" == 1 ]] && command -v ncu > /dev/null; then
  for weights in bf16 fp8; do
    ncu --clock-control none --cache-control none \
      --kernel-name regex:'attention_chunks|merge_chunks|down_and_combine|gate_up_by_pair|route_|prepare_rows|rows_kernel' \
      --launch-skip 900 --launch-count 9 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats \
      ./build-gpu/r3 bench --device cuda --synthetic qwen3-30b-a3b --synthetic-weights $weights --synthetic-batches 1 \
      > "$out/deep_profile_$weights.txt" 2>&1 || echo "deep profile ($weights) failed"
  done
fi
# R3_SASS_PROFILE=1: the small kernels' warp stalls by SASS instruction (bf16, batch 1): which
# loads, shuffles or barriers each link waits on. The report's source page as CSV, one row per
# instruction (sass_small_kernels.csv).
if [[ "${R3_SASS_PROFILE:-0}" == 1 ]] && command -v ncu > /dev/null; then
  ncu --clock-control none --cache-control none \
    --kernel-name regex:'attention_chunks|merge_chunks|route_|prepare_rows' \
    --launch-skip 900 --launch-count 25 --warp-sampling-interval 0 --section SourceCounters --section WarpStateStats \
    --import-source yes \
    -f -o "$out/small_kernels" \
    ./build-gpu/r3 bench --device cuda --synthetic qwen3-30b-a3b --synthetic-batches 1 > "$out/small_kernels.log" 2>&1 &&
  ncu --import "$out/small_kernels.ncu-rep" --page source --csv --print-source sass > "$out/sass_small_kernels.csv" \
    2>> "$out/small_kernels.log" || { echo "SASS profile failed:"; tail -5 "$out/small_kernels.log"; }
fi
cat "$out/device.txt"
exit $status
