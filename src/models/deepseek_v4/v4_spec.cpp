#include "models/deepseek_v4/v4_spec.h"

#include <limits>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/checked.h"
#include "models/families/common_config.h"

namespace r3::models {

namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// How transformers 5.17 (DeepseekV4Config and its rope utilities) reads V4's two rotaries:
//  - `rope_scaling` when it is a non-empty object, else `rope_parameters`, is the rope dict.
//  - Nested ({"main": {...}, "compress": {...}}, what transformers itself writes): each entry as
//    given; a missing rope_theta is the top-level `rope_theta` (for "compress" too), a missing
//    partial_rotary_factor the model's.
//  - Flat (the released checkpoints' `rope_scaling`): "main" is plain RoPE with `rope_theta`;
//    "compress" is the dict's type and parameters with theta `compress_rope_theta` (any rope_theta
//    in the dict is dropped) and the model's partial factor; a YaRN compress rope gets
//    attention_factor 1.0 unless the dict has that key (cos/sin are then not scaled).
//  - YaRN: `factor` is required (null: max_position_embeddings / original); original_max_position_
//    embeddings defaults to max_position_embeddings; beta_fast / beta_slow of 0 or null mean 32 / 1;
//    attention_factor null or absent (nested) is derived from factor and mscale / mscale_all_dim;
//    `truncate` is never read (transformers looks it up on the top-level dict, which for V4 only
//    holds "main" and "compress"), so the correction range is always truncated.
//  - The attention's softmax scale stays head_dim^-0.5 (no YaRN mscale there).
struct RopeRead {
  double theta = 10000.0;
  double partial = 0.0;
  ops::RopeScaling scaling;
};

ops::RopeScaling read_scaling(const HfConfig& config, const HfConfig& p, const std::string& what, bool flat,
                              int64_t max_position_embeddings) {
  const std::string kind = p.get_string("rope_type", p.get_string("type", "default"));
  ops::RopeScaling s;
  if (kind == "default") return s;
  R3_CHECK(kind == "yarn", config.source(), ": ", what, " rope_type '", kind,
           "' is not supported for deepseek_v4 (default, yarn)");
  s.kind = ops::RopeScaling::Kind::kYarn;
  R3_CHECK(p.raw().contains("factor"), config.source(), ": ", what, " YaRN needs 'factor'");
  s.original_max_position_embeddings = p.get_int<int32_t>("original_max_position_embeddings", static_cast<int32_t>(max_position_embeddings));
  R3_CHECK(s.original_max_position_embeddings > 0, config.source(), ": ", what,
           " original_max_position_embeddings must be positive");
  s.factor = p.has("factor") ? p.get_double("factor")
                             : static_cast<double>(max_position_embeddings) /
                                   static_cast<double>(s.original_max_position_embeddings);
  R3_CHECK(s.factor > 0, config.source(), ": ", what, " YaRN factor must be positive, got ", s.factor);
  const double beta_fast = p.get_double("beta_fast", 0.0), beta_slow = p.get_double("beta_slow", 0.0);
  s.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
  s.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
  s.truncate = true;
  if (p.has("attention_factor")) {
    s.attention_factor = p.get_double("attention_factor");
    R3_CHECK(s.attention_factor > 0, config.source(), ": ", what, " attention_factor must be positive");
  } else {
    s.attention_factor = flat && !p.raw().contains("attention_factor") ? 1.0 : 0.0;  // 0: derived
  }
  s.mscale = p.get_double("mscale", 0.0);
  s.mscale_all_dim = p.get_double("mscale_all_dim", 0.0);
  return s;
}

std::pair<RopeRead, RopeRead> read_ropes(const HfConfig& c, double partial, int64_t max_position_embeddings) {
  const double rope_theta = c.get_double("rope_theta", 10000.0);
  RopeRead main, compress;
  main.theta = rope_theta;
  main.partial = compress.partial = partial;
  compress.theta = c.get_double("compress_rope_theta", 160000.0);
  // theta <= 0 gives NaN or infinite frequencies: every logit would be NaN.
  R3_CHECK(rope_theta > 0, c.source(), ": 'rope_theta' must be positive, got ", rope_theta);
  R3_CHECK(compress.theta > 0, c.source(), ": 'compress_rope_theta' must be positive, got ", compress.theta);
  std::optional<HfConfig> params = c.get_object("rope_scaling");
  if (!params || params->raw().empty()) params = c.get_object("rope_parameters");
  if (!params) return {main, compress};
  const auto& raw = params->raw();
  const bool nested = raw.contains("main") && raw["main"].is_object() && raw.contains("compress") &&
                      raw["compress"].is_object();
  if (!nested) {
    compress.scaling = read_scaling(c, *params, "rope_scaling (compress rope)", true, max_position_embeddings);
    return {main, compress};
  }
  auto read_typed = [&](const std::string& name, RopeRead& out) {
    const HfConfig typed = *params->get_object(name);
    out.theta = typed.get_double("rope_theta", rope_theta);
    R3_CHECK(out.theta > 0, c.source(), ": rope_parameters.", name, " 'rope_theta' must be positive, got ", out.theta);
    out.partial = typed.get_double("partial_rotary_factor", partial);
    out.scaling = read_scaling(c, typed, "rope_parameters." + name, false, max_position_embeddings);
  };
  read_typed("main", main);
  read_typed("compress", compress);
  return {main, compress};
}

// Legacy per-layer compress ratios (released config.json) -> layer types, as transformers maps them.
std::string layer_type_of_ratio(const HfConfig& c, int64_t ratio) {
  switch (ratio) {
    case 0: return "sliding_attention";
    case 4: return "compressed_sparse_attention";
    case 128: return "heavily_compressed_attention";
    default: R3_FAIL(c.source(), ": compress_ratios value ", ratio, " has no layer type (0, 4 or 128)");
  }
}

}  // namespace

