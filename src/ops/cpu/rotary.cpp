#include "ops/rotary.h"

#include <cmath>

namespace r3::ops::cpu {

void rotary(const Rotary& rotary, Tensor& x, std::span<const int32_t> positions) {
  R3_CHECK(x.rank() == 3 && x.is_contiguous(), "rotary: x must be [tokens, heads, head_dim]");
  const int64_t tokens = x.dim(0), heads = x.dim(1), head_dim = x.dim(2);
  R3_CHECK(head_dim >= rotary.rotary_dim(), "rotary: head_dim ", head_dim, " < rotary dim ", rotary.rotary_dim());
  R3_CHECK(static_cast<int64_t>(positions.size()) == tokens, "rotary: positions size");
  const int64_t half = rotary.rotary_dim() / 2;
  float* xp = x.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * rotary.inv_freq()[static_cast<std::size_t>(i)];  // float32 product
      const float c = static_cast<float>(std::cos(static_cast<double>(angle))) * rotary.attention_scaling();
      const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * rotary.attention_scaling();
      for (int64_t h = 0; h < heads; ++h) {
        float* v = xp + (t * heads + h) * head_dim;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace r3::ops::cpu
