#include "ops/interleaved_rotary.h"

#include <cmath>

#include "core/check.h"

namespace r3::ops {

TrailingInterleavedRotary::TrailingInterleavedRotary(int64_t rope_dim, double theta) : rope_dim_(rope_dim) {
  R3_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rotary dim must be even and positive, got ", rope_dim);
  const auto base = static_cast<float>(theta);
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    inv_freq_.push_back(1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(rope_dim)));
  }
}

TrailingInterleavedRotary::TrailingInterleavedRotary(int64_t rope_dim, std::vector<float> inv_freq,
                                                     float attention_scaling)
    : rope_dim_(rope_dim), inv_freq_(std::move(inv_freq)), attention_scaling_(attention_scaling) {
  R3_CHECK(static_cast<int64_t>(inv_freq_.size()) * 2 == rope_dim, "rotary: ", inv_freq_.size(),
           " frequencies for rope dim ", rope_dim);
}

void TrailingInterleavedRotary::apply(float* x, int64_t heads, int64_t head_dim, int64_t pos, bool conjugate) const {
  R3_CHECK(head_dim >= rope_dim_, "rotary: head_dim ", head_dim, " < rope dim ", rope_dim_);
  const int64_t half = rope_dim_ / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq_[static_cast<std::size_t>(i)];  // float32 product
    const float c = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scaling_;
    const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scaling_ * (conjugate ? -1.0f : 1.0f);
    for (int64_t h = 0; h < heads; ++h) {
      float* pair = x + h * head_dim + (head_dim - rope_dim_) + 2 * i;
      const float a = pair[0], b = pair[1];
      pair[0] = a * c - b * s;
      pair[1] = b * c + a * s;
    }
  }
}

namespace cpu {

void interleaved_rotary(backend::Context&, const TrailingInterleavedRotary& rotary, Tensor& x, const int32_t* positions) {
  R3_CHECK(x.rank() == 3 && x.dtype() == DType::F32 && x.is_contiguous(), "interleaved rotary: x ",
           shape_to_string(x.shape()));
  const int64_t tokens = x.dim(0), heads = x.dim(1), head_dim = x.dim(2);
  for (int64_t t = 0; t < tokens; ++t) rotary.apply(x.data<float>() + t * heads * head_dim, heads, head_dim, positions[t]);
}

}  // namespace cpu

}  // namespace r3::ops