DeepseekV4Spec DeepseekV4Spec::parse(const HfConfig& c) {
  DeepseekV4Spec s;
  s.architecture = c.architecture();
  s.vocab_size = c.get_int<int32_t>("vocab_size");
  s.hidden_size = c.get_int<int32_t>("hidden_size");
  s.num_layers = c.get_int_in("num_hidden_layers", 1, kMaxLayers);
  s.max_position_embeddings = c.get_int_in("max_position_embeddings", 1, kMaxInt32, 1048576);  // transformers' default
  s.rms_norm_eps = c.get_double("rms_norm_eps", 1e-6);
  R3_CHECK(s.rms_norm_eps >= 0, c.source(), ": 'rms_norm_eps' must be >= 0, got ", s.rms_norm_eps);
  s.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  s.eos_token_ids = c.get_int_or_list<int32_t>("eos_token_id");

  s.num_heads = c.get_int<int32_t>("num_attention_heads");
  R3_CHECK(c.get_int<int32_t>("num_key_value_heads", 1) == 1, c.source(), ": deepseek_v4 attention has one shared KV head");
  s.head_dim = c.get_int<int32_t>("head_dim");
  s.q_lora_rank = c.get_int<int32_t>("q_lora_rank");
  s.o_groups = c.get_int<int32_t>("o_groups");
  s.o_lora_rank = c.get_int<int32_t>("o_lora_rank");
  s.sliding_window = c.get_int_in("sliding_window", 1, kMaxInt32);
  double partial = c.get_double("partial_rotary_factor",
                                c.has("qk_rope_head_dim") ? static_cast<double>(c.get_int<int32_t>("qk_rope_head_dim")) /
                                                                static_cast<double>(s.head_dim)
                                                          : 64.0 / 512.0);
  const auto [main, compress] = read_ropes(c, partial, s.max_position_embeddings);
  R3_CHECK(main.partial == compress.partial, c.source(), ": different partial rotary factors per rope type");
  s.main_rope_theta = main.theta;
  s.compress_rope_theta = compress.theta;
  s.main_rope_scaling = main.scaling;
  s.compress_rope_scaling = compress.scaling;
  s.rope_dim = static_cast<int64_t>(static_cast<double>(s.head_dim) * main.partial);

  // layer_types, else the legacy per-layer compress_ratios, else transformers' default schedule
  // (two HCA layers, then HCA and CSA alternating).
  const std::vector<std::string> kinds = [&] {
    std::vector<std::string> out;
    if (c.has("layer_types")) {
      out = c.get_string_list("layer_types", {});
    } else if (c.has("compress_ratios")) {
      for (int64_t r : c.get_int_list<int32_t>("compress_ratios", {})) out.push_back(layer_type_of_ratio(c, r));
    } else {
      for (int64_t l = 0; l < s.num_layers; ++l) {
        out.push_back(l >= 2 && (l - 2) % 2 == 1 ? "compressed_sparse_attention" : "heavily_compressed_attention");
      }
    }
    return out;
  }();
  R3_CHECK(static_cast<int64_t>(kinds.size()) >= s.num_layers, c.source(), ": 'layer_types' lists ", kinds.size(),
           " layers, 'num_hidden_layers' is ", s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string& k = kinds[static_cast<std::size_t>(l)];
    if (k == "sliding_attention") {
      s.layer_kinds.push_back(V4AttentionKind::kSliding);
    } else if (k == "compressed_sparse_attention") {
      s.layer_kinds.push_back(V4AttentionKind::kCompressed);
    } else if (k == "heavily_compressed_attention") {
      s.layer_kinds.push_back(V4AttentionKind::kHeavy);
    } else {
      R3_FAIL(c.source(), ": unknown layer type '", k, "' at layer ", l);
    }
  }
  if (auto rates = c.get_object("compress_rates")) {
    s.csa_rate = rates->get_int<int32_t>("compressed_sparse_attention", 4);
    s.hca_rate = rates->get_int<int32_t>("heavily_compressed_attention", 128);
  }
  s.csa_rate = c.get_int<int32_t>("compress_rate_csa", static_cast<int32_t>(s.csa_rate));  // legacy top-level overrides
  s.hca_rate = c.get_int<int32_t>("compress_rate_hca", static_cast<int32_t>(s.hca_rate));
  R3_CHECK(s.csa_rate >= 1 && s.hca_rate >= 1, c.source(), ": the compression rates must be >= 1, got ", s.csa_rate,
           " (compressed_sparse_attention) and ", s.hca_rate, " (heavily_compressed_attention)");
  s.index_heads = c.get_int_in("index_n_heads", 1, kMaxInt32);
  s.index_head_dim = c.get_int_in("index_head_dim", 1, kMaxInt32);
  s.index_topk = c.get_int_in("index_topk", 1, kMaxInt32);

  // Released checkpoints use 4 streams and 20 Sinkhorn iterations. Each iteration normalises an
  // hc_mult x hc_mult matrix per token and layer, and converges in a few tens of iterations: 1000
  // is far past any useful count while a hostile 1e12 would never finish.
  s.hc_mult = c.get_int_in("hc_mult", 1, kMaxHcMult, 1);
  s.hc_sinkhorn_iters = c.get_int_in("hc_sinkhorn_iters", 1, kMaxSinkhornIters, 20);
  s.hc_eps = c.get_double_in("hc_eps", 0.0, 1.0, 1e-6);

  s.num_experts = c.get_int_any<int32_t>({"n_routed_experts", "num_local_experts"});
  s.top_k = c.get_int<int32_t>("num_experts_per_tok");
  s.moe_intermediate = c.get_int<int32_t>("moe_intermediate_size");
  s.routed_scaling_factor = c.get_double_in("routed_scaling_factor", 0.0, 1e6, 1.0);
  s.swiglu_limit = c.get_double_in("swiglu_limit", 0.0, 1e30, 0.0);
  const std::string scoring = c.get_string("scoring_func", "sqrtsoftplus");
  R3_CHECK(scoring == "sqrtsoftplus", c.source(), ": scoring_func '", scoring,
           "' is not supported for deepseek_v4 yet (only 'sqrtsoftplus')");
  std::vector<std::string> mlp_types;
  if (c.has("mlp_layer_types")) {
    mlp_types = c.get_string_list("mlp_layer_types", {});
  } else {
    const int64_t hash_layers = c.get_int<int32_t>("num_hash_layers", 3);
    for (int64_t l = 0; l < s.num_layers; ++l) mlp_types.push_back(l < hash_layers ? "hash_moe" : "moe");
  }
  R3_CHECK(static_cast<int64_t>(mlp_types.size()) >= s.num_layers, c.source(), ": 'mlp_layer_types' lists ",
           mlp_types.size(), " layers, 'num_hidden_layers' is ", s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string& t = mlp_types[static_cast<std::size_t>(l)];
    R3_CHECK(t == "moe" || t == "hash_moe", c.source(), ": unknown mlp layer type '", t, "'");
    s.hash_layer.push_back(t == "hash_moe");
  }

  R3_CHECK(s.num_heads > 0 && s.head_dim > 0 && s.hidden_size > 0, c.source(), ": sizes must be positive");
  R3_CHECK(s.rope_dim > 0 && s.rope_dim % 2 == 0 && s.rope_dim <= s.head_dim && s.rope_dim <= s.index_head_dim,
           c.source(), ": rotary dim ", s.rope_dim, " must be even and fit head_dim and index_head_dim");
  const int64_t q_width = checked_mul(s.num_heads, s.head_dim, (c.source() + ": num_attention_heads x head_dim").c_str());
  R3_CHECK(s.o_groups > 0 && q_width % s.o_groups == 0, c.source(),
           ": heads * head_dim must split into o_groups");
  R3_CHECK(s.top_k >= 1 && s.top_k <= s.num_experts, c.source(), ": num_experts_per_tok must be in [1, n_routed_experts]");
  R3_CHECK(s.sliding_window >= 1 && s.csa_rate >= 1 && s.hca_rate >= 1, c.source(),
           ": sliding_window and compress rates must be >= 1");
  return s;
}

ops::RopeFrequencies DeepseekV4Spec::main_rope() const {
  return ops::rope_frequencies(rope_dim, main_rope_theta, main_rope_scaling, max_position_embeddings);
}

ops::RopeFrequencies DeepseekV4Spec::compress_rope() const {
  return ops::rope_frequencies(rope_dim, compress_rope_theta, compress_rope_scaling, max_position_embeddings);
}

}  // namespace r3::models
