#include "models/families/common_config.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "core/checked.h"

namespace r3::models {

namespace {

// Plain RoPE or YaRN from `rope_parameters` (transformers 5) or `rope_scaling` (older configs).
// Other scaled variants must not run silently as if they were plain RoPE.
ops::RopeScaling read_rope_scaling(const HfConfig& config, const HfConfig& params) {
  const std::string type = params.get_string("rope_type", params.get_string("type", "default"));
  ops::RopeScaling s;
  if (type == "default") return s;
  R3_CHECK(type == "yarn", config.source(), ": rope_type '", type,
           "' is not supported yet (default, yarn)");
  s.kind = ops::RopeScaling::Kind::kYarn;
  s.factor = params.get_double("factor");
  R3_CHECK(s.factor > 0, config.source(), ": rope scaling 'factor' must be positive, got ", s.factor);
  s.original_max_position_embeddings = params.get_int<int32_t>("original_max_position_embeddings", 0);
  s.beta_fast = params.get_double("beta_fast", 32.0);
  s.beta_slow = params.get_double("beta_slow", 1.0);
  s.truncate = params.get_bool("truncate", true);
  s.attention_factor = params.get_double("attention_factor", 0.0);
  s.mscale = params.get_double("mscale", 0.0);
  s.mscale_all_dim = params.get_double("mscale_all_dim", 0.0);
  return s;
}

double read_rope(const HfConfig& config, ops::RopeScaling& scaling) {
  double theta = config.get_double("rope_theta", 10000.0);
  if (auto params = config.get_object("rope_parameters")) {
    scaling = read_rope_scaling(config, *params);
    theta = params->get_double("rope_theta", theta);
  } else if (auto legacy = config.get_object("rope_scaling")) {
    scaling = read_rope_scaling(config, *legacy);
  }
  // theta <= 0 gives NaN or infinite frequencies: every logit would be NaN.
  R3_CHECK(theta > 0, config.source(), ": 'rope_theta' must be positive, got ", theta);
  return theta;
}

}  // namespace

void read_common_decoder_config(const HfConfig& config, DecoderSpec& spec) {
  spec.architecture = config.architecture();
  spec.vocab_size = config.get_int<int32_t>("vocab_size");
  spec.hidden_size = config.get_int<int32_t>("hidden_size");
  spec.num_layers = config.get_int_in("num_hidden_layers", 1, kMaxLayers);
  // Absent: 0, no limit of the checkpoint's own; present, at least one position.
  spec.max_position_embeddings = config.get_int_in("max_position_embeddings", 1, std::numeric_limits<int32_t>::max(), 0);
  spec.rms_norm_eps = config.get_double("rms_norm_eps", 1e-6);
  // A negative epsilon makes the norm of a small row the root of a negative number: NaN logits.
  R3_CHECK(spec.rms_norm_eps >= 0, config.source(), ": 'rms_norm_eps' must be >= 0, got ", spec.rms_norm_eps);
  spec.tie_word_embeddings = config.get_bool("tie_word_embeddings", false);
  spec.dense_intermediate = config.get_int<int32_t>("intermediate_size", 0);
  spec.eos_token_ids = config.get_int_or_list<int32_t>("eos_token_id");

  AttentionSpec& a = spec.attention;
  a.num_heads = config.get_int<int32_t>("num_attention_heads");
  a.num_kv_heads = config.get_int<int32_t>("num_key_value_heads", static_cast<int32_t>(a.num_heads));
  R3_CHECK(a.num_heads > 0, config.source(), ": num_attention_heads must be positive");
  a.head_dim = config.get_int<int32_t>("head_dim", static_cast<int32_t>(spec.hidden_size / a.num_heads));
  a.rope_theta = read_rope(config, a.rope_scaling);
  // Partial rotary (GLM-4.5): the leading head_dim * factor channels rotate.
  double partial = config.get_double("partial_rotary_factor", 1.0);
  if (auto params = config.get_object("rope_parameters")) partial = params->get_double("partial_rotary_factor", partial);
  R3_CHECK(partial > 0 && partial <= 1, config.source(), ": partial_rotary_factor must be in (0, 1], got ", partial);
  a.rotary_dim = static_cast<int64_t>(static_cast<double>(a.head_dim) * partial);

  spec.moe.top_k = config.get_int<int32_t>("num_experts_per_tok", 0);
  spec.moe.normalize_topk = config.get_bool("norm_topk_prob", false);
}

void read_latent_attention(const HfConfig& config, DecoderSpec& spec) {
  AttentionSpec& a = spec.attention;
  a.kind = AttentionKind::kLatent;
  LatentAttentionSpec& m = a.latent;
  m.q_lora_rank = config.get_int<int32_t>("q_lora_rank", 0);  // absent or null: a plain q projection
  m.kv_lora_rank = config.get_int<int32_t>("kv_lora_rank");
  m.qk_nope_head_dim = config.get_int<int32_t>("qk_nope_head_dim");
  m.qk_rope_head_dim = config.get_int<int32_t>("qk_rope_head_dim");
  m.v_head_dim = config.get_int<int32_t>("v_head_dim");
  a.num_kv_heads = a.num_heads;  // every head reads the shared latent
  a.head_dim = checked_add(m.qk_nope_head_dim, m.qk_rope_head_dim,
                           (config.source() + ": qk_nope_head_dim + qk_rope_head_dim").c_str());
  a.rotary_dim = 0;
  a.qkv_bias = a.o_bias = config.get_bool("attention_bias", false);
  R3_CHECK(m.kv_lora_rank > 0 && m.qk_nope_head_dim > 0 && m.qk_rope_head_dim > 0 && m.qk_rope_head_dim % 2 == 0 &&
               m.v_head_dim > 0,
           config.source(), ": latent attention sizes must be positive (and qk_rope_head_dim even)");
}

void read_deepseek_common(const HfConfig& config, DecoderSpec& spec) {
  read_common_decoder_config(config, spec);
  read_latent_attention(config, spec);
  R3_CHECK(config.get_bool("rope_interleave", true), config.source(),
           ": rope_interleave false is not supported yet (DeepSeek checkpoints use interleaved pairs)");
  R3_CHECK(!config.get_bool("mlp_bias", false), config.source(), ": mlp_bias true is not supported yet");
  read_deepseek_style_moe(config, 0, spec);
}

void read_deepseek_style_moe(const HfConfig& config, int64_t default_shared_experts, DecoderSpec& spec) {
  MoeSpec& moe = spec.moe;
  moe.num_experts = config.get_int_any<int32_t>({"n_routed_experts", "num_local_experts"});
  moe.expert_intermediate = config.get_int<int32_t>("moe_intermediate_size");
  // Shared experts run as one MLP of moe_intermediate_size x n_shared_experts: a product that
  // wrapped (to 0, say) would silently drop them.
  const int64_t shared = config.get_int_in("n_shared_experts", 0, kMaxExperts, default_shared_experts);
  moe.shared_expert_intermediate = checked_mul(
      moe.expert_intermediate, shared, (config.source() + ": moe_intermediate_size x n_shared_experts").c_str());
  moe.num_groups = config.get_int<int32_t>("n_group", 1);
  moe.topk_groups = config.get_int<int32_t>("topk_group", 1);
  moe.routed_scaling_factor = config.get_double("routed_scaling_factor", 1.0);
  const int64_t dense = config.get_int<int32_t>("first_k_dense_replace", 0);
  for (int64_t i = 0; i < spec.num_layers; ++i) spec.layer_is_moe.push_back(i >= dense);
  spec.names.shared_expert = "shared_experts.";
}

void use_block_sparse_moe_names(DecoderSpec& spec) {
  spec.names.moe = "block_sparse_moe.";
  spec.names.expert_gate = "w1.weight";
  spec.names.expert_up = "w3.weight";
  spec.names.expert_down = "w2.weight";
}

std::vector<bool> sparse_step_moe_layers(const HfConfig& config, int64_t num_layers,
                                         int64_t num_experts) {
  const int64_t step = config.get_int<int32_t>("decoder_sparse_step", 1);
  R3_CHECK(step >= 1, config.source(), ": decoder_sparse_step must be >= 1, got ", step);
  const std::vector<int64_t> mlp_only = config.get_int_list("mlp_only_layers", {});
  std::vector<bool> is_moe(static_cast<std::size_t>(num_layers));
  for (int64_t i = 0; i < num_layers; ++i) {
    const bool dense = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
    is_moe[static_cast<std::size_t>(i)] = !dense && num_experts > 0 && (i + 1) % step == 0;
  }
  return is_moe;
}

}  // namespace r3::models
