// Rotary frequencies: plain RoPE and YaRN, computed as transformers computes them (float32).
#pragma once

#include <cstdint>
#include <vector>

namespace r3::ops {

struct RopeScaling {
  enum class Kind { kDefault, kYarn } kind = Kind::kDefault;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: not given
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 0.0;  // 0: derived
  double mscale = 0.0, mscale_all_dim = 0.0;
};

struct RopeFrequencies {
  std::vector<float> inv_freq;     // [rotary_dim / 2]
  float attention_scaling = 1.0f;  // multiplies cos and sin
};

// max_position_embeddings: the config's; YaRN's correction range uses
// original_max_position_embeddings instead when the config gives it.
RopeFrequencies rope_frequencies(int64_t rotary_dim, double theta, const RopeScaling& scaling,
                                 int64_t max_position_embeddings);

// DeepSeek's softmax scale correction under YaRN: (0.1 * mscale_all_dim * ln(factor) + 1)^2.
double yarn_softmax_scale_factor(const RopeScaling& scaling);

}  // namespace r3::ops
