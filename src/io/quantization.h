// `quantization_config` of config.json: how a published checkpoint stores quantized weights.
//
// r3 supports the fine-grained FP8 format of DeepSeek-V3/R1, Kimi K2 and the Qwen3 FP8 releases
// (transformers' `finegrained_fp8`): quant_method "fp8", fmt "e4m3" (absent in Qwen3's configs),
// activation_scheme "dynamic", weight_block_size [bs0, bs1]. Each quantized weight is stored as
// F8_E4M3 next to `<name>_scale_inv` ([ceil(out / bs0), ceil(in / bs1)]; F32 in DeepSeek's and
// Kimi's checkpoints, BF16 or F16 in Qwen3's), and its value is fp8 * scale per block.
//
// Which tensors are quantized is read from the checkpoint (a weight stored as F8_E4M3 is one):
// the embeddings, lm_head, norms and router gates stay in their own dtype as published, and a
// module listed in `modules_to_not_convert` that is nevertheless stored as FP8 is refused.
//
// Activations are not quantized: r3 dequantizes weights only and computes in float32 (the
// "dynamic" scheme quantizes activations per token and group on a GPU; r3's references compute
// with the dequantized weights). Other methods (e.g. GPT-OSS's "mxfp4") are refused by name until
// supported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace r3 {

class HfConfig;

struct WeightQuantization {
  bool fp8 = false;  // false: no quantization_config, every weight is stored as it computes
  int64_t block_rows = 0, block_cols = 0;  // weight_block_size
  std::vector<std::string> modules_to_not_convert;
  std::string source;  // config.json, for messages

  // Reads config.quantization_config; refuses, naming the key, what r3 cannot run exactly.
  static WeightQuantization from_config(const HfConfig& config);
  // The entry of modules_to_not_convert that covers weight `name` (its module is the entry, or
  // inside it), or "" when none does.
  std::string excluded_by(const std::string& name) const;
};

}  // namespace r3
