#include "models/decoder_builder.h"

#include "models/kda_attention.h"
#include "models/mla_attention.h"
#include "moe/moe_path.h"

namespace r3::models {

namespace {

class LayerLoader {
 public:
  LayerLoader(const DecoderSpec& spec, ParameterLoader& params, const LoadOptions& options, int64_t layer)
      : spec_(spec), params_(params), options_(options), layer_(layer), prefix_(expand_name(spec.names.layer, layer)) {}

  // Small tensors (norms, biases, router gates) and weights the model reads element by element:
  // float32.
  Tensor load(const std::string& name, const Shape& shape, int64_t expert = -1) const {
    return params_.load_f32(expand_name(prefix_ + name, layer_, expert), shape, {layer_, expert});
  }
  // Projection weights, consumed only by the matmul kernels: kept in the checkpoint's dtype.
  Tensor load_matrix(const std::string& name, const Shape& shape, int64_t expert = -1) const {
    return params_.load_weight(expand_name(prefix_ + name, layer_, expert), shape, {layer_, expert});
  }

  ops::RopeFrequencies rope_frequencies(int64_t rotary_dim) const {
    return ops::rope_frequencies(rotary_dim, spec_.attention.rope_theta, spec_.attention.rope_scaling,
                                 spec_.max_position_embeddings);
  }

  std::unique_ptr<AttentionLayer> attention() const {
    if (!spec_.layer_attention.empty() &&
        spec_.layer_attention[static_cast<std::size_t>(layer_)] == LayerAttention::kKimiDelta) {
      return kimi_delta_attention();
    }
    if (spec_.attention.kind == AttentionKind::kLatent) return latent_attention();
    return std::make_unique<GqaAttention>(grouped_query_attention());
  }

  std::unique_ptr<AttentionLayer> kimi_delta_attention() const {
    const LinearAttentionSpec& l = spec_.linear_attention;
    const KdaSpec kda{spec_.hidden_size, l.num_heads, l.head_dim, l.conv_kernel, static_cast<float>(spec_.rms_norm_eps),
                      l.gate_lower_bound};
    return std::make_unique<KdaAttention>(kda, KdaAttention::load(params_, prefix_ + spec_.names.attention, kda, layer_));
  }

