// Qwen2-MoE: q/k/v biases, a shared expert scaled by sigmoid(shared_expert_gate(x)),
// decoder_sparse_step and mlp_only_layers.
#include "models/families/common_config.h"
#include "models/families/families.h"

#include "core/check.h"

namespace r3::models {

DecoderSpec parse_qwen2_moe(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "qwen2_moe";
  read_common_decoder_config(config, spec);
  R3_CHECK(!config.get_bool("use_sliding_window", false), config.source(),
           ": use_sliding_window is not supported for qwen2_moe yet");
  spec.attention.qkv_bias = config.get_bool("qkv_bias", true);
  spec.moe.num_experts = config.get_int_any<int32_t>({"num_experts", "num_local_experts"});
  spec.moe.expert_intermediate = config.get_int<int32_t>("moe_intermediate_size");
  spec.moe.shared_expert_intermediate = config.get_int<int32_t>("shared_expert_intermediate_size");
  spec.moe.shared_expert_gate = true;
  spec.layer_is_moe = sparse_step_moe_layers(config, spec.num_layers, spec.moe.num_experts);
  return spec;
}

}  // namespace r3::models
