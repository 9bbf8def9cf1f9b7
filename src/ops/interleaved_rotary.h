// Rotary embedding in DeepSeek-V4's layout: consecutive channel pairs (2i, 2i+1) rotate
// together, on the trailing `rope_dim` channels of each head ([nope | rope]).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

class TrailingInterleavedRotary {
 public:
  // inv_freq[i] = 1 / theta^(2i / rope_dim) in float32, as transformers computes it.
  TrailingInterleavedRotary(int64_t rope_dim, double theta);
  // Precomputed frequencies (YaRN); cos and sin are multiplied by attention_scaling.
  TrailingInterleavedRotary(int64_t rope_dim, std::vector<float> inv_freq, float attention_scaling);

  int64_t rope_dim() const { return rope_dim_; }
  std::span<const float> inv_freq() const { return inv_freq_; }
  float attention_scaling() const { return attention_scaling_; }
  // Rotates the last rope_dim of `head_dim` channels of `heads` consecutive heads at `x` by
  // position `pos`; conjugate = true rotates by -angle (undoes a rotation at that position).
  void apply(float* x, int64_t heads, int64_t head_dim, int64_t pos, bool conjugate = false) const;

 private:
  int64_t rope_dim_;
  std::vector<float> inv_freq_;
  float attention_scaling_ = 1.0f;
};

namespace cpu {  // ops/interleaved_rotary.cpp
void interleaved_rotary(backend::Context& ctx, const TrailingInterleavedRotary& rotary, Tensor& x,
                        const int32_t* positions);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_rotary.cu
void interleaved_rotary(backend::Context& ctx, const TrailingInterleavedRotary& rotary, Tensor& x,
                        const int32_t* positions);
}
#endif

// Every token's heads rotated at its position: x [tokens, heads, head_dim] and positions
// [tokens], both on ctx's device.
inline void interleaved_rotary(backend::Context& ctx, const TrailingInterleavedRotary& rotary, Tensor& x,
                               const int32_t* positions) {
  R3_DISPATCH_GPU(ctx, interleaved_rotary, ctx, rotary, x, positions);
}

}  // namespace r3::ops
