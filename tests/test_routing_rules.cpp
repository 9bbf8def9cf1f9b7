// Routing rules on crafted scores: group-limited selection (DeepSeek-V3 / Kimi K2 / GLM-4.5).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <type_traits>

#include "core/check.h"
#include "core/tensor.h"
#include "moe/device_routing.h"
#include "moe/routing_rule.h"

namespace r3::moe {
namespace {

// Logits whose sigmoid is exactly `p` (up to float rounding).
std::vector<float> logits_for(const std::vector<double>& p) {
  std::vector<float> out;
  for (double v : p) out.push_back(static_cast<float>(std::log(v / (1 - v))));
  return out;
}

std::set<int32_t> route(const SigmoidGroupTopK& rule, std::vector<float> logits, std::vector<float>* weights = nullptr) {
  std::vector<int32_t> ids(static_cast<std::size_t>(rule.top_k()));
  std::vector<float> w(ids.size());
  rule.route(logits, 0, {}, ids.data(), w.data());
  if (weights) *weights = w;
  return {ids.begin(), ids.end()};
}

TEST(SigmoidGroupTopK, MaskedGroupsNeverWinEvenWithTheBestBiasedScore) {
  // 4 groups of 2; group scores (sum of the two best) pick groups 0 and 1. Expert 7 alone has the
  // largest biased score, but its group (3) is not among the best two groups.
  const std::vector<double> p = {0.9, 0.8, 0.7, 0.7, 0.1, 0.1, 0.1, 0.2};
  std::vector<float> bias(8, 0.0f);
  bias[7] = 1.05f;  // 0.2 + 1.05 = 1.25, above every other choice; group 3 sums to 1.35 < 1.4
  const SigmoidGroupTopK rule(2, bias, 4, 2, true, 1.0f);
  EXPECT_EQ(route(rule, logits_for(p)), (std::set<int32_t>{0, 1}));
}

TEST(SigmoidGroupTopK, BiasSelectsButWeightsComeFromUnbiasedScores) {
  const std::vector<double> p = {0.5, 0.6, 0.4, 0.3};
  const SigmoidGroupTopK rule(2, {0.0f, 0.0f, 0.5f, 0.0f}, 1, 1, false, 2.5f);
  std::vector<float> w;
  EXPECT_EQ(route(rule, logits_for(p), &w), (std::set<int32_t>{1, 2}));  // 0.4 + 0.5 beats 0.6
  EXPECT_NEAR(w[0] + w[1], (0.6 + 0.4) * 2.5, 1e-5);  // not renormalised, scaled
}

TEST(SigmoidGroupTopK, AllGroupsEligibleEqualsPlainTopK) {
  const std::vector<double> p = {0.2, 0.9, 0.3, 0.8, 0.7, 0.1};
  const SigmoidGroupTopK grouped(3, std::vector<float>(6, 0.0f), 3, 3, true, 1.0f);  // topk_group == n_group
  EXPECT_EQ(route(grouped, logits_for(p)), (std::set<int32_t>{1, 3, 4}));
  std::vector<float> w;
  route(grouped, logits_for(p), &w);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
}

TEST(SigmoidGroupTopK, TiedGroupsResolveToTheLowerGroup) {
  // Groups 0 and 1 tie exactly (same scores); one group is kept: group 0, deterministically.
  const std::vector<double> p = {0.6, 0.4, 0.6, 0.4};
  const SigmoidGroupTopK rule(2, std::vector<float>(4, 0.0f), 2, 1, true, 1.0f);
  EXPECT_EQ(route(rule, logits_for(p)), (std::set<int32_t>{0, 1}));
}

TEST(SigmoidGroupTopK, ImpossibleConfigurationsAreErrors) {
  EXPECT_THROW(SigmoidGroupTopK(2, std::vector<float>(6, 0.0f), 4, 1, true, 1.0f), Error);  // 6 into 4 groups
  EXPECT_THROW(SigmoidGroupTopK(2, std::vector<float>(8, 0.0f), 4, 5, true, 1.0f), Error);  // topk_group > n_group
  EXPECT_THROW(SigmoidGroupTopK(5, std::vector<float>(8, 0.0f), 4, 2, true, 1.0f), Error);  // 5 from 2 groups of 2
}

TEST(SigmoidGroupTopK, ForcedRoutingBypassesTheGroupLimit) {
  const std::vector<double> p = {0.9, 0.8, 0.1, 0.2};
  const SigmoidGroupTopK rule(2, std::vector<float>(4, 0.0f), 2, 1, true, 1.0f);
  std::vector<float> logits = logits_for(p);
  const std::vector<int32_t> forced = {2, 3};  // replaying a routing outside the best group
  int32_t ids[2];
  float w[2];
  rule.route(logits, 0, forced, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0], 0.1 / 0.3, 1e-5);
}

// DeepSeek-V4 hash layers route token t to the experts tid2eid[t]; a row naming one expert twice
// would run it twice for the token, so it is refused when the table loads.
TEST(SqrtSoftplusHash, RepeatedExpertInATokensRowIsRefused) {
  for (const DType dtype : {DType::I64, DType::I32}) {
    const std::vector<int64_t> values = {0, 1, 2, 3, 4, 2, 1, 5, 1};  // token 2 lists expert 1 twice
    Tensor table = dtype == DType::I64 ? Tensor::from(values, {3, 3})
                                       : Tensor::from(std::vector<int32_t>(values.begin(), values.end()), {3, 3});
    try {
      SqrtSoftplusHash(table, 8, 1.0f);
      ADD_FAILURE() << "a repeated expert id was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token 2 lists expert 1 twice"), std::string::npos) << e.what();
    }
  }
  const Tensor distinct = Tensor::from<int64_t>({0, 1, 2, 3, 4, 2, 1, 5, 7}, {3, 3});
  EXPECT_NO_THROW(SqrtSoftplusHash(distinct, 8, 1.0f));
}

