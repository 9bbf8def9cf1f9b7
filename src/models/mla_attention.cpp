#include "models/mla_attention.h"

#include <algorithm>
#include <cmath>

#include "models/weights_on_device.h"
#include "ops/kv_write.h"
#include "ops/activation.h"
#include "ops/latent_attention.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

MlaAttention::MlaAttention(const AttentionSpec& spec, float rms_eps, MlaWeights weights, const ops::RopeFrequencies& rope)
    : spec_(spec),
      rms_eps_(rms_eps),
      w_(std::move(weights)),
      rotary_(spec.latent.qk_rope_head_dim, rope.inv_freq, rope.attention_scaling),
      // qk_head_dim^-0.5, times DeepSeek's YaRN mscale^2 when the rope is scaled.
      softmax_scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.latent.qk_nope_head_dim +
                                                                           spec.latent.qk_rope_head_dim)) *
                                        ops::yarn_softmax_scale_factor(spec.rope_scaling))) {}

CacheSpec MlaAttention::cache_spec() const {
  return CacheSpec::latent(spec_.latent.kv_lora_rank, spec_.latent.qk_rope_head_dim);
}

void project_mla(backend::Context& ctx, const AttentionSpec& spec, float rms_eps, const MlaWeights& w, const Tensor& x,
                 Tensor& q, Tensor& latent, Tensor& rope_key) {
  const LatentAttentionSpec& m = spec.latent;
  const int64_t lora = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  if (m.q_lora_rank == 0) {
    ops::linear(ctx, x, w.q_proj, nullptr, q);
  } else {
    backend::Workspace::Scope scope(ctx.workspace());
    Tensor q_latent = ctx.scratch_for_output(DType::F32, {x.dim(0), m.q_lora_rank});  // written in full
    ops::linear(ctx, x, w.q_a_proj, w.q_a_bias.if_defined(), q_latent);
    ops::rms_norm(ctx, q_latent, &w.q_a_norm, rms_eps, q_latent);
    ops::linear(ctx, q_latent, w.q_b_proj, nullptr, q);
  }
  // kv_a_proj's rows [0, lora) make the latent, rows [lora, lora + rope) the shared rotary key:
  // two projections over row ranges of the one weight (each output is the same dot product).
  const Tensor* bias = w.kv_a_bias.if_defined();
  const Tensor latent_bias = bias ? bias->rows(0, lora) : Tensor();
  const Tensor rope_bias = bias ? bias->rows(lora, lora + rope) : Tensor();
  ops::linear(ctx, x, w.kv_a_proj.rows(0, lora), latent_bias.if_defined(), latent);
  ops::linear(ctx, x, w.kv_a_proj.rows(lora, lora + rope), rope_bias.if_defined(), rope_key);
  ops::rms_norm(ctx, latent, &w.kv_a_norm, rms_eps, latent);
}

std::unique_ptr<AttentionLayer> MlaAttention::placed(backend::Context& ctx, DType dtype) const {
  auto copy = std::make_unique<MlaAttention>(*this);
  MlaWeights& d = copy->w_;
  d.q_proj = on_device(ctx, w_.q_proj, dtype);
  d.q_a_proj = on_device(ctx, w_.q_a_proj, dtype);
  d.q_b_proj = on_device(ctx, w_.q_b_proj, dtype);
  d.kv_a_proj = on_device(ctx, w_.kv_a_proj, dtype);
  d.kv_b_proj = on_device(ctx, w_.kv_b_proj, dtype);
  d.o_proj = on_device(ctx, w_.o_proj, dtype);
  d.g_proj = on_device(ctx, w_.g_proj, dtype);
  d.q_a_norm = on_device(ctx, w_.q_a_norm, DType::F32);
  d.kv_a_norm = on_device(ctx, w_.kv_a_norm, DType::F32);
  d.q_a_bias = on_device(ctx, w_.q_a_bias, DType::F32);
  d.kv_a_bias = on_device(ctx, w_.kv_a_bias, DType::F32);
  d.o_bias = on_device(ctx, w_.o_bias, DType::F32);
  return copy;
}

void MlaAttention::forward(backend::Context& ctx, const Tensor& x, const ops::StepView& step, KvCache& cache,
                           int64_t layer, Tensor& out) const {
  const LatentAttentionSpec& m = spec_.latent;
  const int64_t tokens = x.dim(0), heads = spec_.num_heads;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, qk = nope + rope, vd = m.v_head_dim;
  const int64_t lora = m.kv_lora_rank;
  backend::Workspace::Scope scope(ctx.workspace());
  // Every buffer here is written in full by the op that fills it (no fills: see GqaAttention).
  Tensor q = ctx.scratch_for_output(DType::F32, {tokens, heads * qk});
  Tensor latent = ctx.scratch_for_output(DType::F32, {tokens, lora});
  Tensor rope_key = ctx.scratch_for_output(DType::F32, {tokens, rope});
  project_mla(ctx, spec_, rms_eps_, w_, x, q, latent, rope_key);
  Tensor rope_heads = rope_key.reshaped({tokens, 1, rope});
  Tensor q_heads = q.reshaped({tokens, heads, qk});
  ops::interleaved_rotary(ctx, rotary_, rope_heads, step.positions);
  ops::interleaved_rotary(ctx, rotary_, q_heads, step.positions);
  // Cache rows through the block tables: keys hold the normalised latent, values the rotated
  // shared key. Each token then attends to its own sequence's positions [0, p] (padding rows:
  // nothing).
  const ops::StepView layer_step = cache.step_for_layer(step, layer);
  const ops::KvPool pool = cache.pool(layer);
  ops::write_kv_paged(ctx, latent.data<float>(), lora, rope_key.data<float>(), rope, layer_step, pool);
  Tensor attended = ctx.scratch_for_output(DType::F32, {tokens, heads * vd});
  ops::latent_attention_paged(ctx, q, w_.kv_b_proj, layer_step, pool, {heads, nope, rope, vd, lora}, softmax_scale_,
                              attended);
  if (w_.g_proj.defined()) {
    Tensor gate = ctx.scratch_for_output(DType::F32, {tokens, heads * vd});
    ops::linear(ctx, x, w_.g_proj, nullptr, gate);
    ops::mul_sigmoid(ctx, gate, attended);
  }
  ops::linear(ctx, attended, w_.o_proj, w_.o_bias.if_defined(), out);
}

}  // namespace r3::models
