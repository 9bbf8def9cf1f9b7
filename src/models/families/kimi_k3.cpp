// Kimi K3 (KimiK3ForCausalLM): checkpoint names as public K3 ports load them, text model under
// `model.`: KDA layers (q/k/v_proj, q/k/v_conv1d, f_a_proj, f_b_proj, b_proj, g_proj, A_log
// [1, 1, H, 1], dt_bias [H * D], o_norm, o_proj), gated MLA layers (Kimi Linear's MLA plus g_proj),
// dense `mlp.{gate,up,down}_proj`, MoE under block_sparse_moe (gate, gate.e_score_correction_bias,
// experts.{e}.w1/w3/w2 in the latent width, routed_expert_{down_proj,norm,up_proj},
// shared_experts), and the attention residuals' self_attention_res_{proj,norm},
// mlp_res_{proj,norm} per layer and model.output_attn_res_{proj,norm}.
#include "models/families/families.h"

#include "models/kda_attention.h"
#include "models/kimi_k3/k3_spec.h"
#include "models/kimi_k3/kimi_k3_model.h"
#include "models/kimi_k3/latent_moe.h"
#include "models/mla_attention.h"
#include "moe/moe_path.h"

namespace r3::models {

namespace {

class K3LayerLoader {
 public:
  K3LayerLoader(const KimiK3Spec& spec, ParameterLoader& params, const LoadOptions& options, int64_t layer)
      : s_(spec), d_(spec.decoder), params_(params), options_(options), layer_(layer),
        prefix_(expand_name(d_.names.layer, layer)) {}

  Tensor load(const std::string& name, const Shape& shape, int64_t expert = -1) const {
    return params_.load_f32(prefix_ + name, shape, {layer_, expert});
  }
  Tensor load_matrix(const std::string& name, const Shape& shape, int64_t expert = -1) const {
    return params_.load_weight(prefix_ + name, shape, {layer_, expert});
  }

  std::unique_ptr<AttentionResidual> residual(const std::string& name) const {
    const int64_t h = d_.hidden_size;
    return std::make_unique<AttentionResidual>(load(name + "_proj.weight", {1, h}), load(name + "_norm.weight", {h}),
                                               static_cast<float>(d_.rms_norm_eps));
  }

  std::unique_ptr<AttentionLayer> kda() const {
    const LinearAttentionSpec& l = d_.linear_attention;
    KdaSpec kda{d_.hidden_size, l.num_heads, l.head_dim, l.conv_kernel, static_cast<float>(d_.rms_norm_eps),
                l.gate_lower_bound};
    kda.full_rank_output_gate = s_.full_rank_output_gate;
    return std::make_unique<KdaAttention>(kda, KdaAttention::load(params_, prefix_ + d_.names.attention, kda, layer_));
  }

