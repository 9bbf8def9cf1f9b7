// Kimi Linear (KimiLinearForCausalLM, transformers' kimi_linear): Kimi Delta Attention layers and
// DeepSeek-style multi-head latent attention layers without position encoding, given per layer by
// `layer_types` (or `linear_attn_config`'s 1-indexed kda_layers / full_attn_layers); sigmoid routing
// with correction bias and groups, shared experts, dense layers where `mlp_layer_types` says
// "dense". Experts are named w1 (gate) / w3 (up) / w2 (down) under block_sparse_moe, as Mixtral's.
#include <optional>

#include "core/check.h"
#include "core/checked.h"
#include "models/families/common_config.h"
#include "models/families/families.h"

namespace r3::models {

namespace {

// transformers' KimiLinearConfig: layer_types, else from linear_attn_config's 1-indexed lists,
// else full attention every 4th layer (from the 5th) and KDA elsewhere.
std::vector<std::string> layer_types(const HfConfig& config, const std::optional<HfConfig>& linear, int64_t layers) {
  std::vector<std::string> types = config.get_string_list("layer_types", {});
  if (!types.empty()) return types;
  types.assign(static_cast<std::size_t>(layers), "");
  if (linear && linear->has("full_attn_layers") && linear->has("kda_layers")) {
    for (const auto& [key, kind] : {std::pair{"full_attn_layers", "full_attention"}, {"kda_layers", "linear_attention"}}) {
      for (const int64_t one_based : linear->get_int_list<int64_t>(key, {})) {
        R3_CHECK(one_based >= 1 && one_based <= layers, config.source(), ": linear_attn_config ", key, " names layer ",
                 one_based, " of ", layers, " (1-indexed)");
        types[static_cast<std::size_t>(one_based - 1)] = kind;
      }
    }
    return types;
  }
  for (int64_t i = 0; i < layers; ++i) types[static_cast<std::size_t>(i)] = i > 0 && i % 4 == 0 ? "full_attention" : "linear_attention";
  return types;
}

}  // namespace

DecoderSpec parse_kimi_linear(const HfConfig& config) {
  DecoderSpec spec;
  spec.family = "kimi_linear";
  read_common_decoder_config(config, spec);
  spec.max_position_embeddings = config.get_int<int32_t>("model_max_length", 0);
  // The full-attention layers: DeepSeek-V2's latent attention, never rotated.
  read_latent_attention(config, spec);
  spec.attention.rotary = false;
  // The linear-attention layers.
  const std::optional<HfConfig> linear = config.get_object("linear_attn_config");
  auto linear_int = [&](const char* nested, const char* top, int32_t fallback) {
    if (linear && linear->has(nested)) return static_cast<int64_t>(linear->get_int<int32_t>(nested));
    return static_cast<int64_t>(config.get_int<int32_t>(top, fallback));
  };
  spec.linear_attention.num_heads = linear_int("num_heads", "linear_num_heads", 32);
  spec.linear_attention.head_dim = linear_int("head_dim", "linear_head_dim", 128);
  spec.linear_attention.conv_kernel = linear_int("short_conv_kernel_size", "linear_conv_kernel_dim", 4);
  const std::vector<std::string> types = layer_types(config, linear, spec.num_layers);
  R3_CHECK(static_cast<int64_t>(types.size()) == spec.num_layers, config.source(), ": ", types.size(),
           " layer types for ", spec.num_layers, " layers");
  for (const std::string& type : types) {
    R3_CHECK(type == "linear_attention" || type == "full_attention", config.source(), ": layer type '", type,
             "' (expected linear_attention or full_attention)");
    spec.layer_attention.push_back(type == "linear_attention" ? LayerAttention::kKimiDelta : LayerAttention::kDefault);
  }
  // MoE: DeepSeek-V3's routing under Kimi's names.
  MoeSpec& moe = spec.moe;
  moe.router = RouterKind::kSigmoidGroupTopK;
  moe.num_experts = config.get_int_any<int32_t>({"num_experts", "num_local_experts"});
  moe.top_k = config.get_int_any<int32_t>({"num_experts_per_token", "num_experts_per_tok"});
  moe.normalize_topk = config.get_bool("moe_renormalize", true);
  moe.expert_intermediate = config.get_int<int32_t>("moe_intermediate_size");
  const int64_t shared = config.get_int_in("num_shared_experts", 0, kMaxExperts, 1);
  moe.shared_expert_intermediate = checked_mul(moe.expert_intermediate, shared,
                                              (config.source() + ": moe_intermediate_size x num_shared_experts").c_str());
  moe.num_groups = config.get_int<int32_t>("num_expert_group", 1);
  moe.topk_groups = config.get_int<int32_t>("topk_group", 1);
  moe.routed_scaling_factor = config.get_double("routed_scaling_factor", 2.446);
  std::vector<std::string> mlp = config.get_string_list("mlp_layer_types", {});
  if (mlp.empty()) {
    const int64_t dense = config.get_int<int32_t>("first_k_dense_replace", 1);
    for (int64_t i = 0; i < spec.num_layers; ++i) mlp.push_back(i < dense ? "dense" : "sparse");
  }
  R3_CHECK(static_cast<int64_t>(mlp.size()) == spec.num_layers, config.source(), ": ", mlp.size(),
           " mlp_layer_types for ", spec.num_layers, " layers");
  for (const std::string& type : mlp) {
    R3_CHECK(type == "dense" || type == "sparse", config.source(), ": mlp layer type '", type,
             "' (expected dense or sparse)");
    spec.layer_is_moe.push_back(type == "sparse");
  }
  use_block_sparse_moe_names(spec);
  spec.names.dense_mlp = "block_sparse_moe.";
  spec.names.shared_expert = "shared_experts.";
  return spec;
}

}  // namespace r3::models
