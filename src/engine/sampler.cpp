#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace r3::engine {

void SamplingParams::validate() const {
  R3_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature must be >= 0, got ",
           temperature);
  R3_CHECK(top_p > 0 && top_p <= 1, "top-p must be in (0, 1], got ", top_p);
  R3_CHECK(top_k >= 0, "top-k must be >= 0, got ", top_k);
  R3_CHECK(min_p >= 0 && min_p <= 1, "min-p must be in [0, 1], got ", min_p);
}

int32_t argmax(std::span<const float> logits) {
  R3_CHECK(!logits.empty(), "argmax of empty logits");
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

uint64_t sample_seed(uint64_t seed, int64_t index) {
  R3_CHECK(index >= 0, "sample index must be >= 0, got ", index);
  if (index == 0) return seed;
  // The index-th output of a splitmix64 stream started at seed: the odd increment makes the
  // states distinct for distinct indices and the finaliser is a bijection, so no two indices >= 1
  // share a seed.
  uint64_t z = seed + static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  params_.validate();
}

double Sampler::draw() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::next(std::span<const float> logits) {
  return choose_token(logits, params_, params_.temperature == 0.0 ? 0.0 : draw());
}

int32_t choose_token(std::span<const float> logits, const SamplingParams& params, double uniform) {
  if (params.temperature == 0.0) return argmax(logits);
  const auto vocab = static_cast<int64_t>(logits.size());
  const float max_logit = logits[static_cast<std::size_t>(argmax(logits))];
  std::vector<double> weight(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    weight[i] = std::exp(static_cast<double>(logits[i] - max_logit) / params.temperature);
  }
  std::vector<char> kept(logits.size(), 1);
  const bool top_k = params.top_k > 0 && params.top_k < vocab;
  if (top_k || params.top_p < 1.0) {
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    auto keep = static_cast<std::size_t>(top_k ? params.top_k : vocab);
    if (params.top_p < 1.0) {
      // Nucleus: the shortest prefix (by logit) whose share of the top-k weight reaches top_p.
      double total = 0;
      for (std::size_t i = 0; i < keep; ++i) total += weight[static_cast<std::size_t>(order[i])];
      double mass = 0;
      for (std::size_t i = 0; i < keep; ++i) {
        mass += weight[static_cast<std::size_t>(order[i])];
        if (mass >= params.top_p * total) {
          keep = i + 1;
          break;
        }
      }
    }
    std::fill(kept.begin(), kept.end(), 0);
    for (std::size_t i = 0; i < keep; ++i) kept[static_cast<std::size_t>(order[i])] = 1;
  }
  double kept_weight = 0;
  int64_t last = -1;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    // Min-p; the largest logit (w = 1 >= min_p) always stays.
    if (kept[i] && weight[i] < params.min_p) kept[i] = 0;
    if (kept[i]) {
      kept_weight += weight[i];
      last = static_cast<int64_t>(i);
    }
  }
  const double target = uniform * kept_weight;
  double running = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (!kept[i]) continue;
    running += weight[i];
    if (running > target) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);
}

}  // namespace r3::engine
