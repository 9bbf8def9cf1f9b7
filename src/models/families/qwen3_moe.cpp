// Qwen3-MoE: per-head q/k RMSNorm, no shared expert, norm_topk_prob, decoder_sparse_step and
// mlp_only_layers decide which layers are MoE.
#include "models/families/common_config.h"
#include "models/families/families.h"

#include "core/check.h"

namespace r3::models {

DecoderSpec parse_qwen3_moe(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "qwen3_moe";
  read_common_decoder_config(config, spec);
  R3_CHECK(!config.get_bool("use_sliding_window", false), config.source(),
           ": use_sliding_window is not supported for qwen3_moe yet");
  spec.attention.qkv_bias = spec.attention.o_bias = config.get_bool("attention_bias", false);
  spec.attention.qk_norm = QkNorm::kPerHead;
  // transformers 5 names the expert count num_experts; some configs say num_local_experts.
  spec.moe.num_experts = config.get_int_any<int32_t>({"num_experts", "num_local_experts"});
  spec.moe.expert_intermediate = config.get_int<int32_t>("moe_intermediate_size");
  spec.layer_is_moe = sparse_step_moe_layers(config, spec.num_layers, spec.moe.num_experts);
  return spec;
}

}  // namespace r3::models
