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

void WindowCompressor::store(backend::Context& ctx, const Tensor& x, const std::vector<int32_t>& positions,
                             const std::vector<CompressorState*>& states) const {
  const int64_t tokens = x.dim(0);
  Tensor kv = Tensor::empty(DType::F32, {tokens, width_});
  Tensor gate = Tensor::empty(DType::F32, {tokens, width_});
  ops::linear(ctx, x, kv_proj_, nullptr, kv);
  ops::linear(ctx, x, gate_proj_, nullptr, gate);
  const auto row_bytes = sizeof(float) * static_cast<std::size_t>(width_);
  for (int64_t t = 0; t < tokens; ++t) {
    CompressorState* s = states[static_cast<std::size_t>(t)];
    if (s == nullptr) continue;  // padding
    const int64_t p = positions[static_cast<std::size_t>(t)];
    std::memcpy(s->kv.data() + p * width_, kv.data<float>() + t * width_, row_bytes);
    std::memcpy(s->gate.data() + p * width_, gate.data<float>() + t * width_, row_bytes);
  }
}

void WindowCompressor::emit(CompressorState& state, int64_t length) const {
  const ops::WindowPoolShape shape{rate_, dim_, width_, overlap_};
  std::vector<float> pooled(static_cast<std::size_t>(dim_));
  for (int64_t w = state.num_entries; w < length / rate_; ++w) {
    ops::gated_window_pool(state.kv.data(), state.gate.data(), position_bias_.data<float>(), shape, w, pooled.data());
    float* entry = state.entries.data() + w * dim_;
    ops::rms_norm_row(pooled.data(), norm_.data<float>(), dim_, rms_eps_, entry);
    rotary_.apply(entry, 1, dim_, w * rate_);
  }
  state.num_entries = std::max(state.num_entries, length / rate_);
}

}  // namespace r3::models
