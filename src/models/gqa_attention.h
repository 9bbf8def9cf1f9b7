// Grouped-query causal self-attention with rotary positions, optional q/k RMSNorm, optional
// biases, optional sliding window, writing its keys/values into the KV cache. One definition for
// every device: its forward calls dispatched ops over the step view (ops/step_view.h), and
// `placed` makes the copy of a layer whose weights are on a device.
#pragma once

#include <memory>

#include "models/attention_layer.h"
#include "models/decoder_spec.h"
#include "ops/rope_scaling.h"
#include "ops/rotary.h"

namespace r3::models {

struct GqaAttentionWeights {
  Tensor q, k, v, o;                    // [out, in] projections
  Tensor q_bias, k_bias, v_bias, o_bias;  // empty when the spec has none
  Tensor q_norm, k_norm;                // empty unless spec.qk_norm != kNone
  Tensor sinks;                         // [num_heads] when spec.sinks
  // q, k and v as one projection ([q_width + 2 kv_width, hidden], its bias the three biases, zeros
  // for an absent one; q, k, v and their biases then empty): one launch, one pass over the
  // activations. Made by `placed` when the weights stack and the layer normalises per head or not
  // at all and does not clip (the norms then run in the kernel after it).
  Tensor qkv, qkv_bias;
};

// The q, k and v of x [tokens, hidden]: the projections (with their biases), the q/k RMSNorm of
// spec.qk_norm and spec.clip_qkv, into q [tokens, heads * head_dim] and k, v [tokens, kv_heads *
// head_dim] (written in full). Rotary comes after, from the caller; the device layers share this.
void project_qkv(backend::Context& ctx, const AttentionSpec& spec, float eps, const GqaAttentionWeights& w,
                 const Tensor& x, Tensor& q, Tensor& k, Tensor& v);

class GqaAttention final : public AttentionLayer {
 public:
  // sliding_window: this layer's window (0: full causal attention).
  GqaAttention(const AttentionSpec& spec, float rms_eps, GqaAttentionWeights weights,
               const ops::RopeFrequencies& rope, int64_t sliding_window);
  GqaAttention(const AttentionSpec& spec, float rms_eps, GqaAttentionWeights weights, ops::Rotary rotary,
               int64_t sliding_window);

  // Whether a layer of this spec may run q, k and v as one projection.
  static bool stacks_qkv(const AttentionSpec& spec) { return spec.qk_norm != QkNorm::kFull && spec.clip_qkv <= 0; }
  // This layer with its weights on ctx's device: projections as `dtype` (or as stored when
  // quantized), norms, biases and sinks float32; q, k and v stacked where they may be.
  std::unique_ptr<AttentionLayer> placed(backend::Context& ctx, DType dtype) const override;

  // Full K/V rows, or for a sliding-window layer K/V rows of which only the window is read.
  CacheSpec cache_spec() const override;

  // x: normalised hidden states F32 [tokens, hidden]; out: F32 [tokens, hidden]. Every row's
  // keys and values are written before any token of its pass reads the pool: one pass, unless
  // the layer's blocks form a ring on the host (KvCache::positions_per_pass).
  void forward(backend::Context& ctx, const Tensor& x, const ops::StepView& step, KvCache& cache,
               int64_t layer, Tensor& out) const override;

  const AttentionSpec& spec() const { return spec_; }
  const GqaAttentionWeights& weights() const { return w_; }

 private:
  AttentionSpec spec_;
  float rms_eps_;
  GqaAttentionWeights w_;
  ops::Rotary rotary_;
  int64_t sliding_window_;
};

}  // namespace r3::models
