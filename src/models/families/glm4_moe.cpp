// GLM-4.5 (glm4_moe): partial rotary, optional per-head q/k RMSNorm, q/k/v bias, the first
// `first_k_dense_replace` layers dense, the rest MoE with sigmoid group-limited routing and
// shared experts.
#include "models/families/common_config.h"
#include "models/families/families.h"

namespace r3::models {

DecoderSpec parse_glm4_moe(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "glm4_moe";
  read_common_decoder_config(config, spec);
  spec.attention.qkv_bias = config.get_bool("attention_bias", false);
  spec.attention.qk_norm = config.get_bool("use_qk_norm", false) ? QkNorm::kPerHead : QkNorm::kNone;
  read_deepseek_style_moe(config, /*default_shared_experts=*/1, spec);
  spec.moe.router = RouterKind::kSigmoidGroupTopK;
  return spec;
}

}  // namespace r3::models
