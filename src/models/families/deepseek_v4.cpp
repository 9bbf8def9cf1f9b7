// DeepSeek-V4 (DeepseekV4ForCausalLM): checkpoint names as published (attn.wq_a, attn.compressor.*,
// attn.indexer.*, ffn.gate.tid2eid, ffn.experts.N.w1/w2/w3, hc_attn_*, hc_head, head.weight).
#include "models/families/families.h"

#include <cmath>

#include "models/deepseek_v4/deepseek_v4_model.h"
#include "moe/moe_path.h"
#include "moe/routing_rule.h"

namespace r3::models {

std::unique_ptr<CausalLM> load_deepseek_v4(const HfConfig& config, ParameterLoader& params, const LoadOptions& options) {
  const DeepseekV4Spec s = DeepseekV4Spec::parse(config);
  options.eplb.validate(s.num_experts);
  // The layer count comes from config.json: check the checkpoint has the last layer before
  // loading that many.
  const std::string last_layer = "model.layers." + std::to_string(s.num_layers - 1) + ".attn_norm.weight";
  R3_CHECK(params.contains(last_layer), config.source(), ": 'num_hidden_layers' is ", s.num_layers,
           " but the checkpoint has no tensor '", last_layer, "'");
  const int64_t h = s.hidden_size, d = s.head_dim, hc = s.hc_mult, mix = (2 + hc) * hc;  // bounded in parse
  const float eps = static_cast<float>(s.rms_norm_eps), hc_eps = static_cast<float>(s.hc_eps);
  // Plain RoPE or YaRN (frequencies and cos/sin scaling) for each of the two rotaries.
  auto make_rotary = [&](const ops::RopeFrequencies& f) {
    return std::make_unique<ops::TrailingInterleavedRotary>(s.rope_dim, f.inv_freq, f.attention_scaling);
  };
  auto main_rotary = make_rotary(s.main_rope());
  auto compress_rotary = make_rotary(s.compress_rope());
  const float limit = s.swiglu_limit > 0 ? static_cast<float>(s.swiglu_limit) : INFINITY;

  std::vector<V4Layer> layers;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto load = [&](const std::string& name, const Shape& shape, int64_t expert = -1) {
      return params.load_f32(p + name, shape, {l, expert});
    };
    V4Layer layer;
    layer.attn_norm = load("attn_norm.weight", {h});
    layer.ffn_norm = load("ffn_norm.weight", {h});
    layer.attn_hc = std::make_unique<HyperConnection>(load("hc_attn_fn", {mix, hc * h}), load("hc_attn_base", {mix}),
                                                      load("hc_attn_scale", {3}), hc, s.hc_sinkhorn_iters, hc_eps, eps);
    layer.ffn_hc = std::make_unique<HyperConnection>(load("hc_ffn_fn", {mix, hc * h}), load("hc_ffn_base", {mix}),
                                                     load("hc_ffn_scale", {3}), hc, s.hc_sinkhorn_iters, hc_eps, eps);

    V4AttentionWeights w;
    w.wq_a = load("attn.wq_a.weight", {s.q_lora_rank, h});
    w.q_norm = load("attn.q_norm.weight", {s.q_lora_rank});
    w.wq_b = load("attn.wq_b.weight", {s.num_heads * d, s.q_lora_rank});
    w.wkv = load("attn.wkv.weight", {d, h});
    w.kv_norm = load("attn.norm.weight", {d});
    w.wo_a = load("attn.wo_a.weight", {s.o_groups * s.o_lora_rank, s.num_heads * d / s.o_groups});
    w.wo_b = load("attn.wo_b.weight", {h, s.o_groups * s.o_lora_rank});
    w.sinks = load("attn.attn_sink", {s.num_heads});
    const V4AttentionKind kind = s.layer_kinds[static_cast<std::size_t>(l)];
    std::optional<WindowCompressor> compressor, indexer;
    if (kind != V4AttentionKind::kSliding) {
      const bool csa = kind == V4AttentionKind::kCompressed;
      const int64_t rate = csa ? s.csa_rate : s.hca_rate, width = (csa ? 2 : 1) * d;
      compressor.emplace(load("attn.compressor.wkv.weight", {width, h}), load("attn.compressor.wgate.weight", {width, h}),
                         load("attn.compressor.ape", {rate, width}), load("attn.compressor.norm.weight", {d}), rate, csa,
                         eps, *compress_rotary);
      if (csa) {
        const int64_t di = s.index_head_dim;
        indexer.emplace(load("attn.indexer.compressor.wkv.weight", {2 * di, h}),
                        load("attn.indexer.compressor.wgate.weight", {2 * di, h}),
                        load("attn.indexer.compressor.ape", {rate, 2 * di}),
                        load("attn.indexer.compressor.norm.weight", {di}), rate, true, eps, *compress_rotary);
        w.index_wq_b = load("attn.indexer.wq_b.weight", {s.index_heads * di, s.q_lora_rank});
        w.index_weights_proj = load("attn.indexer.weights_proj.weight", {s.index_heads, h});
      }
    }
    const auto& rotary = kind == V4AttentionKind::kSliding ? *main_rotary : *compress_rotary;
    layer.attention = std::make_unique<V4Attention>(s, l, std::move(w), std::move(compressor), std::move(indexer),
                                                    rotary, *compress_rotary);

    const int64_t width = s.moe_intermediate;
    std::vector<moe::SwigluExpertWeights> experts;
    for (int64_t e = 0; e < s.num_experts; ++e) {
      const std::string q = "ffn.experts." + std::to_string(e) + ".";
      experts.push_back({load(q + "w1.weight", {width, h}, e), load(q + "w3.weight", {width, h}, e),
                         load(q + "w2.weight", {h, width}, e)});
    }
    std::shared_ptr<moe::RoutingRule> rule;
    const auto scaling = static_cast<float>(s.routed_scaling_factor);
    if (s.hash_layer[static_cast<std::size_t>(l)]) {
      const std::string table = p + "ffn.gate.tid2eid";
      rule = std::make_shared<moe::SqrtSoftplusHash>(params.load_raw(table, {s.vocab_size, s.top_k}, {l, -1}), s.num_experts,
                                                     scaling, table);
    } else {
      Tensor bias = load("ffn.gate.bias", {s.num_experts});
      rule = std::make_shared<moe::SqrtSoftplusTopK>(
          s.top_k, std::vector<float>(bias.data<float>(), bias.data<float>() + s.num_experts), scaling);
    }
    auto physical = std::make_shared<moe::PhysicalExperts>(
        std::move(experts), moe::ExpertPlacement::initial(s.num_experts, options.eplb.redundant_experts),
        moe::ExpertActivation{moe::ExpertActivation::Kind::kSwiglu, limit, 0.0f});
    layer.moe = moe::make_moe_block(options.moe_path, l, load("ffn.gate.weight", {s.num_experts, h}), rule,
                                    std::move(physical));
    layer.shared_expert = std::make_unique<SwigluMlp>(load("ffn.shared_experts.w1.weight", {width, h}),
                                                      load("ffn.shared_experts.w3.weight", {width, h}),
                                                      load("ffn.shared_experts.w2.weight", {h, width}), limit);
    layers.push_back(std::move(layer));
  }

