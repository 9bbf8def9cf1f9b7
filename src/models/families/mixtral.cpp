// Mixtral: every layer MoE, experts named w1 (gate) / w3 (up) / w2 (down) under
// block_sparse_moe, top-k weights always renormalised, optional sliding window.
#include "models/families/common_config.h"
#include "models/families/families.h"

namespace r3::models {

DecoderSpec parse_mixtral(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "mixtral";
  read_common_decoder_config(config, spec);
  spec.attention.sliding_window = config.get_int<int32_t>("sliding_window", 0);
  spec.moe.num_experts = config.get_int_any<int32_t>({"num_local_experts", "num_experts"});
  spec.moe.expert_intermediate = config.get_int<int32_t>("intermediate_size");
  spec.moe.normalize_topk = true;
  spec.layer_is_moe.assign(static_cast<std::size_t>(spec.num_layers), true);
  use_block_sparse_moe_names(spec);
  return spec;
}

}  // namespace r3::models
