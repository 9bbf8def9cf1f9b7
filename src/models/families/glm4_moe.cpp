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
  MoeSpec& m = spec.moe;
  m.num_experts = config.get_int_any({"n_routed_experts", "num_local_experts"});
  m.expert_intermediate = config.get_int("moe_intermediate_size");
  m.shared_expert_intermediate = m.expert_intermediate * config.get_int("n_shared_experts", 1);
  m.router = RouterKind::kSigmoidGroupTopK;
  m.num_groups = config.get_int("n_group", 1);
  m.topk_groups = config.get_int("topk_group", 1);
  m.routed_scaling_factor = config.get_double("routed_scaling_factor", 1.0);
  const int64_t dense = config.get_int("first_k_dense_replace", 0);
  for (int64_t i = 0; i < spec.num_layers; ++i) spec.layer_is_moe.push_back(i >= dense);
  spec.names.shared_expert = "shared_experts.";
  return spec;
}

}  // namespace r3::models
