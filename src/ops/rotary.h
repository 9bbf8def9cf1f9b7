// Rotary position embedding, "rotate half" form as in Hugging Face Llama-style models:
// the first rotary_dim/2 and second rotary_dim/2 dims of each head form the rotated pairs.
#pragma once

#include <span>
#include <vector>

#include "backend/dispatch.h"
#include "core/tensor.h"
#include "ops/step_view.h"

namespace r3::ops {

class Rotary;

// A GQA layer's rows between its projection and its attention: the q, k and v of each token
// (rows of the given strides in floats, so they may be parts of one fused projection's output),
// and the per-head RMSNorm weights of q and k (both null: no norm).
struct AttentionRows {
  const float* q;
  int64_t q_stride;
  const float* k;
  int64_t k_stride;
  const float* v;
  int64_t v_stride;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
};

namespace cpu {
void rotary(const Rotary& rotary, Tensor& x, std::span<const int32_t> positions);
void prepare_attention_rows(backend::Context& ctx, const Rotary& rotary, const AttentionRows& rows, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, float eps, const StepView& step, const KvPool& pool,
                            Tensor& q_out);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_rotary.cu
// The same rotation of a device tensor, with the positions on the device.
void rotary_positions_on_device(backend::Context& ctx, const Rotary& rotary, Tensor& x, const int32_t* positions);
// prepare_attention_rows below, in one kernel.
void prepare_attention_rows(backend::Context& ctx, const Rotary& rotary, const AttentionRows& rows, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, float eps, const StepView& step,
                            const KvPool& pool, Tensor& q_out);
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

// A GQA layer's rows between its projection and its attention: every query and key head
// normalised (when the norms are given, with `eps`) and rotated at the step's positions; the
// queries to q_out ([step.tokens, heads, head_dim], contiguous; it may be the q rows themselves
// when their stride is heads * head_dim), the keys and the values (kv_heads * head_dim floats per
// row) to the paged pool at each token's position through the step's block tables (a padding
// row writes nothing). One kernel on a CUDA device.
inline void prepare_attention_rows(backend::Context& ctx, const Rotary& rotary, const AttentionRows& rows,
                                   int64_t heads, int64_t kv_heads, int64_t head_dim, float eps, const StepView& step,
                                   const KvPool& pool, Tensor& q_out) {
  R3_DISPATCH_GPU(ctx, prepare_attention_rows, ctx, rotary, rows, heads, kv_heads, head_dim, eps, step, pool, q_out);
}

}  // namespace r3::ops
