// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2). Each position caches only its latent
// c (kv_lora_rank, after RMSNorm) and one rotary key k_r (qk_rope_head_dim). Per head, keys are
// [W_k c | k_r] and values W_v c, with W_k, W_v the head's rows of kv_b_proj; attention runs in
// the latent space (q_nope projected through W_k, values projected after the weighted sum),
// which is the same arithmetic as expanding every cached position, with far less work.
// Kimi K3's gated MLA multiplies the attended values by sigmoid(g_proj x) before o_proj.
// One definition for every device, as GqaAttention.
#pragma once

#include <memory>

#include "models/attention_layer.h"
#include "models/decoder_spec.h"
#include "ops/interleaved_rotary.h"
#include "ops/rope_scaling.h"

namespace r3::models {

struct MlaWeights {
  Tensor q_proj;                          // [heads * qk_head_dim, hidden] when q_lora_rank == 0
  Tensor q_a_proj, q_a_norm, q_b_proj;    // LoRA: [q_lora, hidden], [q_lora], [heads * qk_head_dim, q_lora]
  Tensor kv_a_proj, kv_a_norm, kv_b_proj; // [kv_lora + rope, hidden], [kv_lora], [heads * (nope + v), kv_lora]
  Tensor o_proj;                          // [hidden, heads * v]
  Tensor q_a_bias, kv_a_bias, o_bias;     // when attention_bias
  Tensor g_proj;                          // Kimi K3's output gate [heads * v, hidden], or undefined
};

// The layer's projections up to its cache rows, for the host and the device layer alike: q
// (q_proj, or q_a_proj -> norm -> q_b_proj) [tokens, heads * qk_head_dim], the normalised latent
// [tokens, kv_lora_rank] and the shared rotary key [tokens, qk_rope_head_dim], not yet rotated.
void project_mla(backend::Context& ctx, const AttentionSpec& spec, float rms_eps, const MlaWeights& w, const Tensor& x,
                 Tensor& q, Tensor& latent, Tensor& rope_key);

class MlaAttention final : public AttentionLayer {
 public:
  MlaAttention(const AttentionSpec& spec, float rms_eps, MlaWeights weights, const ops::RopeFrequencies& rope);

  // The normalised latent (keys) and the rotated shared key (values) of every position.
  CacheSpec cache_spec() const override;

  // This layer with its weights on ctx's device: projections as `dtype` (or as stored when
  // quantized), norms and biases float32.
  std::unique_ptr<AttentionLayer> placed(backend::Context& ctx, DType dtype) const override;

  void forward(backend::Context& ctx, const Tensor& x, const ops::StepView& step, KvCache& cache, int64_t layer,
               Tensor& out) const override;

  const AttentionSpec& spec() const { return spec_; }
  const MlaWeights& weights() const { return w_; }

 private:
  AttentionSpec spec_;
  float rms_eps_;
  MlaWeights w_;
  ops::TrailingInterleavedRotary rotary_;
  float softmax_scale_;
};

}  // namespace r3::models