// Routing margins on crafted scores: the k-th choice's selection score minus the best one left out.
float margin_of(const RoutingRule& rule, std::vector<float> logits, std::span<const int32_t> forced = {},
                int32_t token = 0) {
  std::vector<int32_t> ids(static_cast<std::size_t>(rule.top_k()));
  std::vector<float> w(ids.size());
  float margin = -1;
  rule.route(logits, token, forced, ids.data(), w.data(), &margin);
  return margin;
}

// On the GPU as on the CPU, the capture point is a type: only route_on_device makes a captured
// routing, and the experts take only a physical routing, which comes out of the EPLB map or, for a
// layer without replicas, from the captured routing itself. Neither is made from raw ids, and a
// captured routing does not pass for a physical one (checked when this file compiles).
static_assert(!std::is_constructible_v<DeviceCapturedRouting, const int32_t*, const float*, int64_t, int64_t>);
static_assert(!std::is_constructible_v<DevicePhysicalRouting, const int32_t*, const float*, int64_t, int64_t>);
static_assert(!std::is_convertible_v<DeviceCapturedRouting, DevicePhysicalRouting>);
static_assert(!std::is_constructible_v<DevicePhysicalRouting, DeviceCapturedRouting>);

// A rule's numbers live in its class; the device kernel takes them from parameters(), with no
// second description of the rule to keep in step.
TEST(RuleParameters, TheDeviceKernelTakesEachRuleAsItWasBuilt) {
  const DeviceRuleDescription softmax = describe_for_device(SoftmaxTopK(6, true));
  EXPECT_EQ(softmax.rule.kind, RuleKind::kSoftmaxTopK);
  EXPECT_EQ(softmax.rule.k, 6);
  EXPECT_TRUE(softmax.rule.normalize);
  EXPECT_TRUE(softmax.bias.empty());

  const DeviceRuleDescription grouped =
      describe_for_device(SigmoidGroupTopK(4, {0.5f, -1.0f, 0.25f, 2.0f, 0, 0, 0, 0}, 4, 2, false, 2.5f));
  EXPECT_EQ(grouped.rule.kind, RuleKind::kSigmoidGroupTopK);
  EXPECT_EQ(grouped.rule.k, 4);
  EXPECT_FALSE(grouped.rule.normalize);
  EXPECT_EQ(grouped.rule.groups, 4);
  EXPECT_EQ(grouped.rule.topk_groups, 2);
  EXPECT_EQ(grouped.rule.scaling, 2.5f);
  EXPECT_EQ(grouped.bias, (std::vector<float>{0.5f, -1.0f, 0.25f, 2.0f, 0, 0, 0, 0}));
  EXPECT_EQ(grouped.rule.bias, nullptr);  // the caller uploads the bias and points at its copy

  const DeviceRuleDescription greedy = describe_for_device(SoftmaxGroupGreedy(3, 8, 3, 16.0f));
  EXPECT_EQ(greedy.rule.kind, RuleKind::kSoftmaxGroupGreedy);
  EXPECT_EQ(greedy.rule.k, 3);
  EXPECT_EQ(greedy.rule.groups, 8);
  EXPECT_EQ(greedy.rule.topk_groups, 3);
  EXPECT_EQ(greedy.rule.scaling, 16.0f);

  const DeviceRuleDescription gpt_oss = describe_for_device(TopKSoftmax(4));
  EXPECT_EQ(gpt_oss.rule.kind, RuleKind::kTopKSoftmax);
  EXPECT_EQ(gpt_oss.rule.k, 4);
}

