#include "models/deepseek_v4/window_compressor.h"

#include <algorithm>
#include <cstring>

#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/window_pool.h"

namespace r3::models {

WindowCompressor::WindowCompressor(Tensor kv_proj, Tensor gate_proj, Tensor position_bias, Tensor norm, int64_t rate,
                                   bool overlap, float rms_eps, const ops::TrailingInterleavedRotary& rotary)
    : kv_proj_(std::move(kv_proj)),
      gate_proj_(std::move(gate_proj)),
      position_bias_(std::move(position_bias)),
      norm_(std::move(norm)),
      rate_(rate),
      dim_(norm_.dim(0)),
      width_(kv_proj_.dim(0)),
      overlap_(overlap),
      rms_eps_(rms_eps),
      rotary_(rotary) {
  R3_CHECK(width_ == (overlap ? 2 : 1) * dim_, "compressor: projection width ", width_, " for dim ", dim_);
  R3_CHECK(position_bias_.shape() == Shape({rate_, width_}), "compressor: position bias shape");
}

void WindowCompressor::update(backend::Context& ctx, const Tensor& x, const ForwardBatch& batch,
                              CompressorCache& cache) const {
  backend::Workspace::Scope scope(ctx.workspace());
  const int64_t tokens = x.dim(0);
  Tensor kv = ctx.scratch(DType::F32, {tokens, width_});
  Tensor gate = ctx.scratch(DType::F32, {tokens, width_});
  ops::linear(ctx, x, kv_proj_, nullptr, kv);
  ops::linear(ctx, x, gate_proj_, nullptr, gate);
  const auto row_bytes = sizeof(float) * static_cast<std::size_t>(width_);
  for (int64_t t = 0; t < tokens; ++t) {
    if (batch.seqs[t] == ForwardBatch::kPadding) continue;
    const CompressorView seq = cache.seq(batch.seqs[t]);
    const int64_t p = batch.positions[t];
    std::memcpy(seq.rows.key_row(p), kv.data<float>() + t * width_, row_bytes);
    std::memcpy(seq.rows.value_row(p), gate.data<float>() + t * width_, row_bytes);
    emit(ctx, seq, p + 1);
  }
}

void WindowCompressor::emit(backend::Context& ctx, const CompressorView& seq, int64_t length) const {
  const ops::WindowPoolShape shape{rate_, dim_, width_, overlap_};
  backend::Workspace::Scope scope(ctx.workspace());
  float* pooled = ctx.workspace().array<float>(dim_).data();
  int64_t& emitted = *seq.num_entries;
  for (int64_t w = emitted; w < length / rate_; ++w) {
    ops::gated_window_pool(ctx, seq.rows, position_bias_.data<float>(), shape, w, pooled);
    float* entry = seq.entries.key_row(w);
    ops::rms_norm_row(pooled, norm_.data<float>(), dim_, rms_eps_, entry);
    rotary_.apply(entry, 1, dim_, w * rate_);
  }
  emitted = std::max(emitted, length / rate_);
}

}  // namespace r3::models
