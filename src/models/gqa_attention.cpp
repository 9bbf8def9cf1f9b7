#include "models/gqa_attention.h"

#include <algorithm>
#include <cmath>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/kv_write.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

GqaAttention::GqaAttention(const AttentionSpec& spec, float rms_eps, GqaAttentionWeights weights,
                           const ops::RopeFrequencies& rope, int64_t sliding_window)
    : spec_(spec),
      rms_eps_(rms_eps),
      w_(std::move(weights)),
      rotary_(static_cast<int64_t>(rope.inv_freq.size()) * 2, rope.inv_freq, rope.attention_scaling),
      sliding_window_(sliding_window) {}

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

void GqaAttention::forward(backend::Context& ctx, const Tensor& x, const ForwardBatch& batch,
                           KvCache& cache, int64_t layer, Tensor& out) const {
  const int64_t tokens = x.dim(0), d = spec_.head_dim;
  const int64_t q_width = spec_.num_heads * d, kv_width = spec_.num_kv_heads * d;
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor q = ctx.scratch(DType::F32, {tokens, q_width});
  Tensor k = ctx.scratch(DType::F32, {tokens, kv_width});
  Tensor v = ctx.scratch(DType::F32, {tokens, kv_width});
  project_qkv(ctx, spec_, rms_eps_, w_, x, q, k, v);
  Tensor qh = q.reshaped({tokens, spec_.num_heads, d});
  Tensor kh = k.reshaped({tokens, spec_.num_kv_heads, d});
  rotary_.apply(ctx, qh, batch.positions);
  rotary_.apply(ctx, kh, batch.positions);

  // Append this step's keys/values, then let each token attend to its sequence's positions up to
  // itself (the last sliding_window_ of them), both through the cache's block tables. A layer
  // whose blocks form a ring may only write so many positions of a sequence ahead of the tokens
  // still reading them, so a step that brings more tokens of one sequence goes in passes (the
  // arithmetic of each token is the same; decode steps, one token per sequence, take one pass).
  const int64_t pass = std::max<int64_t>(1, cache.positions_per_pass(layer));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float* sinks = w_.sinks.defined() ? w_.sinks.data<float>() : nullptr;
  Tensor attended = ctx.scratch(DType::F32, {tokens, spec_.num_heads, d});
  const std::span<int64_t> in_pass = ctx.workspace().array<int64_t>(cache.max_seqs());
  const std::span<ops::KvWindow> windows_of_step = ctx.workspace().array<ops::KvWindow>(tokens);
  const std::span<ops::KvWrite> writes_of_step = ctx.workspace().array<ops::KvWrite>(tokens);
  for (int64_t first_token = 0, end_token = 0; first_token < tokens; first_token = end_token) {
    std::fill(in_pass.begin(), in_pass.end(), 0);
    for (end_token = first_token; end_token < tokens; ++end_token) {
      const int64_t seq = batch.seqs[end_token];
      if (seq == ForwardBatch::kPadding) continue;
      R3_CHECK(seq >= 0 && seq < cache.max_seqs(), "attention: seq ", seq, " out of range");
      if (in_pass[static_cast<std::size_t>(seq)] == pass) break;
      ++in_pass[static_cast<std::size_t>(seq)];
    }
    const int64_t n = end_token - first_token;
    const std::span<ops::KvWindow> windows = windows_of_step.first(static_cast<std::size_t>(n));
    const std::span<ops::KvWrite> writes = writes_of_step.first(static_cast<std::size_t>(n));
    std::fill(windows.begin(), windows.end(), ops::KvWindow{});
    std::fill(writes.begin(), writes.end(), ops::KvWrite{});
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = first_token + i, seq = batch.seqs[t], pos = batch.positions[t];
      if (seq == ForwardBatch::kPadding) continue;  // attends to nothing: output zeros
      R3_CHECK(pos < cache.capacity(), "sequence position ", pos, " exceeds the KV cache capacity of ",
               cache.capacity(), " tokens");
      const ops::PagedKv kv = cache.view(layer, seq);
      writes[static_cast<std::size_t>(i)] = {kv, pos};
      const int64_t begin = sliding_window_ > 0 ? std::max<int64_t>(0, pos - sliding_window_ + 1) : 0;
      windows[static_cast<std::size_t>(i)] = {kv, begin, pos + 1};
    }
    ops::write_kv(ctx, k.data<float>() + first_token * kv_width, kv_width, v.data<float>() + first_token * kv_width,
                  kv_width, writes);
    const int64_t row = spec_.num_heads * d;
    Tensor q_pass = Tensor::view(DType::F32, {n, spec_.num_heads, d}, qh.data<float>() + first_token * row, nullptr);
    Tensor out_pass =
        Tensor::view(DType::F32, {n, spec_.num_heads, d}, attended.data<float>() + first_token * row, nullptr);
    ops::attention(ctx, q_pass, windows, spec_.num_kv_heads, scale, out_pass, sinks);
  }
  ops::linear(ctx, attended.reshaped({tokens, q_width}), w_.o, w_.o_bias.if_defined(), out);
}

}  // namespace r3::models
