// Raw log-probabilities: log-softmax against a double-precision reference, extreme logits, and the
// order of the top-n list.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/check.h"
#include "engine/logprobs.h"
#include "engine/sampler.h"

namespace r3::engine {
namespace {

std::vector<float> logprobs_random_logits(std::size_t vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = uniform(gen);
  return logits;
}

TEST(Logprobs, ExpSumsToOne) {
  for (const unsigned seed : {1u, 2u, 3u}) {
    const auto logits = logprobs_random_logits(1000, seed);
    std::vector<float> out(logits.size());
    log_softmax(logits, out);
    double sum = 0;
    for (const float lp : out) sum += std::exp(static_cast<double>(lp));
    EXPECT_NEAR(sum, 1.0, 1e-6) << seed;
  }
}

TEST(Logprobs, ArgmaxTokenHasTheLargestLogprob) {
  const auto logits = logprobs_random_logits(1000, 4);
  std::vector<float> out(logits.size());
  log_softmax(logits, out);
  EXPECT_EQ(out[static_cast<std::size_t>(argmax(logits))], *std::max_element(out.begin(), out.end()));
  EXPECT_LT(*std::max_element(out.begin(), out.end()), 0.0f);
}

TEST(Logprobs, MatchesDoubleReference) {
  const auto logits = logprobs_random_logits(1000, 5);
  std::vector<float> out(logits.size());
  log_softmax(logits, out);
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(x - m);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(out[i], std::log(std::exp(logits[i] - m) / sum), 1e-6) << i;
  }
}

TEST(Logprobs, HugeLogitsStayFinite) {
  // exp(1e30) overflows any float type; the max-subtracted form gives the exact answer: the two
  // 1e30 tokens share the mass, the others sit 1e30 or 2e30 below in log space.
  const std::vector<float> logits = {1e30f, -1e30f, 0.0f, 1e30f, -1e30f};
  std::vector<float> out(logits.size());
  log_softmax(logits, out);
  for (const float lp : out) EXPECT_TRUE(std::isfinite(lp)) << lp;
  EXPECT_NEAR(out[0], std::log(0.5), 1e-6);
  EXPECT_NEAR(out[3], std::log(0.5), 1e-6);
  EXPECT_FLOAT_EQ(out[2], -1e30f);
  EXPECT_FLOAT_EQ(out[1], -2e30f);
  EXPECT_FLOAT_EQ(out[4], -2e30f);
}

TEST(Logprobs, MaskedTokensAndBadInput) {
  // -inf is a masked token (probability 0, log-probability -inf); the rest is still normalised.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> masked = {0.0f, -inf, 0.0f};
  std::vector<float> out(masked.size());
  log_softmax(masked, out);
  EXPECT_NEAR(out[0], std::log(0.5), 1e-6);
  EXPECT_EQ(out[1], -inf);

  const std::vector<float> with_nan = {0.0f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THROW(log_softmax(with_nan, out), Error);
  const std::vector<float> with_inf = {0.0f, inf, 1.0f};
  EXPECT_THROW(log_softmax(with_inf, out), Error);
  std::vector<float> short_out(2);
  EXPECT_THROW(log_softmax(masked, short_out), Error);
  EXPECT_THROW(log_softmax({}, short_out), Error);
}

TEST(Logprobs, TopLogprobsHighestFirstLowerIdOnTies) {
  const std::vector<float> lps = {-2.0f, -1.0f, -3.0f, -1.0f, -0.5f};
  const auto top = top_logprobs(lps, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 4);
  EXPECT_EQ(top[0].logprob, -0.5f);
  EXPECT_EQ(top[1].token, 1);  // ties at -1: id 1 before id 3
  EXPECT_EQ(top[2].token, 3);
  EXPECT_EQ(top[2].logprob, -1.0f);

  // Many ties: the result is the head of a stable sort by descending logprob.
  std::mt19937 gen(9);
  std::uniform_int_distribution<int> level(0, 9);
  std::vector<float> coarse(300);
  for (float& x : coarse) x = -0.25f * static_cast<float>(level(gen));
  std::vector<int32_t> order(coarse.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return coarse[a] > coarse[b]; });
  const auto top40 = top_logprobs(coarse, 40);
  ASSERT_EQ(top40.size(), 40u);
  for (std::size_t i = 0; i < top40.size(); ++i) {
    EXPECT_EQ(top40[i].token, order[i]) << i;
    EXPECT_EQ(top40[i].logprob, coarse[order[i]]) << i;
  }
}

TEST(Logprobs, TopLogprobsClampsN) {
  const std::vector<float> lps = {-1.5f, -0.1f, -2.5f};
  const auto all = top_logprobs(lps, 10);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].token, 1);
  EXPECT_EQ(all[1].token, 0);
  EXPECT_EQ(all[2].token, 2);
  EXPECT_TRUE(top_logprobs(lps, 0).empty());
  EXPECT_TRUE(top_logprobs(lps, -4).empty());
  EXPECT_TRUE(top_logprobs({}, 5).empty());
}

}  // namespace
}  // namespace r3::engine
