#!/usr/bin/env bash
# Copies the reference fixtures of the families r3 implements from the shared reference folder
# (default ../shared/reference) into tests/data/. Re-run after regenerating references with
# tools/make_reference.py. Usage: tools/copy_reference.sh [SOURCE_DIR]
# deepseek_v4_alt, deepseek_v4_yarn, kimi_linear_alt, kimi_k3_alt and the quantized fixtures (*_fp8*, *_mxfp4) are not in the shared set: they were generated for r3 with
# tools/make_reference.py (commands in tests/data/README.md) and are left as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
source_dir="${1:-../shared/reference}"
families=(qwen3_moe qwen2_moe mixtral olmoe deepseek_v4 glm4_moe deepseek_v2 deepseek_v3 gpt_oss kimi_linear kimi_k3)
files=(config.json generation_config.json model.safetensors reference.json
       reference_0.safetensors reference_1.safetensors)
for family in "${families[@]}"; do
  mkdir -p "tests/data/$family"
  for f in "${files[@]}"; do
    cp "$source_dir/$family/$f" "tests/data/$family/$f"
  done
  echo "copied $family"
done
