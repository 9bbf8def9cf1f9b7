// config.json -> typed DecoderSpec for each family, and clear errors for bad configs.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "models/registry.h"
#include "test_support.h"

namespace r3::test {
namespace {

nlohmann::json fixture_config(const std::string& family) {
  std::ifstream in(family_dir(family) + "/config.json");
  return nlohmann::json::parse(in);
}

models::DecoderSpec spec_of(const nlohmann::json& j) {
  return models::spec_from_config(HfConfig::parse(j.dump()));
}

std::string config_error_of(const nlohmann::json& j) {
  try {
    spec_of(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, Qwen3Moe) {
  const auto s = spec_of(fixture_config("qwen3_moe"));
  EXPECT_EQ(s.family, "qwen3_moe");
  EXPECT_EQ(s.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(s.hidden_size, 64);
  EXPECT_EQ(s.num_layers, 3);
  EXPECT_EQ(s.vocab_size, 320);
  EXPECT_EQ(s.attention.num_heads, 4);
  EXPECT_EQ(s.attention.num_kv_heads, 2);
  EXPECT_EQ(s.attention.head_dim, 16);
  EXPECT_EQ(s.attention.qk_norm, models::QkNorm::kPerHead);
  EXPECT_FALSE(s.attention.qkv_bias);
  EXPECT_DOUBLE_EQ(s.attention.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(s.rms_norm_eps, 1e-6);
  EXPECT_EQ(s.moe.num_experts, 8);
  EXPECT_EQ(s.moe.top_k, 2);
  EXPECT_EQ(s.moe.expert_intermediate, 32);
  EXPECT_TRUE(s.moe.normalize_topk);
  EXPECT_EQ(s.moe_layers(), (std::vector<int64_t>{0, 1, 2}));
}

TEST(Config, Qwen3MoeSparseStepAndMlpOnlyLayers) {
  auto j = fixture_config("qwen3_moe");
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const auto s = spec_of(j);
  // (i + 1) % 2 == 0 -> 1, 3, 5; 3 is listed as MLP-only.
  EXPECT_EQ(s.moe_layers(), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(s.dense_intermediate, 128);
}

TEST(Config, Qwen2MoeHasBiasAndGatedSharedExpert) {
  const auto s = spec_of(fixture_config("qwen2_moe"));
  EXPECT_EQ(s.family, "qwen2_moe");
  EXPECT_TRUE(s.attention.qkv_bias);
  EXPECT_FALSE(s.attention.o_bias);
  EXPECT_EQ(s.moe.shared_expert_intermediate, 64);
  EXPECT_TRUE(s.moe.shared_expert_gate);
  EXPECT_FALSE(s.moe.normalize_topk);
}

TEST(Config, MixtralNamesAndAlwaysNormalises) {
  const auto s = spec_of(fixture_config("mixtral"));
  EXPECT_EQ(s.family, "mixtral");
  EXPECT_TRUE(s.moe.normalize_topk);
  EXPECT_EQ(s.moe.expert_intermediate, 32);
  EXPECT_EQ(s.names.moe, "block_sparse_moe.");
  EXPECT_EQ(s.names.expert_gate, "w1.weight");
  EXPECT_EQ(s.eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(s.attention.sliding_window, 0);
}

TEST(Config, OlmoeNormalisesFullQkProjection) {
  const auto s = spec_of(fixture_config("olmoe"));
  EXPECT_EQ(s.family, "olmoe");
  EXPECT_EQ(s.attention.qk_norm, models::QkNorm::kFull);
  EXPECT_EQ(s.attention.num_kv_heads, 4);
  EXPECT_FALSE(s.moe.normalize_topk);
}

TEST(Config, OlderConfigFieldsStillParse) {
  auto j = fixture_config("qwen3_moe");
  j.erase("rope_parameters");
  j["rope_theta"] = 500000.0;
  j.erase("num_local_experts");
  j["num_experts"] = 8;
  j["eos_token_id"] = {5, 7};
  const auto s = spec_of(j);
  EXPECT_DOUBLE_EQ(s.attention.rope_theta, 500000.0);
  EXPECT_EQ(s.moe.num_experts, 8);
  EXPECT_EQ(s.eos_token_ids, (std::vector<int32_t>{5, 7}));
}

TEST(Config, UnknownArchitectureListsSupportedOnes) {
  auto j = fixture_config("qwen3_moe");
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  const std::string err = config_error_of(j);
  EXPECT_NE(err.find("unsupported architecture 'LlamaForCausalLM'"), std::string::npos) << err;
  EXPECT_NE(err.find("Qwen3MoeForCausalLM"), std::string::npos) << err;
  EXPECT_NE(err.find("MixtralForCausalLM"), std::string::npos) << err;
}

TEST(Config, ModelTypeIsUsedWhenArchitecturesAreAbsent) {
  auto j = fixture_config("olmoe");
  j.erase("architectures");
  EXPECT_EQ(spec_of(j).family, "olmoe");
}

TEST(Config, MissingAndMistypedFieldsAreNamed) {
  auto j = fixture_config("mixtral");
  j.erase("hidden_size");
  EXPECT_NE(config_error_of(j).find("'hidden_size' is missing"), std::string::npos) << config_error_of(j);
  j = fixture_config("mixtral");
  j["num_attention_heads"] = "four";
  EXPECT_NE(config_error_of(j).find("'num_attention_heads' must be an integer"), std::string::npos);
  j = fixture_config("mixtral");
  j["num_experts_per_tok"] = 9;
  EXPECT_NE(config_error_of(j).find("num_experts_per_tok must be in [1, num_experts]"), std::string::npos)
      << config_error_of(j);
  j = fixture_config("mixtral");
  j["num_key_value_heads"] = 3;
  EXPECT_NE(config_error_of(j).find("not divisible"), std::string::npos) << config_error_of(j);
}

TEST(Config, UnsupportedRopeScalingIsRefusedNotIgnored) {
  auto j = fixture_config("qwen3_moe");
  j["rope_parameters"]["rope_type"] = "longrope";
  EXPECT_NE(config_error_of(j).find("rope_type 'longrope' is not supported"), std::string::npos) << config_error_of(j);
}

TEST(Config, MalformedJsonIsAClearError) {
  try {
    HfConfig::parse("{\"a\": ", "x/config.json");
    FAIL() << "accepted malformed JSON";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x/config.json: malformed JSON"), std::string::npos);
  }
}

}  // namespace
}  // namespace r3::test
