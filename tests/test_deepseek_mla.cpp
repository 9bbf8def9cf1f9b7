// DeepSeek-V2/V3 specifics: the MLA cache holds latents, and a Kimi K2-shaped config (many
// experts, one expert group) loads and runs with capture.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "io/safetensors.h"
#include "models/kv_cache.h"
#include "models/registry.h"
#include "test_support.h"

namespace r3::test {
namespace {

TEST(LatentAttention, CacheStoresLatentsNotExpandedKeysAndValues) {
  for (const std::string family : {"deepseek_v2", "deepseek_v3"}) {
    auto model = models::load_model(family_dir(family));
    auto cache = model->make_cache(1, 8);
    auto* kv = dynamic_cast<models::KvCache*>(cache.get());
    ASSERT_NE(kv, nullptr);
    // kv_lora_rank 16 + qk_rope_head_dim 8 floats per layer (3 layers), not 4 heads x (24 + 16).
    EXPECT_EQ(kv->bytes_per_token(), 3 * (16 + 8) * 4) << family;
    for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(kv->spec(l), models::CacheSpec::latent(16, 8));
  }
}

// A tiny checkpoint shaped like Kimi K2: DeepseekV3ForCausalLM, 64 experts, n_group 1,
// topk_group 1, top-8, one shared expert, first layer dense, no q LoRA.
std::string write_kimi_k2_like(const TempDir& dir) {
  const int64_t h = 32, heads = 2, nope = 8, rope = 4, v = 8, lora = 8, experts = 64, width = 8, vocab = 64;
  nlohmann::json config = {{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"},
                           {"vocab_size", vocab}, {"hidden_size", h}, {"intermediate_size", 48},
                           {"moe_intermediate_size", width}, {"num_hidden_layers", 2}, {"num_attention_heads", heads},
                           {"num_key_value_heads", heads}, {"n_routed_experts", experts}, {"n_shared_experts", 1},
                           {"num_experts_per_tok", 8}, {"n_group", 1}, {"topk_group", 1}, {"norm_topk_prob", true},
                           {"routed_scaling_factor", 2.827}, {"first_k_dense_replace", 1}, {"q_lora_rank", nullptr},
                           {"kv_lora_rank", lora}, {"qk_nope_head_dim", nope}, {"qk_rope_head_dim", rope},
                           {"v_head_dim", v}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 128},
                           {"rope_theta", 50000.0}, {"tie_word_embeddings", false}, {"eos_token_id", 1}};
  std::ofstream(dir.path("config.json")) << config.dump();
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 0.2f);
  std::vector<NamedTensor> t;
  auto add = [&](const std::string& name, Shape shape, bool ones = false) {
    Tensor w = Tensor::empty(DType::F32, shape);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = ones ? 1.0f : dist(rng);
    t.push_back({name, w});
  };
  add("model.embed_tokens.weight", {vocab, h});
  add("lm_head.weight", {vocab, h});
  add("model.norm.weight", {h}, true);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h}, true);
    add(p + "post_attention_layernorm.weight", {h}, true);
    add(p + "self_attn.q_proj.weight", {heads * (nope + rope), h});
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {lora + rope, h});
    add(p + "self_attn.kv_a_layernorm.weight", {lora}, true);
    add(p + "self_attn.kv_b_proj.weight", {heads * (nope + v), lora});
    add(p + "self_attn.o_proj.weight", {h, heads * v});
    if (l == 0) {
      add(p + "mlp.gate_proj.weight", {48, h});
      add(p + "mlp.up_proj.weight", {48, h});
      add(p + "mlp.down_proj.weight", {h, 48});
      continue;
    }
    add(p + "mlp.gate.weight", {experts, h});
    add(p + "mlp.gate.e_score_correction_bias", {experts});
    for (int e = 0; e < experts; ++e) {
      const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
      add(q + "gate_proj.weight", {width, h});
      add(q + "up_proj.weight", {width, h});
      add(q + "down_proj.weight", {h, width});
    }
    add(p + "mlp.shared_experts.gate_proj.weight", {width, h});
    add(p + "mlp.shared_experts.up_proj.weight", {width, h});
    add(p + "mlp.shared_experts.down_proj.weight", {h, width});
  }
  write_safetensors(dir.path("model.safetensors"), t);
  return dir.path();
}

TEST(KimiK2Config, LoadsAndRunsWithCaptureOnEveryPath) {
  TempDir dir;
  const std::string path = write_kimi_k2_like(dir);
  std::vector<int32_t> first;
  for (const std::string backend : {"modular", "monolithic", "mega"}) {
    models::LoadOptions options;
    options.moe_path = moe::parse_moe_path(backend);
    options.eplb.redundant_experts = 4;
    options.eplb.rebalance_every = 2;
    auto model = models::load_model(path, options);
    EXPECT_EQ(model->info().moe_layers, (std::vector<int64_t>{1}));
    EXPECT_EQ(model->info().num_experts, 64);
    backend::Context ctx(2);
    engine::GenerateOptions gen;
    gen.max_new_tokens = 6;
    const auto result = engine::generate(*model, ctx, {3, 9, 27, 17}, gen);
    EXPECT_EQ(result.routed_experts.rows(), 4 + 6 - 1);
    for (int32_t id : result.routed_experts.flat()) EXPECT_TRUE(id >= 0 && id < 64);
    if (first.empty()) {
      first = result.routed_experts.flat();
    } else {
      EXPECT_EQ(result.routed_experts.flat(), first) << backend;
    }
  }
}

}  // namespace
}  // namespace r3::test
