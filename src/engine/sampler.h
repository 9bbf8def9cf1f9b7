// Next-token choice from logits: greedy at temperature 0, otherwise the filters in this order --
// temperature, top-k, top-p (nucleus), min-p -- and a draw from a seeded generator (same seed,
// same tokens). The choice given the draw is a pure function (choose_token), so a device that
// draws from its logits itself (ops/token_draw.h) takes the request's uniform from the Sampler
// and picks what the host would.
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
// sample draws with the seed as given; the others are splitmix64 outputs, well apart from each other
// and the same on every platform (plain 64-bit integer arithmetic).
uint64_t sample_seed(uint64_t seed, int64_t index);

// The token `uniform` (in [0, 1)) picks from `logits` under `params`:
// - temperature 0: argmax.
// - otherwise weights w_i = exp((logit_i - max) / temperature) in double. The kept tokens are the
//   top_k largest logits (ties: lower id first), of those the shortest prefix (by logit) whose
//   normalised mass reaches top_p, and of those the ones with w_i >= min_p (the largest has w = 1,
//   so min_p is relative to it; at least that one stays).
// - the draw walks the kept tokens in id order and takes the first whose running weight exceeds
//   uniform * (the kept weight); the last kept token when rounding leaves none.
// Walking in id order, not by probability, needs no sort when no top-k / top-p filter is set, and
// it is what a device does with a prefix sum over the vocabulary; the distribution is the same.
int32_t choose_token(std::span<const float> logits, const SamplingParams& params, double uniform);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // choose_token with this step's draw (one draw per step at temperature > 0, none when greedy).
  int32_t next(std::span<const float> logits);
  // The draw of the next step that samples: [0, 1) from the raw generator, identical on every
  // platform. Greedy steps take none.
  double draw();
  const SamplingParams& params() const { return params_; }

 private:

  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace r3::engine
