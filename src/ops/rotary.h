// Rotary position embedding, "rotate half" form as in Hugging Face Llama-style models:
// the first rotary_dim/2 and second rotary_dim/2 dims of each head form the rotated pairs.
#pragma once

#include <span>
#include <vector>

#include "backend/dispatch.h"
#include "core/tensor.h"
#include "ops/device_step.h"

namespace r3::ops {

class Rotary;
namespace cpu {
void rotary(const Rotary& rotary, Tensor& x, std::span<const int32_t> positions);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_rotary.cu
// The same rotation of a device tensor, with the positions on the device.
void rotary_positions_on_device(backend::Context& ctx, const Rotary& rotary, Tensor& x, const int32_t* positions);
// A GQA layer's step in one kernel: q [tokens, heads, d] and k [tokens, kv_heads, d] rotated at
// the step's positions, then k and v (as many floats as k) written to the paged pool as
// write_kv_paged does.
void rotary_and_write_kv(backend::Context& ctx, const Rotary& rotary, Tensor& q, Tensor& k, const Tensor& v,
                         const DeviceStep& step, const DeviceKvPool& pool);
}
#endif

class Rotary {
 public:
  // inv_freq[i] = 1 / theta^(2i / rotary_dim), computed in float32 exactly as transformers does,
  // so the angles (and their rounding) match the reference.
  Rotary(int64_t rotary_dim, double theta);
  // Precomputed frequencies (YaRN); cos and sin are multiplied by attention_scaling.
  Rotary(int64_t rotary_dim, std::vector<float> inv_freq, float attention_scaling);

  int64_t rotary_dim() const { return rotary_dim_; }
  std::span<const float> inv_freq() const { return inv_freq_; }
  float attention_scaling() const { return attention_scaling_; }

  // x: F32 [tokens, heads, head_dim] (head_dim >= rotary_dim); rotates the first rotary_dim dims
  // of every head in place, at positions[token].
  void apply(backend::Context& ctx, Tensor& x, std::span<const int32_t> positions) const {
    R3_DISPATCH(ctx, rotary, *this, x, positions);
  }

 private:
  int64_t rotary_dim_;
  std::vector<float> inv_freq_;
  float attention_scaling_ = 1.0f;
};

}  // namespace r3::ops
