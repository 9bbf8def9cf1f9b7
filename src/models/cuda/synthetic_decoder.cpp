// synthetic_on_device (models/device_decoder.h): the device decoder's parts filled with random
// values on the device, each tensor its own seed. Weight scales keep activations of unit size:
// projections uniform in ±sqrt(3 / fan_in) (bf16, or FP8 with block scales), norms 1, the
// embedding ±1.
#include <cmath>

#include "backend/device_memory.h"
#include "models/cuda/device_decoder_parts.h"
#include "models/device_decoder.h"
#include "ops/fill_random.h"

namespace r3::models {

namespace {

class RandomWeights {
 public:
  RandomWeights(backend::Context& ctx, uint64_t seed) : ctx_(ctx), seed_(seed) {}

  // A [rows, cols] matrix as a projection with `cols` inputs.
  Tensor matrix(DType dtype, Shape shape) {
    const int64_t fan_in = shape.back();
    return make(dtype, std::move(shape), 0.0f, std::sqrt(3.0f / static_cast<float>(fan_in)));
  }
  // The same as FP8: e4m3 values uniform in ±448 and one scale for every 128x128 block mapping
  // them to ±sqrt(3 / fan_in). Stacked matrices ([experts, rows, cols]) get a grid each.
  struct Fp8 {
    Tensor values, scales;
  };
  Fp8 fp8_matrix(Shape shape) {
    const int64_t fan_in = shape.back(), b = SyntheticShape::kFp8Block;
    Shape grid = shape;
    grid[grid.size() - 1] = (grid.back() + b - 1) / b;
    grid[grid.size() - 2] = (grid[grid.size() - 2] + b - 1) / b;
    Fp8 m{make(DType::F8_E4M3, std::move(shape), 0.0f, 448.0f), {}};
    m.scales = make(DType::F32, std::move(grid), std::sqrt(3.0f / static_cast<float>(fan_in)) / 448.0f, 0.0f);
    return m;
  }
  // An FP8 projection as the device layers hold one: its scales attached.
  Tensor fp8_projection(Shape shape) {
    Fp8 m = fp8_matrix(std::move(shape));
    BlockScales s;
    s.scales = std::move(m.scales);
    s.block_rows = s.block_cols = SyntheticShape::kFp8Block;
    return m.values.with_block_scales(std::move(s));
  }
  Tensor ones(int64_t n) { return make(DType::F32, {n}, 1.0f, 0.0f); }
  Tensor make(DType dtype, Shape shape, float center, float bound) {
    Tensor t = backend::device_empty(ctx_, dtype, std::move(shape));
    ops::cuda::fill_uniform(ctx_, t, seed_ * 1000003 + next_++, center, bound);
    return t;
  }

 private:
  backend::Context& ctx_;
  uint64_t seed_;
  uint64_t next_ = 0;
};

}  // namespace

std::unique_ptr<CausalLM> synthetic_on_device(backend::Context& ctx, const SyntheticShape& s, uint64_t seed,
                                              bool capture_routing) {
  R3_CHECK(ctx.device() == Device::kCuda, "--synthetic: needs --device cuda");
  RandomWeights random(ctx, seed);
  device::DecoderParts parts;
  ModelInfo& info = parts.info;
  info.family = "synthetic";
  info.architecture = "Qwen3MoeForCausalLM";
  info.vocab_size = s.vocab;
  info.hidden_size = s.hidden;
  info.num_layers = s.layers;
  info.max_position_embeddings = 40960;
  for (int64_t l = 0; l < s.layers; ++l) info.moe_layers.push_back(l);
  info.num_experts = s.experts;
  info.top_k = s.top_k;
  parts.rms_eps = 1e-6f;
  parts.capture_routing = capture_routing;
  parts.kv_dtype = DType::BF16;  // as a bf16 checkpoint's
  parts.reduced_precision = true;  // the FP8 weights too: the benchmark of a bf16 model
  const int64_t q_width = s.heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  parts.embed = random.make(DType::BF16, {s.vocab, s.hidden}, 0.0f, 1.0f);
  parts.final_norm = random.ones(s.hidden);
  parts.lm_head = random.matrix(DType::BF16, {s.vocab, s.hidden});
  AttentionSpec attention;
  attention.num_heads = s.heads;
  attention.num_kv_heads = s.kv_heads;
  attention.head_dim = s.head_dim;
  attention.qk_norm = QkNorm::kPerHead;
  attention.rope_theta = 1e6;
  for (int64_t l = 0; l < s.layers; ++l) {
    parts.cache_specs.push_back(CacheSpec::full_kv(kv_width));
    device::Layer layer;
    layer.input_norm = random.ones(s.hidden);
    layer.post_attention_norm = random.ones(s.hidden);
    GqaAttentionWeights a;
    const Shape qkv{q_width + 2 * kv_width, s.hidden}, o{s.hidden, q_width};  // qkv's fan-in is the hidden size
    a.qkv = s.fp8 ? random.fp8_projection(qkv) : random.matrix(DType::BF16, qkv);
    a.o = s.fp8 ? random.fp8_projection(o) : random.matrix(DType::BF16, o);
    a.q_norm = random.ones(s.head_dim);
    a.k_norm = random.ones(s.head_dim);
    layer.attention =
        std::make_unique<GqaAttention>(attention, parts.rms_eps, std::move(a), ops::Rotary(s.head_dim, 1e6), 0);
    device::Moe& m = layer.moe.emplace();
    m.layer_id = l;
    m.num_experts = s.experts;
    m.physical_experts = s.experts;
    m.top_k = s.top_k;
    m.gate_weight = random.matrix(DType::F32, {s.experts, s.hidden});
    m.rule = {moe::DeviceRoutingRule::Kind::kSoftmaxTopK, static_cast<int32_t>(s.top_k), true};
    m.monolithic_sync = std::make_shared<moe::MonolithicMoeSync>(ctx);
    const Shape gate_up{s.experts, s.expert_width, s.hidden}, down{s.experts, s.hidden, s.expert_width};
    if (s.fp8) {
      RandomWeights::Fp8 g = random.fp8_matrix(gate_up), u = random.fp8_matrix(gate_up), d = random.fp8_matrix(down);
      m.experts.gate = std::move(g.values);
      m.experts.up = std::move(u.values);
      m.experts.down = std::move(d.values);
      m.experts.gate_scales = std::move(g.scales);
      m.experts.up_scales = std::move(u.scales);
      m.experts.down_scales = std::move(d.scales);
      m.experts.block_rows = m.experts.block_cols = SyntheticShape::kFp8Block;
    } else {
      m.experts.gate = random.matrix(DType::BF16, gate_up);
      m.experts.up = random.matrix(DType::BF16, gate_up);
      m.experts.down = random.matrix(DType::BF16, down);
    }
    parts.layers.push_back(std::move(layer));
  }
  backend::synchronize(ctx);
  return std::make_unique<device::Decoder>(ctx, std::move(parts));
}

}  // namespace r3::models
