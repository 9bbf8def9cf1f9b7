// Sampling: greedy ties, reproducibility by seed, top-k / top-p limits, parameter checks.
#include <gtest/gtest.h>

#include <set>

#include "core/check.h"
#include "engine/sampler.h"

namespace r3::engine {
namespace {

TEST(Sampler, GreedyTakesLargestLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(argmax(logits), 1);
  Sampler greedy(SamplingParams{});
  EXPECT_EQ(greedy.next(logits), 1);
}

TEST(Sampler, SameSeedSameTokensAndTopKLimits) {
  std::vector<float> logits(50);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 7) * 0.3f;
  SamplingParams p{.temperature = 1.0, .top_p = 1.0, .top_k = 0, .seed = 7};
  Sampler a(p), b(p);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) {
    const int32_t x = a.next(logits);
    EXPECT_EQ(x, b.next(logits));
    seen.insert(x);
  }
  EXPECT_GT(seen.size(), 10u);  // it really samples

  p.top_k = 1;
  Sampler k1(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.next(logits), argmax(logits));

  p.top_k = 3;
  Sampler k3(p);
  // The three largest logits (0.3 * 6) are ids 6, 13, 20.
  for (int i = 0; i < 100; ++i) {
    const int32_t x = k3.next(logits);
    EXPECT_TRUE(x == 6 || x == 13 || x == 20) << x;
  }
}

TEST(Sampler, TinyTopPIsGreedy) {
  const std::vector<float> logits = {0.0f, 1.0f, 5.0f, 0.5f};
  Sampler s(SamplingParams{.temperature = 2.0, .top_p = 0.01, .top_k = 0, .seed = 1});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.next(logits), 2);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_THROW(Sampler(SamplingParams{.temperature = -1}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1, .top_p = 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1, .top_p = 1.5}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1, .top_p = 1, .top_k = -2}), Error);
}

}  // namespace
}  // namespace r3::engine
