// DeepSeek-V3 and Kimi K2 (DeepseekV3ForCausalLM): multi-head latent attention with a q LoRA,
// sigmoid routing with correction bias and group-limited top-k, shared experts, dense first layers.
#include "models/families/common_config.h"
#include "models/families/families.h"

namespace r3::models {

DecoderSpec parse_deepseek_v3(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "deepseek_v3";
  read_deepseek_common(config, spec);
  spec.moe.router = RouterKind::kSigmoidGroupTopK;
  return spec;
}

}  // namespace r3::models
