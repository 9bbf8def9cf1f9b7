// Weights as published: a bf16 or f16 checkpoint is computed from its stored values, without a
// widened copy in memory. The model's resident memory stays near the file size, and its results
// equal, bit for bit, those of the float32 checkpoint holding the same (exactly widened) values.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "test_support.h"

namespace r3 {
namespace {

// A Qwen3-MoE checkpoint large enough that its weights dominate resident memory (~40 MB in bf16),
// with every value representable in bf16 and f16 alike, so the three dtypes hold equal values.
constexpr int64_t kHidden = 256, kLayers = 4, kHeads = 4, kKvHeads = 2, kHeadDim = 64;
constexpr int64_t kExperts = 24, kTopK = 4, kExpertWidth = 256, kVocab = 2048;

void write_model(const std::string& dir, DType dtype) {
  std::filesystem::create_directories(dir);
  const nlohmann::json config = {
      {"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"hidden_size", kHidden},
      {"num_hidden_layers", kLayers}, {"num_attention_heads", kHeads}, {"num_key_value_heads", kKvHeads},
      {"head_dim", kHeadDim}, {"vocab_size", kVocab}, {"intermediate_size", 512},
      {"moe_intermediate_size", kExpertWidth}, {"num_experts", kExperts}, {"num_experts_per_tok", kTopK},
      {"norm_topk_prob", true}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 512},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}}};
  std::ofstream(dir + "/config.json") << config.dump(1);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> mantissa(0, 127), exponent(-10, -3);
  std::vector<NamedTensor> tensors;
  auto add = [&](const std::string& name, Shape shape) {
    const bool norm = shape.size() == 1;
    Tensor t = Tensor::empty(dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      // Sign, 7 mantissa bits and a small exponent: exact in bf16, f16 and f32.
      const float v = norm ? 1.0f + static_cast<float>(mantissa(rng)) / 128.0f
                           : std::ldexp(1.0f + static_cast<float>(mantissa(rng)) / 128.0f, exponent(rng)) *
                                 (mantissa(rng) % 2 ? 1.0f : -1.0f);
      if (dtype == DType::F32) t.data<float>()[i] = v;
      else static_cast<uint16_t*>(t.raw_data())[i] = dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
    tensors.push_back({name, std::move(t)});
  };
  add("model.embed_tokens.weight", {kVocab, kHidden});
  add("lm_head.weight", {kVocab, kHidden});
  add("model.norm.weight", {kHidden});
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden});
    add(p + "post_attention_layernorm.weight", {kHidden});
    add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden});
    add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden});
    add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden});
    add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim});
    add(p + "self_attn.q_norm.weight", {kHeadDim});
    add(p + "self_attn.k_norm.weight", {kHeadDim});
    add(p + "mlp.gate.weight", {kExperts, kHidden});
    for (int64_t e = 0; e < kExperts; ++e) {
      const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
      add(q + "gate_proj.weight", {kExpertWidth, kHidden});
      add(q + "up_proj.weight", {kExpertWidth, kHidden});
      add(q + "down_proj.weight", {kHidden, kExpertWidth});
    }
  }
  write_safetensors(dir + "/model.safetensors", tensors);
}

int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  ADD_FAILURE() << "no VmRSS in /proc/self/status";
  return 0;
}

std::vector<float> published_logits_of(models::CausalLM& model) {
  backend::Context ctx(2);
  auto cache = model.make_cache(1, 16);
  const Tensor logits = test::forward_captured(model, ctx, models::ForwardBatch::sequence({5, 17, 300, 2047, 9, 1000}, 0), *cache);
  return {logits.data<float>(), logits.data<float>() + logits.numel()};
}

class WeightsAsPublished : public ::testing::TestWithParam<DType> {};

TEST_P(WeightsAsPublished, StayInTheirDtypeWithResidentMemoryNearTheFileSize) {
  const test::TempDir dir;
  write_model(dir.path("half"), GetParam());
  const auto file_bytes = static_cast<double>(std::filesystem::file_size(dir.path("half") + "/model.safetensors"));
  const int64_t before = resident_bytes();
  auto model = models::load_model(dir.path("half"));
  const auto grown = static_cast<double>(resident_bytes() - before);
  // At least 0.9x: the weights were read in at load. At most 1.3x: no widened copy (which alone
  // would add 2x in float32).
  EXPECT_GE(grown, 0.9 * file_bytes) << "resident memory grew by " << grown << " bytes for a " << file_bytes
                                     << "-byte checkpoint";
  EXPECT_LE(grown, 1.3 * file_bytes) << "resident memory grew by " << grown << " bytes for a " << file_bytes
                                     << "-byte checkpoint";
}

TEST_P(WeightsAsPublished, ComputeExactlyWhatTheWidenedFloat32CheckpointComputes) {
  const test::TempDir dir;
  write_model(dir.path("half"), GetParam());
  write_model(dir.path("f32"), DType::F32);
  auto half = models::load_model(dir.path("half"));
  auto f32 = models::load_model(dir.path("f32"));
  const std::vector<float> a = published_logits_of(*half), b = published_logits_of(*f32);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "logit " << i;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WeightsAsPublished, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace r3
