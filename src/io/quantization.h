// `quantization_config` of config.json: how a published checkpoint stores quantized weights.
//
// r3 runs two formats, both weight-only (activations stay float32: r3 dequantizes weights inside
// its kernels and computes what the dequantized float32 checkpoint computes):
//
// - quant_method "fp8": the fine-grained FP8 of DeepSeek-V3/R1, Kimi K2 and the Qwen3 FP8 releases
//   (transformers' `finegrained_fp8`): fmt "e4m3" (absent in Qwen3's configs), activation_scheme
//   "dynamic", weight_block_size [bs0, bs1]. Each quantized weight is stored as F8_E4M3 next to
//   `<name>_scale_inv` ([ceil(out / bs0), ceil(in / bs1)]; F32 in DeepSeek's and Kimi's
//   checkpoints, BF16 or F16 in Qwen3's), and its value is fp8 * scale per block. Which tensors are
//   quantized is read from the checkpoint (a weight stored as F8_E4M3 is one). The "dynamic"
//   scheme quantizes activations per token and group on a GPU; r3's references compute with the
//   dequantized weights. DeepSeek-V4-Flash's variant (transformers 5.17 reads it the same way):
//   scale_fmt "ue8m0" (every scale a power of two, stored in a float32 container) and the scales
//   named `<module>.scale` instead of `<module>.weight_scale_inv`; its compressors' and indexer's
//   weights projections ship in BF16 without scales (a weight's own dtype says which it is).
//
// - quant_method "mxfp4": GPT-OSS's experts as OpenAI publishes them (openai/gpt-oss-20b and -120b:
//   `{"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
//   "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}`). Only the experts' fused
//   projections are quantized: `mlp.experts.gate_up_proj_blocks` U8 [E, 2I, H/32, 16] with
//   `gate_up_proj_scales` U8 [E, 2I, H/32], `down_proj_blocks` U8 [E, H, I/32, 16] with
//   `down_proj_scales` U8 [E, H, I/32] (see core/tensor.h, MxScales, for the values; the biases
//   stay as they are). transformers' Mxfp4HfQuantizer replaces exactly the GptOssExperts modules
//   not covered by modules_to_not_convert, so that is where r3 expects blocks.
//
// modules_to_not_convert lists module names, `*` matching any run of characters (transformers
// matches the entries as regular expressions, where the published `model.layers.*.self_attn`
// works the same way). A weight stored quantized inside a listed module is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace r3 {

class HfConfig;

enum class QuantMethod {
  kNone,   // no quantization_config: every weight is stored as it computes
  kFp8,    // block-scaled e4m3
  kMxfp4,  // GPT-OSS's MXFP4 experts
};

struct WeightQuantization {
  QuantMethod method = QuantMethod::kNone;
  int64_t block_rows = 0, block_cols = 0;  // fp8: weight_block_size
  bool power_of_two_scales = false;        // fp8: scale_fmt "ue8m0" (checked scale by scale at load)
  std::vector<std::string> modules_to_not_convert;
  std::string source;  // config.json, for messages

  bool fp8() const { return method == QuantMethod::kFp8; }
  bool mxfp4() const { return method == QuantMethod::kMxfp4; }

  // Reads config.quantization_config; refuses, naming the key, what r3 cannot run exactly.
  static WeightQuantization from_config(const HfConfig& config);
  // The entry of modules_to_not_convert that covers weight `name` (its module is the entry, or
  // inside it), or "" when none does.
  std::string excluded_by(const std::string& name) const;
};

}  // namespace r3