  std::unique_ptr<AttentionLayer> gated_mla() const {
    const AttentionSpec& a = d_.attention;
    const LatentAttentionSpec& m = a.latent;
    const std::string p = d_.names.attention;
    const int64_t h = d_.hidden_size, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    MlaWeights w;
    w.q_a_proj = load_matrix(p + "q_a_proj.weight", {m.q_lora_rank, h});
    w.q_a_norm = load(p + "q_a_layernorm.weight", {m.q_lora_rank});
    w.q_b_proj = load_matrix(p + "q_b_proj.weight", {a.num_heads * qk, m.q_lora_rank});
    w.kv_a_proj = load_matrix(p + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, h});
    w.kv_a_norm = load(p + "kv_a_layernorm.weight", {m.kv_lora_rank});
    w.kv_b_proj = load(p + "kv_b_proj.weight", {a.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
    w.o_proj = load_matrix(p + "o_proj.weight", {h, a.num_heads * m.v_head_dim});
    w.g_proj = load_matrix(p + "g_proj.weight", {a.num_heads * m.v_head_dim, h});
    // The key part shared across heads is never rotated (mla_use_nope): every angle 0 leaves it,
    // and q's matching part, exactly as they are.
    const ops::RopeFrequencies rope{std::vector<float>(static_cast<std::size_t>(m.qk_rope_head_dim / 2), 0.0f), 1.0f};
    return std::make_unique<MlaAttention>(a, s_.latent_norm_eps, std::move(w), rope);
  }

  SituMlp mlp(const std::string& p, int64_t width) const {
    const int64_t h = d_.hidden_size;
    return SituMlp(load_matrix(p + "gate_proj.weight", {width, h}), load_matrix(p + "up_proj.weight", {width, h}),
                   load_matrix(p + "down_proj.weight", {h, width}), d_.moe.activation);
  }

  std::unique_ptr<FeedForward> moe(int64_t moe_layer_id) const {
    const MoeSpec& m = d_.moe;
    const std::string p = "block_sparse_moe.";
    const int64_t h = d_.hidden_size, latent = s_.latent_width, width = m.expert_intermediate;
    std::vector<moe::SwigluExpertWeights> experts;
    for (int64_t e = 0; e < m.num_experts; ++e) {
      const std::string q = p + "experts." + std::to_string(e) + ".";
      experts.push_back({load_matrix(q + "w1.weight", {width, latent}, e), load_matrix(q + "w3.weight", {width, latent}, e),
                         load_matrix(q + "w2.weight", {latent, width}, e)});
    }
    auto physical = std::make_shared<moe::PhysicalExperts>(
        std::move(experts), moe::ExpertPlacement::initial(m.num_experts, options_.eplb.redundant_experts), m.activation);
    Tensor bias = load(p + "gate.e_score_correction_bias", {m.num_experts});
    auto rule = std::make_shared<moe::SigmoidGroupTopK>(
        m.top_k, std::vector<float>(bias.data<float>(), bias.data<float>() + m.num_experts), m.num_groups,
        m.topk_groups, m.normalize_topk, static_cast<float>(m.routed_scaling_factor));
    auto block = moe::make_moe_block(options_.moe_path, moe_layer_id, load(p + "gate.weight", {m.num_experts, h}),
                                     std::move(rule), std::move(physical));
    LatentMoeWeights w{load_matrix(p + "routed_expert_down_proj.weight", {latent, h}),
                       load(p + "routed_expert_norm.weight", {latent}),
                       load_matrix(p + "routed_expert_up_proj.weight", {h, latent})};
    return std::make_unique<LatentMoeFeedForward>(std::move(block), std::move(w), static_cast<float>(d_.rms_norm_eps),
                                                  mlp(p + "shared_experts.", m.shared_expert_intermediate));
  }

 private:
  const KimiK3Spec& s_;
  const DecoderSpec& d_;
  ParameterLoader& params_;
  const LoadOptions& options_;
  int64_t layer_;
  std::string prefix_;
};

}  // namespace

std::unique_ptr<CausalLM> load_kimi_k3(const HfConfig& config, ParameterLoader& params, const LoadOptions& options) {
  const KimiK3Spec s = KimiK3Spec::parse(config);
  const DecoderSpec& d = s.decoder;
  options.eplb.validate(d.moe.num_experts);
  R3_CHECK(d.moe.shared_expert_intermediate > 0, config.source(),
           ": 'num_shared_experts' must be positive: Kimi K3's MoE layers have shared experts");
  const std::string last_layer = expand_name(d.names.layer + d.names.input_norm, d.num_layers - 1);
  R3_CHECK(params.contains(last_layer), config.source(), ": 'num_hidden_layers' is ", d.num_layers,
           " but the checkpoint has no tensor '", last_layer, "'");
  const int64_t h = d.hidden_size;
  Tensor embed = params.load_weight(d.names.embed, {d.vocab_size, h});
  std::vector<KimiK3Layer> layers;
  int64_t moe_layer_id = 0;
  for (int64_t l = 0; l < d.num_layers; ++l) {
    const K3LayerLoader loader(s, params, options, l);
    KimiK3Layer layer;
    layer.input_norm = loader.load(d.names.input_norm, {h});
    layer.post_attention_norm = loader.load(d.names.post_attention_norm, {h});
    layer.pre_attention_mix = loader.residual("self_attention_res");
    layer.post_attention_mix = loader.residual("mlp_res");
    const bool kda = d.layer_attention[static_cast<std::size_t>(l)] == LayerAttention::kKimiDelta;
    layer.attention = kda ? loader.kda() : loader.gated_mla();
    if (d.layer_is_moe[static_cast<std::size_t>(l)]) {
      layer.feed_forward = loader.moe(moe_layer_id++);
    } else {
      layer.feed_forward = std::make_unique<SituFeedForward>(loader.mlp("mlp.", d.dense_intermediate));
    }
    layers.push_back(std::move(layer));
  }
  auto output_mix = std::make_unique<AttentionResidual>(params.load_f32("model.output_attn_res_proj.weight", {1, h}),
                                                        params.load_f32("model.output_attn_res_norm.weight", {h}),
                                                        static_cast<float>(d.rms_norm_eps));
  Tensor final_norm = params.load_f32(d.names.final_norm, {h});
  Tensor lm_head = d.tie_word_embeddings ? embed : params.load_weight(d.names.lm_head, {d.vocab_size, h});

  ModelInfo info;
  info.family = d.family;
  info.architecture = d.architecture;
  info.vocab_size = d.vocab_size;
  info.hidden_size = h;
  info.num_layers = d.num_layers;
  info.max_position_embeddings = d.max_position_embeddings;
  info.moe_layers = d.moe_layers();
  info.num_experts = d.moe.num_experts;
  info.top_k = d.moe.top_k;
  info.eos_token_ids = d.eos_token_ids;
  auto model = std::make_unique<KimiK3Model>(std::move(info), static_cast<float>(d.rms_norm_eps),
                                             s.residual_block_size, std::move(embed), std::move(layers),
                                             std::move(output_mix), std::move(final_norm), std::move(lm_head));
  model->set_eplb_options(options.eplb);
  return model;
}

}  // namespace r3::models
