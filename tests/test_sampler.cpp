// Sampling: greedy ties, reproducibility by seed, top-k / top-p / min-p limits, the drawn
// frequencies against the distribution (chi-square), per-sample seeds, parameter checks.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

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

// Logits whose softmax at temperature 1 is exactly the given probabilities.
std::vector<float> sampler_logits_of(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (const double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

TEST(Sampler, MinPDropsTokensBelowTheThreshold) {
  // Threshold 0.2 * 0.5 = 0.1: token 3 (0.05) goes, token 2 (0.15) stays.
  const auto logits = sampler_logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p{.temperature = 1.0, .min_p = 0.2, .seed = 11};
  Sampler with_min_p(p);
  std::array<int, 4> counts{};
  for (int i = 0; i < 20000; ++i) ++counts.at(static_cast<std::size_t>(with_min_p.next(logits)));
  EXPECT_EQ(counts[3], 0);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);

  // Without min-p the same draws do reach token 3, so the zero above is the filter's doing.
  p.min_p = 0.0;
  Sampler without(p);
  int threes = 0;
  for (int i = 0; i < 20000; ++i) threes += without.next(logits) == 3;
  EXPECT_GT(threes, 0);
}

TEST(Sampler, MinPThatDropsNothingLeavesTheDrawsUnchanged) {
  // The smallest probability ratio here is far above 1e-12, so the filter removes nothing and
  // every token must equal the min-p = 0 draw of the same seed.
  std::vector<float> logits(50);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 7) * 0.3f;
  Sampler off(SamplingParams{.temperature = 0.8, .top_p = 0.9, .top_k = 30, .seed = 5});
  Sampler tiny(SamplingParams{.temperature = 0.8, .top_p = 0.9, .top_k = 30, .min_p = 1e-12,
                              .seed = 5});
  for (int i = 0; i < 500; ++i) EXPECT_EQ(off.next(logits), tiny.next(logits));
}

TEST(Sampler, MinPOneIsGreedy) {
  const std::vector<float> logits = {0.3f, 1.2f, -0.5f, 1.1f, 0.9f};
  Sampler s(SamplingParams{.temperature = 1.5, .min_p = 1.0, .seed = 3});
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.next(logits), argmax(logits));
}

TEST(Sampler, RejectsMinPOutOfRange) {
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1, .min_p = -0.1}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1, .min_p = 1.5}), Error);
  EXPECT_THROW(Sampler(SamplingParams{.temperature = 1,
                                      .min_p = std::numeric_limits<double>::quiet_NaN()}),
               Error);
  EXPECT_NO_THROW(Sampler(SamplingParams{.temperature = 1, .min_p = 0.0}));
  EXPECT_NO_THROW(Sampler(SamplingParams{.temperature = 1, .min_p = 1.0}));
}

TEST(Sampler, FrequenciesMatchTheDistributionChiSquare) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  const auto logits = sampler_logits_of(probs);
  constexpr int kDraws = 20000;
  Sampler s(SamplingParams{.temperature = 1.0, .seed = 2024});
  std::array<int, 4> counts{};
  for (int i = 0; i < kDraws; ++i) ++counts.at(static_cast<std::size_t>(s.next(logits)));
  double chi2 = 0;
  for (std::size_t t = 0; t < probs.size(); ++t) {
    const double expected = kDraws * probs[t];
    chi2 += (counts[t] - expected) * (counts[t] - expected) / expected;
  }
  // 16.27 is the chi-square quantile for 3 degrees of freedom at p = 0.001.
  EXPECT_LT(chi2, 16.27) << counts[0] << " " << counts[1] << " " << counts[2] << " " << counts[3];
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const double temperature : {0.05, 0.7, 1.0, 5.0, 1000.0}) {
    for (int row = 0; row < 20; ++row) {
      std::vector<float> logits(257);
      for (float& x : logits) x = normal(gen);
      Sampler s(SamplingParams{.temperature = temperature, .top_k = 1,
                               .seed = static_cast<uint64_t>(row)});
      for (int i = 0; i < 5; ++i) EXPECT_EQ(s.next(logits), argmax(logits)) << temperature;
    }
  }
}

TEST(Sampler, SampleSeedIndexZeroIsTheSeedOthersDistinct) {
  for (const uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{42}, ~uint64_t{0}}) {
    EXPECT_EQ(sample_seed(seed, 0), seed);
    std::set<uint64_t> seeds;
    for (int64_t i = 0; i < 8; ++i) {
      seeds.insert(sample_seed(seed, i));
      EXPECT_EQ(sample_seed(seed, i), sample_seed(seed, i));  // a pure function of its inputs
    }
    EXPECT_EQ(seeds.size(), 8u) << seed;
  }
  // Neighbouring seeds do not give neighbouring streams: index 1 of seeds 0 and 1 differ in many
  // bits, not one.
  EXPECT_GT(std::popcount(sample_seed(0, 1) ^ sample_seed(1, 1)), 16);
  EXPECT_THROW(sample_seed(0, -1), Error);
}

}  // namespace
}  // namespace r3::engine
