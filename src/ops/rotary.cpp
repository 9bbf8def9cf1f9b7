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

void Rotary::apply(Tensor& x, const std::vector<int32_t>& positions) const {
  R3_CHECK(x.rank() == 3 && x.is_contiguous(), "rotary: x must be [tokens, heads, head_dim]");
  const int64_t tokens = x.dim(0), heads = x.dim(1), head_dim = x.dim(2);
  R3_CHECK(head_dim >= rotary_dim_, "rotary: head_dim ", head_dim, " < rotary dim ", rotary_dim_);
  R3_CHECK(static_cast<int64_t>(positions.size()) == tokens, "rotary: positions size");
  const int64_t half = rotary_dim_ / 2;
  float* xp = x.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq_[static_cast<std::size_t>(i)];  // float32 product
      const float c = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scaling_;
      const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scaling_;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = xp + (t * heads + h) * head_dim;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace r3::ops
