// GPT-OSS (gpt_oss): q/k/v/o biases, attention sinks, sliding-window and full attention layers
// alternating per `layer_types`, YaRN rotary, a biased router (top-k of the logits, softmax over
// the k), experts with biases and the clamped gated activation (gate * sigmoid(1.702 gate)) *
// (up + 1), stored fused with gate/up columns interleaved.
#include "models/families/common_config.h"
#include "models/families/families.h"

#include "core/check.h"

namespace r3::models {

DecoderSpec parse_gpt_oss(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "gpt_oss";
  read_common_decoder_config(config, spec);
  spec.attention.qkv_bias = spec.attention.o_bias = config.get_bool("attention_bias", true);
  spec.attention.sinks = true;
  spec.attention.sliding_window = config.get_int<int32_t>("sliding_window", 0);
  if (config.has("layer_types")) {
    const std::vector<std::string> types = config.get_string_list("layer_types", {});
    R3_CHECK(static_cast<int64_t>(types.size()) >= spec.num_layers, config.source(),
             ": 'layer_types' must list every layer");
    for (int64_t i = 0; i < spec.num_layers; ++i) {
      const std::string& type = types[static_cast<std::size_t>(i)];
      R3_CHECK(type == "sliding_attention" || type == "full_attention", config.source(), ": unknown layer type '",
               type, "' in 'layer_types'");
      spec.layer_sliding.push_back(type == "sliding_attention");
    }
  }
  MoeSpec& m = spec.moe;
  m.num_experts = config.get_int_any<int32_t>({"num_local_experts", "num_experts"});
  m.expert_intermediate = config.get_int<int32_t>("intermediate_size");
  m.router = RouterKind::kTopKSoftmax;
  m.router_has_bias = true;
  m.expert_layout = ExpertLayout::kGptOssFused;
  m.activation = {moe::ExpertActivation::Kind::kGptOss, static_cast<float>(config.get_double("swiglu_limit", 7.0)),
                  1.702f};
  spec.layer_is_moe.assign(static_cast<std::size_t>(spec.num_layers), true);
  spec.names.router = "router.weight";
  spec.names.router_gate_bias = "router.bias";
  return spec;
}

}  // namespace r3::models
