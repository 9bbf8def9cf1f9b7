// Grouped-query causal self-attention with rotary positions, optional q/k RMSNorm, optional
// biases, optional sliding window, writing its keys/values into the KV cache.
#pragma once

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

  // Full K/V rows, or for a sliding-window layer K/V rows of which only the window is read.
  CacheSpec cache_spec() const override;

  // x: normalised hidden states F32 [tokens, hidden]; out: F32 [tokens, hidden].
  void forward(backend::Context& ctx, const Tensor& x, const ForwardBatch& batch, KvCache& cache,
               int64_t layer, Tensor& out) const override;

  // What a device copy of the layer needs (models/device_decoder.h).
  const AttentionSpec& spec() const { return spec_; }
  float rms_eps() const { return rms_eps_; }
  const GqaAttentionWeights& weights() const { return w_; }
  const ops::Rotary& rotary() const { return rotary_; }
  int64_t sliding_window() const { return sliding_window_; }

 private:
  AttentionSpec spec_;
  float rms_eps_;
  GqaAttentionWeights w_;
  ops::Rotary rotary_;
  int64_t sliding_window_;
};

}  // namespace r3::models
