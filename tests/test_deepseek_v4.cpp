// DeepSeek-V4 pieces that parity alone does not pin down: its config, its routing rules and
// the PyTorch-compatible top-k the indexer relies on.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "models/deepseek_v4/v4_spec.h"
#include "models/registry.h"
#include "moe/routing_rule.h"
#include "ops/rope_scaling.h"
#include "ops/topk.h"
#include "test_support.h"

namespace r3::test {
namespace {

nlohmann::json v4_config(const std::string& family = "deepseek_v4") {
  std::ifstream in(family_dir(family) + "/config.json");
  return nlohmann::json::parse(in);
}

std::string v4_error(const nlohmann::json& j) {
  try {
    models::DeepseekV4Spec::parse(HfConfig::parse(j.dump()));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeepseekV4Config, ParsesTheFixtures) {
  const auto s = models::DeepseekV4Spec::parse(HfConfig::parse(v4_config().dump()));
  EXPECT_EQ(s.num_layers, 4);
  EXPECT_EQ(s.hc_mult, 2);
  EXPECT_EQ(s.hc_sinkhorn_iters, 20);
  EXPECT_EQ(s.rope_dim, 8);
  EXPECT_EQ(s.csa_rate, 4);
  EXPECT_EQ(s.hca_rate, 8);
  EXPECT_EQ(s.layer_kinds, (std::vector<models::V4AttentionKind>{
                               models::V4AttentionKind::kSliding, models::V4AttentionKind::kCompressed,
                               models::V4AttentionKind::kHeavy, models::V4AttentionKind::kCompressed}));
  EXPECT_EQ(s.hash_layer, (std::vector<bool>{true, false, false, false}));
  EXPECT_DOUBLE_EQ(s.compress_rope_theta, 160000.0);
  EXPECT_DOUBLE_EQ(s.routed_scaling_factor, 1.5);
  EXPECT_DOUBLE_EQ(s.swiglu_limit, 10.0);

  const auto alt = models::DeepseekV4Spec::parse(HfConfig::parse(v4_config("deepseek_v4_alt").dump()));
  EXPECT_EQ(alt.num_layers, 5);
  EXPECT_EQ(alt.hc_mult, 3);
  EXPECT_EQ(alt.csa_rate, 2);
  EXPECT_EQ(alt.hca_rate, 4);
  EXPECT_EQ(alt.hash_layer, (std::vector<bool>{true, true, false, false, false}));
  EXPECT_EQ(s.compress_rope_scaling.kind, ops::RopeScaling::Kind::kDefault);

  // Released-style config.json: legacy compress_ratios / num_hash_layers / qk_rope_head_dim and a
  // flat rope_scaling that applies YaRN to the compress rope only, with cos/sin left unscaled.
  const auto yarn = models::DeepseekV4Spec::parse(HfConfig::parse(v4_config("deepseek_v4_yarn").dump()));
  EXPECT_EQ(yarn.layer_kinds, (std::vector<models::V4AttentionKind>{
                                  models::V4AttentionKind::kSliding, models::V4AttentionKind::kCompressed,
                                  models::V4AttentionKind::kHeavy, models::V4AttentionKind::kCompressed}));
  EXPECT_EQ(yarn.csa_rate, 4);
  EXPECT_EQ(yarn.hca_rate, 128);
  EXPECT_EQ(yarn.hash_layer, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(yarn.rope_dim, 8);
  EXPECT_DOUBLE_EQ(yarn.main_rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(yarn.compress_rope_theta, 160000.0);
  EXPECT_EQ(yarn.main_rope_scaling.kind, ops::RopeScaling::Kind::kDefault);
  EXPECT_EQ(yarn.compress_rope_scaling.kind, ops::RopeScaling::Kind::kYarn);
  EXPECT_DOUBLE_EQ(yarn.compress_rope_scaling.factor, 16.0);
  EXPECT_EQ(yarn.compress_rope_scaling.original_max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(yarn.compress_rope_scaling.attention_factor, 1.0);
}

// The rotary frequencies and cos/sin scaling transformers 5.17 builds (DeepseekV4RotaryEmbedding's
// main_/compress_inv_freq and attention_scaling) for variants of the YaRN fixture's config.
TEST(DeepseekV4Config, RopeFrequenciesMatchTransformers) {
  struct Variant {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::vector<float> main, compress;
    double main_scaling, compress_scaling;
  };
  const std::vector<float> plain_main = {0x1p+0f, 0x1.99999ap-4f, 0x1.47ae14p-7f, 0x1.0624dep-10f};
  const std::vector<float> fixture = {0x1p+0f, 0x1.b33334p-6f, 0x1.47ae14p-13f, 0x1.0624dep-17f};
  const nlohmann::json yarn = {{"rope_type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 256},
                               {"beta_fast", 32}, {"beta_slow", 1}, {"rope_theta", 160000.0},
                               {"partial_rotary_factor", 0.25}};
  const nlohmann::json plain = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}};
  auto nested = [](nlohmann::json main, nlohmann::json compress) {
    return [=](nlohmann::json& j) {
      j.erase("rope_scaling");
      j["rope_parameters"] = {{"main", main}, {"compress", compress}};
    };
  };
  nlohmann::json bare = yarn;
  bare.erase("rope_theta");
  bare.erase("partial_rotary_factor");
  nlohmann::json main_yarn = yarn;
  main_yarn["rope_theta"] = 10000.0;
  main_yarn["factor"] = 4;
  const double derived = 1.2772588722239782;  // 0.1 ln 16 + 1
  const std::vector<Variant> variants = {
      {"released-style rope_scaling", [](nlohmann::json&) {}, plain_main, fixture, 1.0, 1.0},
      {"truncate is not read", [](nlohmann::json& j) { j["rope_scaling"]["truncate"] = false; }, plain_main, fixture,
       1.0, 1.0},
      {"flat rope_parameters", [](nlohmann::json& j) { j["rope_parameters"] = j["rope_scaling"]; j.erase("rope_scaling"); },
       plain_main, fixture, 1.0, 1.0},
      {"attention_factor null", [](nlohmann::json& j) { j["rope_scaling"]["attention_factor"] = nullptr; }, plain_main,
       fixture, 1.0, derived},
      {"factor null", [](nlohmann::json& j) { j["rope_scaling"]["factor"] = nullptr; }, plain_main, fixture, 1.0, 1.0},
      {"dict rope_theta dropped, factor 8",
       [](nlohmann::json& j) {
         j["rope_scaling"]["rope_theta"] = 5.0;
         j["rope_scaling"]["factor"] = 8;
       },
       plain_main, {0x1p+0f, 0x1.cccccep-6f, 0x1.47ae14p-12f, 0x1.0624dep-16f}, 1.0, 1.0},
      {"attention_factor 0.9, beta_fast 0, no original",
       [](nlohmann::json& j) {
         j["rope_scaling"]["attention_factor"] = 0.9;
         j["rope_scaling"]["beta_fast"] = 0;
         j["rope_scaling"].erase("original_max_position_embeddings");
       },
       plain_main, {0x1p+0f, 0x1.99999ap-5f, 0x1.5c28f6p-10f, 0x1.0624dep-17f}, 1.0, 0.9},
      {"nested, attention_factor derived", nested(plain, yarn), plain_main, fixture, 1.0, derived},
      {"nested, mscale / mscale_all_dim",
       nested(plain, [&] {
         nlohmann::json c = yarn;
         c["mscale"] = 1.0;
         c["mscale_all_dim"] = 0.707;
         return c;
       }()),
       plain_main, fixture, 1.0, 1.0679225365606495},
      {"nested, no rope_theta: the top-level one", nested(plain, bare), plain_main,
       {0x1p+0f, 0x1.b33334p-5f, 0x1.47ae14p-11f, 0x1.0624dep-14f}, 1.0, derived},
      {"nested, YaRN on main too", nested(main_yarn, yarn), {0x1p+0f, 0x1p-4f, 0x1.47ae14p-9f, 0x1.0624dep-12f},
       fixture, 1.138629436111989, derived},
  };
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    auto j = v4_config("deepseek_v4_yarn");
    v.edit(j);
    const auto s = models::DeepseekV4Spec::parse(HfConfig::parse(j.dump()));
    const ops::RopeFrequencies main = s.main_rope(), compress = s.compress_rope();
    EXPECT_EQ(main.inv_freq, v.main);
    EXPECT_EQ(compress.inv_freq, v.compress);
    EXPECT_FLOAT_EQ(main.attention_scaling, static_cast<float>(v.main_scaling));
    EXPECT_FLOAT_EQ(compress.attention_scaling, static_cast<float>(v.compress_scaling));
  }
}

TEST(DeepseekV4Config, LegacyScheduleKeys) {
  auto j = v4_config("deepseek_v4_yarn");
  j["compress_ratios"] = {0, 4, 128, 4, 0};  // longer than the model (a trailing MTP layer): cut
  j["compress_rate_hca"] = 16;
  auto s = models::DeepseekV4Spec::parse(HfConfig::parse(j.dump()));
  EXPECT_EQ(s.layer_kinds.size(), 4u);
  EXPECT_EQ(s.hca_rate, 16);
  EXPECT_EQ(s.csa_rate, 4);
  // Neither layer_types nor compress_ratios: transformers' default, two HCA layers, then HCA / CSA.
  j.erase("compress_ratios");
  s = models::DeepseekV4Spec::parse(HfConfig::parse(j.dump()));
  EXPECT_EQ(s.layer_kinds, (std::vector<models::V4AttentionKind>{
                               models::V4AttentionKind::kHeavy, models::V4AttentionKind::kHeavy,
                               models::V4AttentionKind::kHeavy, models::V4AttentionKind::kCompressed}));
}

TEST(DeepseekV4Config, RefusesWhatIsNotImplemented) {
  auto j = v4_config();
  j["rope_parameters"]["compress"]["rope_type"] = "dynamic";
  EXPECT_NE(v4_error(j).find("rope_parameters.compress rope_type 'dynamic' is not supported for deepseek_v4"),
            std::string::npos)
      << v4_error(j);
  j = v4_config("deepseek_v4_yarn");
  j["rope_scaling"]["type"] = "longrope";
  EXPECT_NE(v4_error(j).find("rope_type 'longrope' is not supported for deepseek_v4"), std::string::npos)
      << v4_error(j);
  j = v4_config("deepseek_v4_yarn");
  j["rope_scaling"].erase("factor");
  EXPECT_NE(v4_error(j).find("YaRN needs 'factor'"), std::string::npos) << v4_error(j);
  j = v4_config("deepseek_v4_yarn");
  j["compress_ratios"][2] = 64;
  EXPECT_NE(v4_error(j).find("compress_ratios value 64 has no layer type"), std::string::npos) << v4_error(j);
  j = v4_config();
  j["scoring_func"] = "softmax";
  EXPECT_NE(v4_error(j).find("scoring_func 'softmax'"), std::string::npos);
  j = v4_config();
  j["layer_types"][1] = "linear_attention";
  EXPECT_NE(v4_error(j).find("unknown layer type 'linear_attention' at layer 1"), std::string::npos);
  j = v4_config();
  j["num_key_value_heads"] = 2;
  EXPECT_NE(v4_error(j).find("one shared KV head"), std::string::npos);
  // Not a Llama-style decoder: the decoder-spec entry point says so.
  try {
    models::spec_from_config(HfConfig::parse(v4_config().dump()));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek_v4 is not a Llama-style decoder"), std::string::npos);
  }
}

// Values that would load and then change every answer (or fail every request) are refused when
// the config is read, naming the key.
TEST(DeepseekV4Config, RefusesValuesOutOfRangeByName) {
  const std::vector<std::pair<std::string, nlohmann::json>> bad = {
      {"index_topk", -5},          {"index_topk", 0},       {"index_n_heads", 0},     {"index_head_dim", -1},
      {"hc_eps", -1},              {"hc_eps", 2},           {"max_position_embeddings", 0},
      {"sliding_window", 0},       {"routed_scaling_factor", -1}, {"swiglu_limit", -3}, {"compress_rate_csa", 0}};
  for (const auto& [key, value] : bad) {
    auto j = v4_config();
    j[key] = value;
    const std::string error = v4_error(j);
    EXPECT_NE(error.find(key == "compress_rate_csa" ? "compression rates must be >= 1" : "'" + key + "' = "),
              std::string::npos)
        << key << " = " << value << ": " << (error.empty() ? "accepted" : error);
  }
  // Every other family: a max_position_embeddings that is there must be at least 1.
  std::ifstream in(family_dir("qwen3_moe") + "/config.json");
  auto q = nlohmann::json::parse(in);
  q["max_position_embeddings"] = 0;
  try {
    models::spec_from_config(HfConfig::parse(q.dump()));
    ADD_FAILURE() << "max_position_embeddings 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'max_position_embeddings' = 0 is out of range"), std::string::npos) << e.what();
  }
}

TEST(DeepseekV4Routing, SqrtSoftplusBiasSteersSelectionNotWeights) {
  // Expert 3 has the lowest score but a large bias: selected, weighted by its own score.
  const moe::SqrtSoftplusTopK rule(2, {0.0f, 0.0f, 0.0f, 10.0f}, 1.5f);
  std::vector<float> logits = {2.0f, 1.0f, 0.5f, -3.0f};
  int32_t ids[2];
  float weights[2];
  rule.route(logits, 0, {}, ids, weights);
  EXPECT_EQ(std::set<int32_t>(ids, ids + 2), (std::set<int32_t>{0, 3}));
  const double s0 = std::sqrt(std::log1p(std::exp(2.0))), s3 = std::sqrt(std::log1p(std::exp(-3.0)));
  const double w0 = ids[0] == 0 ? weights[0] : weights[1];
  EXPECT_NEAR(w0, s0 / (s0 + s3) * 1.5, 1e-6);
  EXPECT_NEAR(weights[0] + weights[1], 1.5, 1e-6);
  EXPECT_FLOAT_EQ(moe::sqrt_softplus(30.0f), std::sqrt(30.0f));  // softplus threshold
}

TEST(DeepseekV4Routing, HashTableSelectsByTokenId) {
  Tensor table = Tensor::from<int64_t>({0, 1, 2, 3, 3, 2}, {3, 2});
  const moe::SqrtSoftplusHash rule(table, 4, 1.0f);
  std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f};
  int32_t ids[2];
  float weights[2];
  rule.route(logits, 2, {}, ids, weights);
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(weights[0] + weights[1], 1.0, 1e-6);
  Tensor bad = Tensor::from<int64_t>({0, 9}, {1, 2});
  EXPECT_THROW(moe::SqrtSoftplusHash(bad, 4, 1.0f), Error);  // 9 is not an expert id
}

TEST(TorchTopK, SelectsTheLargestAndBreaksTiesDeterministically) {
  const std::vector<float> values = {0.5f, 0.0f, -1.0f, 0.0f, 2.0f, 0.0f};
  const auto top = ops::torch_cpu_topk_set(values, 2);
  EXPECT_EQ(std::set<int32_t>(top.begin(), top.end()).count(4), 1u);  // the maximum is always kept
  EXPECT_EQ(std::set<int32_t>(top.begin(), top.end()).count(0), 1u);
  const auto ties = ops::torch_cpu_topk_set(values, 4);  // 2.0, 0.5 and two of the three zeros
  std::set<int32_t> s(ties.begin(), ties.end());
  EXPECT_EQ(s.size(), 4u);
  EXPECT_TRUE(s.count(4) && s.count(0));
  EXPECT_EQ(ops::torch_cpu_topk_set(values, 4), ties);  // same input, same choice
  std::vector<float> many(200, 1.0f);  // k * 64 <= n: the partial_sort path
  many[150] = 3.0f;
  const auto fast = ops::torch_cpu_topk_set(many, 1);
  EXPECT_EQ(fast, std::vector<int32_t>{150});
}

}  // namespace
}  // namespace r3::test