TEST(RuleParameters, RulesWithoutADeviceKernelAreRefusedByName) {
  const SqrtSoftplusTopK v4(2, {0, 0, 0, 0}, 1.5f);
  EXPECT_EQ(v4.parameters().kind, RuleKind::kSqrtSoftplusTopK);
  EXPECT_EQ(v4.parameters().bias.size(), 4u);
  try {
    (void)describe_for_device(v4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sqrtsoftplus-topk has no CUDA kernel"), std::string::npos) << e.what();
  }
}

TEST(RoutingMargins, SoftmaxTopKIsTheGapBetweenTheKthAndTheNextProbability) {
  const std::vector<float> logits = {2.0f, 0.5f, 1.0f, 0.9f};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  const double p1 = std::exp(1.0) / z, p3 = std::exp(0.9) / z;  // 2nd and 3rd most likely
  EXPECT_NEAR(margin_of(SoftmaxTopK(2, true), logits), p1 - p3, 1e-6);
  // Renormalising the weights does not change the margin: it is taken on the selection scores.
  EXPECT_NEAR(margin_of(SoftmaxTopK(2, false), logits), p1 - p3, 1e-6);
}

TEST(RoutingMargins, TopKSoftmaxIsTakenOnTheRawLogits) {
  EXPECT_FLOAT_EQ(margin_of(TopKSoftmax(2), {3.0f, -1.0f, 2.5f, 2.25f}), 0.25f);
}

TEST(RoutingMargins, GroupLimitedRulesLeaveMaskedExpertsOut) {
  // As MaskedGroupsNeverWinEvenWithTheBestBiasedScore: groups 0 and 1 are eligible; expert 7 has
  // the best biased score of all but sits in a masked group, so it does not shrink the margin.
  const std::vector<double> p = {0.9, 0.8, 0.7, 0.7, 0.1, 0.1, 0.1, 0.2};
  std::vector<float> bias(8, 0.0f);
  bias[7] = 1.05f;
  const SigmoidGroupTopK rule(2, bias, 4, 2, true, 1.0f);
  EXPECT_NEAR(margin_of(rule, logits_for(p)), 0.8 - 0.7, 1e-6);
  // Every eligible expert chosen: nothing eligible was left out.
  const SigmoidGroupTopK all(4, bias, 4, 2, true, 1.0f);
  EXPECT_EQ(margin_of(all, logits_for(p)), INFINITY);
  // DeepSeek-V2's greedy groups: probabilities, masked groups at 0.
  const SoftmaxGroupGreedy greedy(1, 2, 1, 1.0f);
  const std::vector<float> logits = {1.0f, 0.0f, 3.0f, 2.9f};  // groups {0,1} and {2,3}: group 1 wins
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(margin_of(greedy, logits), (std::exp(3.0) - std::exp(2.9)) / z, 1e-6);
}

TEST(RoutingMargins, RowsNotChosenByScoresHaveNone) {
  const std::vector<int32_t> forced = {3, 1};
  EXPECT_TRUE(std::isnan(margin_of(SoftmaxTopK(2, true), {2.0f, 0.5f, 1.0f, 0.9f}, forced)));
  const Tensor table = Tensor::from<int64_t>({0, 1, 2, 3}, {2, 2});
  EXPECT_TRUE(std::isnan(margin_of(SqrtSoftplusHash(table, 4, 1.0f), {0.1f, 0.2f, 0.3f, 0.4f}, {}, 1)));
}

}  // namespace
}  // namespace r3::moe
