#include "models/kimi_k3/k3_spec.h"

#include <cmath>
#include <limits>
#include <optional>

#include "core/check.h"
#include "models/families/families.h"

namespace r3::models {

namespace {

// Features K3's config can switch off that r3 (like the reference) implements only switched on:
// refused by name rather than silently computed the other way.
void require_bool(const HfConfig& config, const char* key) {
  R3_CHECK(config.get_bool(key, true), config.source(), ": '", key,
           "' is false; Kimi K3 is implemented with it true only");
}

void require_string(const HfConfig& config, const char* key, const char* want) {
  const std::string got = config.get_string(key, want);
  R3_CHECK(got == want, config.source(), ": '", key, "' is '", got, "'; Kimi K3 is implemented with '", want,
           "' only");
}

}  // namespace

KimiK3Spec KimiK3Spec::parse(const HfConfig& config) {
  KimiK3Spec s;
  DecoderSpec& d = s.decoder;
  d = parse_kimi_linear(config);  // layer schedule, KDA / MLA sizes, routing, dense layers, names
  d.family = "kimi_k3";
  d.max_position_embeddings = config.get_int_in("max_position_embeddings", 1, std::numeric_limits<int32_t>::max(), 0);
  require_bool(config, "mla_use_nope");
  require_bool(config, "mla_use_output_gate");
  require_bool(config, "latent_moe_use_norm");
  require_string(config, "hidden_act", "situ");
  require_string(config, "moe_router_activation_func", "sigmoid");
  require_string(config, "topk_method", "noaux_tc");

  const std::optional<HfConfig> linear = config.get_object("linear_attn_config");
  // The forget gate's lower bound and the output gate's rank: the transformers names, else the
  // checkpoint's (linear_attn_config), else K3's (bounded at -5, full rank).
  double bound = -5.0;
  if (config.has("forget_gate_lower_bound")) {
    bound = config.get_double("forget_gate_lower_bound");
  } else if (linear && linear->has("gate_lower_bound")) {
    bound = linear->get_double("gate_lower_bound");
  }
  R3_CHECK(std::isfinite(bound) && bound < 0, config.source(), ": 'forget_gate_lower_bound' must be negative, got ",
           bound);
  d.linear_attention.gate_lower_bound = static_cast<float>(bound);
  if (config.has("use_full_rank_output_gate")) {
    s.full_rank_output_gate = config.get_bool("use_full_rank_output_gate", true);
  } else if (linear && linear->has("use_full_rank_gate")) {
    s.full_rank_output_gate = linear->get_bool("use_full_rank_gate", true);
  }
  R3_CHECK(d.attention.latent.q_lora_rank > 0, config.source(),
           ": 'q_lora_rank' must be set: Kimi K3's gated MLA has no plain q projection");

  s.latent_width = config.get_int<int32_t>("routed_expert_hidden_size");
  R3_CHECK(s.latent_width > 0, config.source(), ": 'routed_expert_hidden_size' must be positive, got ",
           s.latent_width);
  s.residual_block_size = config.get_int_in("attn_res_block_size", 1, d.num_layers);
  s.situ_beta = static_cast<float>(config.get_double("activation_situ_beta", 4.0));
  s.situ_linear_beta = static_cast<float>(config.get_double("activation_situ_linear_beta", 25.0));
  R3_CHECK(s.situ_beta > 0 && std::isfinite(s.situ_beta), config.source(),
           ": 'activation_situ_beta' must be positive, got ", s.situ_beta);
  R3_CHECK(s.situ_linear_beta > 0, config.source(), ": 'activation_situ_linear_beta' must be positive, got ",
           s.situ_linear_beta);
  d.moe.activation = moe::ExpertActivation::situ(s.situ_beta, s.situ_linear_beta);
  // Kimi Linear's reader defaults the scaling to Kimi Linear's 2.446; K3's default is 1.
  d.moe.routed_scaling_factor = config.get_double("routed_scaling_factor", 1.0);
  d.validate();
  return s;
}

}  // namespace r3::models