  std::unique_ptr<AttentionLayer> latent_attention() const {
    const AttentionSpec& a = spec_.attention;
    const LatentAttentionSpec& m = a.latent;
    const std::string p = spec_.names.attention;
    const int64_t h = spec_.hidden_size, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    MlaWeights w;
    if (m.q_lora_rank == 0) {
      w.q_proj = load_matrix(p + "q_proj.weight", {a.num_heads * qk, h});
    } else {
      w.q_a_proj = load_matrix(p + "q_a_proj.weight", {m.q_lora_rank, h});
      w.q_a_norm = load(p + "q_a_layernorm.weight", {m.q_lora_rank});
      w.q_b_proj = load_matrix(p + "q_b_proj.weight", {a.num_heads * qk, m.q_lora_rank});
      if (a.qkv_bias) w.q_a_bias = load(p + "q_a_proj.bias", {m.q_lora_rank});
    }
    w.kv_a_proj = load_matrix(p + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, h});
    w.kv_a_norm = load(p + "kv_a_layernorm.weight", {m.kv_lora_rank});
    w.kv_b_proj = load(p + "kv_b_proj.weight", {a.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
    w.o_proj = load_matrix(p + "o_proj.weight", {h, a.num_heads * m.v_head_dim});
    if (a.qkv_bias) w.kv_a_bias = load(p + "kv_a_proj_with_mqa.bias", {m.kv_lora_rank + m.qk_rope_head_dim});
    if (a.o_bias) w.o_bias = load(p + "o_proj.bias", {h});
    ops::RopeFrequencies rope = rope_frequencies(m.qk_rope_head_dim);
    // No position encoding: every angle 0, so the rotation multiplies by cos 0 = 1 and adds
    // sin 0 = 0 times the pair's other element, which leaves each value exactly as it was.
    if (!a.rotary) rope = {std::vector<float>(rope.inv_freq.size(), 0.0f), 1.0f};
    return std::make_unique<MlaAttention>(a, static_cast<float>(spec_.rms_norm_eps), std::move(w), rope);
  }

  GqaAttention grouped_query_attention() const {
    const AttentionSpec& a = spec_.attention;
    const std::string p = spec_.names.attention;
    const int64_t h = spec_.hidden_size, q = a.num_heads * a.head_dim, kv = a.num_kv_heads * a.head_dim;
    GqaAttentionWeights w;
    w.q = load_matrix(p + "q_proj.weight", {q, h});
    w.k = load_matrix(p + "k_proj.weight", {kv, h});
    w.v = load_matrix(p + "v_proj.weight", {kv, h});
    w.o = load_matrix(p + "o_proj.weight", {h, q});
    if (a.qkv_bias) {
      w.q_bias = load(p + "q_proj.bias", {q});
      w.k_bias = load(p + "k_proj.bias", {kv});
      w.v_bias = load(p + "v_proj.bias", {kv});
    }
    if (a.o_bias) w.o_bias = load(p + "o_proj.bias", {h});
    if (a.qk_norm == QkNorm::kPerHead) {
      w.q_norm = load(p + "q_norm.weight", {a.head_dim});
      w.k_norm = load(p + "k_norm.weight", {a.head_dim});
    } else if (a.qk_norm == QkNorm::kFull) {
      w.q_norm = load(p + "q_norm.weight", {q});
      w.k_norm = load(p + "k_norm.weight", {kv});
    }
    if (a.sinks) w.sinks = load(p + "sinks", {a.num_heads});
    const bool sliding = spec_.layer_sliding.empty() || spec_.layer_sliding[static_cast<std::size_t>(layer_)];
    return GqaAttention(a, static_cast<float>(spec_.rms_norm_eps), std::move(w),
                        rope_frequencies(a.rotary_dim > 0 ? a.rotary_dim : a.head_dim), sliding ? a.sliding_window : 0);
  }

  SwigluMlp mlp(const std::string& p, int64_t width) const {
    const int64_t h = spec_.hidden_size;
    return SwigluMlp(load_matrix(p + "gate_proj.weight", {width, h}), load_matrix(p + "up_proj.weight", {width, h}),
                     load_matrix(p + "down_proj.weight", {h, width}));
  }

  std::shared_ptr<const moe::RoutingRule> routing_rule() const {
    const MoeSpec& m = spec_.moe;
    switch (m.router) {
      case RouterKind::kSoftmaxTopK:
        return std::make_shared<moe::SoftmaxTopK>(m.top_k, m.normalize_topk);
      case RouterKind::kSigmoidGroupTopK: {
        Tensor bias = load(spec_.names.moe + spec_.names.router_bias, {m.num_experts});
        return std::make_shared<moe::SigmoidGroupTopK>(
            m.top_k, std::vector<float>(bias.data<float>(), bias.data<float>() + m.num_experts), m.num_groups,
            m.topk_groups, m.normalize_topk, static_cast<float>(m.routed_scaling_factor));
      }
      case RouterKind::kTopKSoftmax:
        return std::make_shared<moe::TopKSoftmax>(m.top_k);
      case RouterKind::kSoftmaxGroupGreedy:
        return std::make_shared<moe::SoftmaxGroupGreedy>(m.top_k, m.num_groups, m.topk_groups,
                                                         static_cast<float>(m.routed_scaling_factor));
    }
    R3_FAIL("unknown router kind");
  }

  // GPT-OSS stores each layer's experts fused: gate_up_proj [E, hidden, 2I] and down_proj
  // [E, I, hidden] input-major, gate and up interleaved along 2I (transformers' GptOssExperts:
  // gate = gate_up[..., ::2], up = gate_up[..., 1::2]); r3 keeps every expert as [out, in] gate,
  // up and down with their biases. Unquantized, they are transposed into float32 copies here.
  // MXFP4 (as OpenAI publishes them) they stay the mapped bytes: the blocks are output-major
  // already (transformers transposes them after dequantizing), so gate and up are the even and
  // odd rows of gate_up_proj_blocks and down the rows of down_proj_blocks.
  std::vector<moe::SwigluExpertWeights> gpt_oss_experts() const {
    const MoeSpec& m = spec_.moe;
    const std::string p = spec_.names.moe + "experts.";
    const int64_t h = spec_.hidden_size, width = m.expert_intermediate, e_count = m.num_experts;
    const bool gate_up_mxfp4 = stores_mxfp4(p + "gate_up_proj"), down_mxfp4 = stores_mxfp4(p + "down_proj");
    if (gate_up_mxfp4) check_mxfp4_inputs("hidden_size", h);
    if (down_mxfp4) check_mxfp4_inputs("intermediate_size", width);
    const Tensor gate_up_bias = load(p + "gate_up_proj_bias", {e_count, 2 * width});
    const Tensor down_bias = load(p + "down_proj_bias", {e_count, h});
    std::vector<moe::SwigluExpertWeights> experts(static_cast<std::size_t>(e_count));
    for (int64_t e = 0; e < e_count; ++e) {
      moe::SwigluExpertWeights& w = experts[static_cast<std::size_t>(e)];
      w.gate_bias = Tensor::empty(DType::F32, {width});
      w.up_bias = Tensor::empty(DType::F32, {width});
      w.down_bias = Tensor::empty(DType::F32, {h});
      for (int64_t j = 0; j < width; ++j) {
        w.gate_bias.data<float>()[j] = gate_up_bias.data<float>()[e * 2 * width + 2 * j];
        w.up_bias.data<float>()[j] = gate_up_bias.data<float>()[e * 2 * width + 2 * j + 1];
      }
      std::copy_n(down_bias.data<float>() + e * h, h, w.down_bias.data<float>());
    }
    if (gate_up_mxfp4) {
      const Tensor gate_up = load_mxfp4(p + "gate_up_proj", {e_count, 2 * width, h});  // F4 [E * 2I, H / 2]
      for (int64_t e = 0; e < e_count; ++e) {
        moe::SwigluExpertWeights& w = experts[static_cast<std::size_t>(e)];
        w.gate = gate_up.rows(e * 2 * width, (e + 1) * 2 * width, 2);
        w.up = gate_up.rows(e * 2 * width + 1, (e + 1) * 2 * width, 2);
      }
    } else {
      const Tensor gate_up = load(p + "gate_up_proj", {e_count, h, 2 * width});
      for (int64_t e = 0; e < e_count; ++e) {
        moe::SwigluExpertWeights& w = experts[static_cast<std::size_t>(e)];
        w.gate = Tensor::empty(DType::F32, {width, h});
        w.up = Tensor::empty(DType::F32, {width, h});
        const float* gu = gate_up.data<float>() + e * h * 2 * width;
        for (int64_t j = 0; j < width; ++j) {
          for (int64_t i = 0; i < h; ++i) {
            w.gate.data<float>()[j * h + i] = gu[i * 2 * width + 2 * j];
            w.up.data<float>()[j * h + i] = gu[i * 2 * width + 2 * j + 1];
          }
        }
      }
    }
    if (down_mxfp4) {
      const Tensor down = load_mxfp4(p + "down_proj", {e_count, h, width});  // F4 [E * H, I / 2]
      for (int64_t e = 0; e < e_count; ++e) experts[static_cast<std::size_t>(e)].down = down.rows(e * h, (e + 1) * h);
    } else {
      const Tensor down = load(p + "down_proj", {e_count, width, h});
      for (int64_t e = 0; e < e_count; ++e) {
        Tensor& d = experts[static_cast<std::size_t>(e)].down;
        d = Tensor::empty(DType::F32, {h, width});
        const float* dn = down.data<float>() + e * width * h;
        for (int64_t o = 0; o < h; ++o) {
          for (int64_t j = 0; j < width; ++j) d.data<float>()[o * width + j] = dn[j * h + o];
        }
      }
    }
    return experts;
  }

  bool stores_mxfp4(const std::string& name) const { return params_.stores_mxfp4(expand_name(prefix_ + name, layer_)); }
  Tensor load_mxfp4(const std::string& name, const Shape& shape) const {
    return params_.load_mxfp4(expand_name(prefix_ + name, layer_), shape, {layer_, -1});
  }
  // One e8m0 scale covers 32 values of a row: transformers' Mxfp4GptOssExperts sizes its blocks
  // hidden_size // 32 (gate_up_proj's inputs) and intermediate_size // 32 (down_proj's), so other
  // sizes cannot be stored.
  void check_mxfp4_inputs(const char* key, int64_t size) const {
    R3_CHECK(size % MxScales::kBlock == 0, params_.dir(), "/config.json: MXFP4 experts need '", key,
             "' to be a multiple of ", MxScales::kBlock, " (one e8m0 scale per ", MxScales::kBlock, " values), got ",
             size);
  }

  std::unique_ptr<FeedForward> moe(int64_t moe_layer_id) const {
    const MoeSpec& m = spec_.moe;
    const DecoderNames& n = spec_.names;
    const int64_t h = spec_.hidden_size, width = m.expert_intermediate;
    std::vector<moe::SwigluExpertWeights> experts;
    if (m.expert_layout == ExpertLayout::kGptOssFused) {
      experts = gpt_oss_experts();
    } else {
      for (int64_t e = 0; e < m.num_experts; ++e) {
        const std::string p = n.moe + n.expert;
        experts.push_back({load_matrix(p + n.expert_gate, {width, h}, e), load_matrix(p + n.expert_up, {width, h}, e),
                           load_matrix(p + n.expert_down, {h, width}, e)});
      }
    }
    auto physical = std::make_shared<moe::PhysicalExperts>(
        std::move(experts), moe::ExpertPlacement::initial(m.num_experts, options_.eplb.redundant_experts),
        m.activation);
    auto block = moe::make_moe_block(options_.moe_path, moe_layer_id, load(n.moe + n.router, {m.num_experts, h}),
                                     routing_rule(), std::move(physical),
                                     m.router_has_bias ? load(n.moe + n.router_gate_bias, {m.num_experts}) : Tensor());
    std::optional<SwigluMlp> shared;
    Tensor shared_gate;
    if (m.shared_expert_intermediate > 0) {
      shared = mlp(n.moe + n.shared_expert, m.shared_expert_intermediate);
      if (m.shared_expert_gate) shared_gate = load(n.moe + n.shared_expert_gate, {1, h});
    }
    return std::make_unique<MoeFeedForward>(std::move(block), std::move(shared), std::move(shared_gate));
  }

 private:
  const DecoderSpec& spec_;
  ParameterLoader& params_;
  const LoadOptions& options_;
  int64_t layer_;
  std::string prefix_;
};

}  // namespace

std::unique_ptr<DecoderModel> build_decoder(const DecoderSpec& spec, ParameterLoader& params,
                                            const LoadOptions& options) {
  spec.validate();
  options.eplb.validate(spec.moe.num_experts);
  // The layer count comes from config.json: check the checkpoint has the last layer before
  // loading (and sizing anything by) that many.
  const std::string last_layer = expand_name(spec.names.layer + spec.names.input_norm, spec.num_layers - 1);
  R3_CHECK(params.contains(last_layer), params.dir(), "/config.json: 'num_hidden_layers' is ", spec.num_layers,
           " but the checkpoint has no tensor '", last_layer, "'");
  const int64_t h = spec.hidden_size;
  Tensor embed = params.load_weight(spec.names.embed, {spec.vocab_size, h});

  std::vector<DecoderLayer> layers;
  int64_t moe_layer_id = 0;
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    LayerLoader loader(spec, params, options, i);
    DecoderLayer layer;
    layer.input_norm = loader.load(spec.names.input_norm, {h});
    layer.post_attention_norm = loader.load(spec.names.post_attention_norm, {h});
    layer.attention = loader.attention();
    if (spec.layer_is_moe[static_cast<std::size_t>(i)]) {
      layer.feed_forward = loader.moe(moe_layer_id++);
    } else {
      layer.feed_forward =
          std::make_unique<DenseFeedForward>(loader.mlp(spec.names.dense_mlp, spec.dense_intermediate));
    }
    layers.push_back(std::move(layer));
  }
  Tensor final_norm = params.load_f32(spec.names.final_norm, {h});
  Tensor lm_head = spec.tie_word_embeddings ? embed
                                            : params.load_weight(spec.names.lm_head, {spec.vocab_size, h});

  ModelInfo info;
  info.family = spec.family;
  info.architecture = spec.architecture;
  info.vocab_size = spec.vocab_size;
  info.hidden_size = h;
  info.num_layers = spec.num_layers;
  info.max_position_embeddings = spec.max_position_embeddings;
  info.moe_layers = spec.moe_layers();
  info.num_experts = spec.moe.num_experts;
  info.top_k = spec.moe.top_k;
  info.eos_token_ids = spec.eos_token_ids;
  // The cache is built from what each layer's attention declares (DecoderModel::cache_specs).
  auto model = std::make_unique<DecoderModel>(std::move(info), static_cast<float>(spec.rms_norm_eps),
                                              std::move(embed), std::move(layers), std::move(final_norm),
                                              std::move(lm_head));
  model->set_eplb_options(options.eplb);
  return model;
}

}  // namespace r3::models
