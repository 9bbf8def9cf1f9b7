// OLMoE: q/k RMSNorm over the whole projection (before the split into heads), optional
// clip_qkv, every layer MoE.
#include "models/families/common_config.h"
#include "models/families/families.h"

namespace r3::models {

DecoderSpec parse_olmoe(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "olmoe";
  read_common_decoder_config(config, spec);
  spec.attention.qkv_bias = spec.attention.o_bias = config.get_bool("attention_bias", false);
  spec.attention.qk_norm = QkNorm::kFull;
  spec.attention.clip_qkv = config.get_double("clip_qkv", 0.0);
  spec.moe.num_experts = config.get_int_any<int32_t>({"num_experts", "num_local_experts"});
  spec.moe.expert_intermediate = config.get_int<int32_t>("intermediate_size");
  spec.layer_is_moe.assign(static_cast<std::size_t>(spec.num_layers), true);
  return spec;
}

}  // namespace r3::models
