#include "models/gqa_attention.h"

#include <algorithm>
#include <cmath>

#include "models/weights_on_device.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/l2_prefetch.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

GqaAttention::GqaAttention(const AttentionSpec& spec, float rms_eps, GqaAttentionWeights weights,
                           const ops::RopeFrequencies& rope, int64_t sliding_window)
    : GqaAttention(spec, rms_eps, std::move(weights),
                   ops::Rotary(static_cast<int64_t>(rope.inv_freq.size()) * 2, rope.inv_freq, rope.attention_scaling),
                   sliding_window) {}

GqaAttention::GqaAttention(const AttentionSpec& spec, float rms_eps, GqaAttentionWeights weights, ops::Rotary rotary,
                           int64_t sliding_window)
    : spec_(spec), rms_eps_(rms_eps), w_(std::move(weights)), rotary_(std::move(rotary)), sliding_window_(sliding_window) {}

CacheSpec GqaAttention::cache_spec() const {
  const int64_t row = spec_.num_kv_heads * spec_.head_dim;
  return sliding_window_ > 0 ? CacheSpec::sliding_window_kv(row, sliding_window_) : CacheSpec::full_kv(row);
}

namespace {

void normalise_qk(backend::Context& ctx, const AttentionSpec& spec, float eps, const Tensor& q_norm,
                  const Tensor& k_norm, Tensor& q, Tensor& k) {
  const int64_t tokens = q.dim(0), d = spec.head_dim;
  switch (spec.qk_norm) {
    case QkNorm::kNone:
      return;
    case QkNorm::kFull:  // over the whole projection, before splitting into heads
      ops::rms_norm(ctx, q, &q_norm, eps, q);
      ops::rms_norm(ctx, k, &k_norm, eps, k);
      return;
    case QkNorm::kPerHead: {  // over head_dim of every head
      Tensor qh = q.reshaped({tokens * spec.num_heads, d});
      Tensor kh = k.reshaped({tokens * spec.num_kv_heads, d});
      ops::rms_norm(ctx, qh, &q_norm, eps, qh);
      ops::rms_norm(ctx, kh, &k_norm, eps, kh);
      return;
    }
  }
}

}  // namespace

void project_qkv(backend::Context& ctx, const AttentionSpec& spec, float eps, const GqaAttentionWeights& w,
                 const Tensor& x, Tensor& q, Tensor& k, Tensor& v) {
  ops::linear(ctx, x, w.q, w.q_bias.if_defined(), q);
  ops::linear(ctx, x, w.k, w.k_bias.if_defined(), k);
  ops::linear(ctx, x, w.v, w.v_bias.if_defined(), v);
  normalise_qk(ctx, spec, eps, w.q_norm, w.k_norm, q, k);
  if (spec.clip_qkv > 0) {
    for (Tensor* t : {&q, &k, &v}) ops::clamp(ctx, *t, static_cast<float>(spec.clip_qkv));
  }
}

std::unique_ptr<AttentionLayer> GqaAttention::placed(backend::Context& ctx, DType dtype) const {
  const GqaAttentionWeights& h = w_;
  GqaAttentionWeights d;
  if (stacks_qkv(spec_) && !h.qkv.defined()) d.qkv = stacked_on_device(ctx, {&h.q, &h.k, &h.v}, dtype);
  if (d.qkv.defined()) {
    if (h.q_bias.defined() || h.k_bias.defined() || h.v_bias.defined()) {
      const int64_t q_width = spec_.num_heads * spec_.head_dim, kv_width = spec_.num_kv_heads * spec_.head_dim;
      const Tensor zq = Tensor::empty(DType::F32, {q_width}), zkv = Tensor::empty(DType::F32, {kv_width});
      d.qkv_bias = stacked_on_device(ctx,
                                     {h.q_bias.defined() ? &h.q_bias : &zq, h.k_bias.defined() ? &h.k_bias : &zkv,
                                      h.v_bias.defined() ? &h.v_bias : &zkv},
                                     DType::F32);
    }
  } else {
    d.qkv = on_device(ctx, h.qkv, dtype);
    d.qkv_bias = on_device(ctx, h.qkv_bias, DType::F32);
    d.q = on_device(ctx, h.q, dtype);
    d.k = on_device(ctx, h.k, dtype);
    d.v = on_device(ctx, h.v, dtype);
    d.q_bias = on_device(ctx, h.q_bias, DType::F32);
    d.k_bias = on_device(ctx, h.k_bias, DType::F32);
    d.v_bias = on_device(ctx, h.v_bias, DType::F32);
  }
  d.o = on_device(ctx, h.o, dtype);
  d.o_bias = on_device(ctx, h.o_bias, DType::F32);
  d.q_norm = on_device(ctx, h.q_norm, DType::F32);
  d.k_norm = on_device(ctx, h.k_norm, DType::F32);
  d.sinks = on_device(ctx, h.sinks, DType::F32);
  return std::make_unique<GqaAttention>(spec_, rms_eps_, std::move(d), rotary_, sliding_window_);
}

