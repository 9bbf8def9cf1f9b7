#include "models/deepseek_v4/v4_spec.h"

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace r3::models {

namespace {

// rope_parameters.{main,compress}: plain RoPE only so far (the released checkpoints use YaRN on
// the compress layers, which must be refused rather than run as plain RoPE).
double rope_theta(const HfConfig& config, const std::string& type, double fallback, double* partial) {
  auto params = config.get_object("rope_parameters");
  if (!params) return fallback;
  auto typed = params->get_object(type);
  if (!typed) return fallback;
  const std::string kind = typed->get_string("rope_type", "default");
  R3_CHECK(kind == "default", config.source(), ": rope_parameters.", type, ".rope_type '", kind,
           "' is not supported for deepseek_v4 yet (only 'default')");
  *partial = typed->get_double("partial_rotary_factor", *partial);
  return typed->get_double("rope_theta", fallback);
}

}  // namespace

DeepseekV4Spec DeepseekV4Spec::parse(const HfConfig& c) {
  DeepseekV4Spec s;
  s.architecture = c.architecture();
  s.vocab_size = c.get_int("vocab_size");
  s.hidden_size = c.get_int("hidden_size");
  s.num_layers = c.get_int("num_hidden_layers");
  s.max_position_embeddings = c.get_int("max_position_embeddings", 0);
  s.rms_norm_eps = c.get_double("rms_norm_eps", 1e-6);
  s.tie_word_embeddings = c.get_bool("tie_word_embeddings", false);
  for (int64_t id : c.get_int_or_list("eos_token_id")) s.eos_token_ids.push_back(static_cast<int32_t>(id));

  s.num_heads = c.get_int("num_attention_heads");
  R3_CHECK(c.get_int("num_key_value_heads", 1) == 1, c.source(), ": deepseek_v4 attention has one shared KV head");
  s.head_dim = c.get_int("head_dim");
  s.q_lora_rank = c.get_int("q_lora_rank");
  s.o_groups = c.get_int("o_groups");
  s.o_lora_rank = c.get_int("o_lora_rank");
  s.sliding_window = c.get_int("sliding_window");
  double partial = c.get_double("partial_rotary_factor",
                                c.has("qk_rope_head_dim") ? static_cast<double>(c.get_int("qk_rope_head_dim")) /
                                                                static_cast<double>(s.head_dim)
                                                          : 64.0 / 512.0);
  double main_partial = partial, compress_partial = partial;
  s.main_rope_theta = rope_theta(c, "main", c.get_double("rope_theta", 10000.0), &main_partial);
  s.compress_rope_theta = rope_theta(c, "compress", c.get_double("compress_rope_theta", 160000.0), &compress_partial);
  R3_CHECK(main_partial == compress_partial, c.source(), ": different partial rotary factors per rope type");
  s.rope_dim = static_cast<int64_t>(static_cast<double>(s.head_dim) * main_partial);

  const std::vector<std::string> kinds = [&] {
    std::vector<std::string> out;
    R3_CHECK(c.has("layer_types") && c.raw()["layer_types"].is_array(), c.source(), ": 'layer_types' is required");
    for (const auto& v : c.raw()["layer_types"]) out.push_back(v.get<std::string>());
    return out;
  }();
  R3_CHECK(static_cast<int64_t>(kinds.size()) >= s.num_layers, c.source(), ": layer_types lists ", kinds.size(),
           " layers, the model has ", s.num_layers);
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
    s.csa_rate = rates->get_int("compressed_sparse_attention", 4);
    s.hca_rate = rates->get_int("heavily_compressed_attention", 128);
  }
  s.index_heads = c.get_int("index_n_heads");
  s.index_head_dim = c.get_int("index_head_dim");
  s.index_topk = c.get_int("index_topk");

  s.hc_mult = c.get_int("hc_mult", 1);
  s.hc_sinkhorn_iters = c.get_int("hc_sinkhorn_iters", 20);
  s.hc_eps = c.get_double("hc_eps", 1e-6);

  s.num_experts = c.get_int_any({"n_routed_experts", "num_local_experts"});
  s.top_k = c.get_int("num_experts_per_tok");
  s.moe_intermediate = c.get_int("moe_intermediate_size");
  s.routed_scaling_factor = c.get_double("routed_scaling_factor", 1.0);
  s.swiglu_limit = c.get_double("swiglu_limit", 0.0);
  const std::string scoring = c.get_string("scoring_func", "sqrtsoftplus");
  R3_CHECK(scoring == "sqrtsoftplus", c.source(), ": scoring_func '", scoring,
           "' is not supported for deepseek_v4 yet (only 'sqrtsoftplus')");
  std::vector<std::string> mlp_types;
  if (c.has("mlp_layer_types")) {
    for (const auto& v : c.raw()["mlp_layer_types"]) mlp_types.push_back(v.get<std::string>());
  } else {
    const int64_t hash_layers = c.get_int("num_hash_layers", 3);
    for (int64_t l = 0; l < s.num_layers; ++l) mlp_types.push_back(l < hash_layers ? "hash_moe" : "moe");
  }
  R3_CHECK(static_cast<int64_t>(mlp_types.size()) >= s.num_layers, c.source(), ": mlp_layer_types too short");
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string& t = mlp_types[static_cast<std::size_t>(l)];
    R3_CHECK(t == "moe" || t == "hash_moe", c.source(), ": unknown mlp layer type '", t, "'");
    s.hash_layer.push_back(t == "hash_moe");
  }

  R3_CHECK(s.num_heads > 0 && s.head_dim > 0 && s.hidden_size > 0, c.source(), ": sizes must be positive");
  R3_CHECK(s.rope_dim > 0 && s.rope_dim % 2 == 0 && s.rope_dim <= s.head_dim && s.rope_dim <= s.index_head_dim,
           c.source(), ": rotary dim ", s.rope_dim, " must be even and fit head_dim and index_head_dim");
  R3_CHECK(s.o_groups > 0 && (s.num_heads * s.head_dim) % s.o_groups == 0, c.source(),
           ": heads * head_dim must split into o_groups");
  R3_CHECK(s.top_k >= 1 && s.top_k <= s.num_experts, c.source(), ": num_experts_per_tok must be in [1, n_routed_experts]");
  R3_CHECK(s.hc_mult >= 1 && s.hc_sinkhorn_iters >= 1, c.source(), ": hc_mult and hc_sinkhorn_iters must be >= 1");
  R3_CHECK(s.sliding_window >= 1 && s.csa_rate >= 1 && s.hca_rate >= 1, c.source(),
           ": sliding_window and compress rates must be >= 1");
  return s;
}

}  // namespace r3::models
