// DeepSeek-V4 pieces that parity alone does not pin down: its config, its routing rules and
// the PyTorch-compatible top-k the indexer relies on.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "models/deepseek_v4/v4_spec.h"
#include "models/registry.h"
#include "moe/routing_rule.h"
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
}

TEST(DeepseekV4Config, RefusesWhatIsNotImplemented) {
  auto j = v4_config();
  j["rope_parameters"]["compress"]["rope_type"] = "yarn";
  EXPECT_NE(v4_error(j).find("rope_type 'yarn' is not supported for deepseek_v4"), std::string::npos) << v4_error(j);
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