void GqaAttention::forward(backend::Context& ctx, const Tensor& x, const ops::StepView& step, KvCache& cache,
                           int64_t layer, Tensor& out) const {
  const int64_t tokens = x.dim(0), d = spec_.head_dim;
  const int64_t q_width = spec_.num_heads * d, kv_width = spec_.num_kv_heads * d;
  backend::Workspace::Scope scope(ctx.workspace());
  // Every buffer here is written in full by the op that fills it: no fills (on a device, a fill
  // is a memset node in the step's graph, which breaks its chain of programmatic launches).
  Tensor qh = ctx.scratch_for_output(DType::F32, {tokens, spec_.num_heads, d});
  ops::AttentionRows rows{};
  if (w_.qkv.defined()) {
    const int64_t width = q_width + 2 * kv_width;
    Tensor projected = ctx.scratch_for_output(DType::F32, {tokens, width});
    ops::linear(ctx, x, w_.qkv, w_.qkv_bias.if_defined(), projected);
    ops::prefetch_weights_beside(ctx, w_.o, tokens);
    const float* p = projected.data<float>();
    const bool norms = spec_.qk_norm == QkNorm::kPerHead;
    rows = {p,
            width,
            p + q_width,
            width,
            p + q_width + kv_width,
            width,
            norms ? w_.q_norm.data<float>() : nullptr,
            norms ? w_.k_norm.data<float>() : nullptr};
  } else {
    Tensor qt = qh.reshaped({tokens, q_width});
    Tensor kt = ctx.scratch_for_output(DType::F32, {tokens, kv_width});
    Tensor vt = ctx.scratch_for_output(DType::F32, {tokens, kv_width});
    project_qkv(ctx, spec_, rms_eps_, w_, x, qt, kt, vt);
    ops::prefetch_weights_beside(ctx, w_.o, tokens);
    rows = {qt.data<float>(), q_width, kt.data<float>(), kv_width, vt.data<float>(), kv_width};
  }
  Tensor attended = ctx.scratch_for_output(DType::F32, {tokens, spec_.num_heads, d});
  const ops::StepView layer_step = cache.step_for_layer(step, layer);
  const ops::KvPool pool = cache.pool(layer);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float* sinks = w_.sinks.defined() ? w_.sinks.data<float>() : nullptr;
  for_each_pass(cache, layer, layer_step, ctx.workspace(), [&](int64_t first, const ops::StepView& pass) {
    const ops::AttentionRows pass_rows{rows.q + first * rows.q_stride,
                                       rows.q_stride,
                                       rows.k + first * rows.k_stride,
                                       rows.k_stride,
                                       rows.v + first * rows.v_stride,
                                       rows.v_stride,
                                       rows.q_norm,
                                       rows.k_norm};
    Tensor q_pass = qh.rows(first, first + pass.tokens);  // views on ctx's device
    Tensor out_pass = attended.rows(first, first + pass.tokens);
    ops::prepare_attention_rows(ctx, rotary_, pass_rows, spec_.num_heads, spec_.num_kv_heads, d, rms_eps_, pass, pool,
                                q_pass);
    ops::paged_attention(ctx, q_pass, pass, pool, spec_.num_kv_heads, scale, sliding_window_, sinks, out_pass);
  });
  ops::linear(ctx, attended.reshaped({tokens, q_width}), w_.o, w_.o_bias.if_defined(), out);
}

}  // namespace r3::models