  Tensor embed = params.load_f32("model.embed_tokens.weight", {s.vocab_size, h});
  auto head = std::make_unique<HyperHead>(params.load_f32("model.hc_head.hc_fn", {hc, hc * h}),
                                          params.load_f32("model.hc_head.hc_base", {hc}),
                                          params.load_f32("model.hc_head.hc_scale", {1}), hc, hc_eps, eps);
  Tensor final_norm = params.load_f32("model.norm.weight", {h});
  Tensor lm_head = s.tie_word_embeddings ? embed : params.load_f32("head.weight", {s.vocab_size, h});

  ModelInfo info;
  info.family = "deepseek_v4";
  info.architecture = s.architecture;
  info.vocab_size = s.vocab_size;
  info.hidden_size = h;
  info.num_layers = s.num_layers;
  info.max_position_embeddings = s.max_position_embeddings;
  for (int64_t l = 0; l < s.num_layers; ++l) info.moe_layers.push_back(l);
  info.num_experts = s.num_experts;
  info.top_k = s.top_k;
  info.eos_token_ids = s.eos_token_ids;
  auto model = std::make_unique<DeepseekV4Model>(s, std::move(info), std::move(embed), std::move(layers),
                                                 std::move(head), std::move(final_norm), std::move(lm_head),
                                                 std::move(main_rotary), std::move(compress_rotary));
  model->set_eplb_options(options.eplb);
  return model;
}

}  // namespace r3::models
