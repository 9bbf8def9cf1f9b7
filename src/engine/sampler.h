// Next-token choice from logits: greedy at temperature 0, otherwise the filters in this order --
// temperature, top-k, top-p (nucleus), min-p -- and a draw from a seeded generator (same seed,
// same tokens).
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace r3::engine {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // 0: no limit
  double min_p = 0.0;        // [0, 1]; drops tokens below min_p * the largest probability; 0: off
  uint64_t seed = 0;

  void validate() const;  // throws r3::Error on out-of-range values
};

// Greedy choice: the largest logit, the lowest id on ties.
int32_t argmax(std::span<const float> logits);

// Seed of the index-th of n samples of one request. Index 0 is the seed itself, so a single
// sample draws what it always did; the others are splitmix64 outputs, well apart from each other
// and the same on every platform (plain 64-bit integer arithmetic).
uint64_t sample_seed(uint64_t seed, int64_t index);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t next(std::span<const float> logits);

 private:
  double uniform();  // [0, 1) from the raw generator, identical on every platform

  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace r3::engine
