#include "ops/rotary.h"

#include <cmath>

namespace r3::ops {

Rotary::Rotary(int64_t rotary_dim, double theta) : rotary_dim_(rotary_dim) {
  R3_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary dim must be even and positive, got ",
           rotary_dim);
  const auto base = static_cast<float>(theta);
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv_freq_.push_back(1.0f / std::pow(base, exponent));
  }
}

Rotary::Rotary(int64_t rotary_dim, std::vector<float> inv_freq, float attention_scaling)
    : rotary_dim_(rotary_dim), inv_freq_(std::move(inv_freq)), attention_scaling_(attention_scaling) {
  R3_CHECK(static_cast<int64_t>(inv_freq_.size()) * 2 == rotary_dim, "rotary: ", inv_freq_.size(),
           " frequencies for rotary dim ", rotary_dim);
}

}  // namespace r3::ops
