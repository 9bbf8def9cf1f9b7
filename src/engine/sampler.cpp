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

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::next(std::span<const float> logits) {
  if (params_.temperature == 0.0) return argmax(logits);
  const auto vocab = static_cast<int64_t>(logits.size());
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int64_t keep_k = params_.top_k > 0 ? std::min(params_.top_k, vocab) : vocab;
  order.resize(static_cast<std::size_t>(keep_k));

  std::vector<double> probs(order.size());
  const double max_logit = logits[order[0]];
  double sum = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    probs[i] = std::exp((logits[order[i]] - max_logit) / params_.temperature);
    sum += probs[i];
  }
  // Nucleus: the smallest prefix (by probability) whose mass reaches top_p.
  std::size_t keep = probs.size();
  double mass = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    probs[i] /= sum;
    mass += probs[i];
    if (mass >= params_.top_p) {
      keep = i + 1;
      break;
    }
  }
  // Min-p: probs are sorted, so the tokens under min_p * probs[0] are a tail of the kept prefix.
  // Skipped at 0 so that the draw stays exactly what it was before min-p existed.
  if (params_.min_p > 0) {
    const double threshold = params_.min_p * probs[0];
    while (keep > 1 && probs[keep - 1] < threshold) --keep;
  }
  double kept_mass = 0;
  for (std::size_t i = 0; i < keep; ++i) kept_mass += probs[i];
  double draw = uniform() * kept_mass;
  for (std::size_t i = 0; i < keep; ++i) {
    draw -= probs[i];
    if (draw < 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace r3::engine
