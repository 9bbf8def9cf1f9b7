#include "models/deepseek_v4/window_compressor.h"

#include <cmath>
#include <cstring>

#include "ops/linear.h"

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

void WindowCompressor::store(ThreadPool& pool, const Tensor& x, const std::vector<int32_t>& positions,
                             const std::vector<CompressorState*>& states) const {
  const int64_t tokens = x.dim(0);
  Tensor kv = Tensor::empty(DType::F32, {tokens, width_});
  Tensor gate = Tensor::empty(DType::F32, {tokens, width_});
  ops::linear(pool, x, kv_proj_, nullptr, kv);
  ops::linear(pool, x, gate_proj_, nullptr, gate);
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
  const float* bias = position_bias_.data<float>();
  const int64_t slots = (overlap_ ? 2 : 1) * rate_;
  std::vector<float> logits(static_cast<std::size_t>(slots)), values(static_cast<std::size_t>(slots));
  std::vector<float> pooled(static_cast<std::size_t>(dim_));
  for (int64_t w = state.num_entries; w < length / rate_; ++w) {
    for (int64_t c = 0; c < dim_; ++c) {
      // Gather the candidate (kv, gate) of channel c from every slot of the window.
      int64_t n = 0;
      if (overlap_ && w > 0) {  // window w-1's first series
        for (int64_t j = 0; j < rate_; ++j) {
          const int64_t row = (w - 1) * rate_ + j;
          values[n] = state.kv[row * width_ + c];
          logits[n++] = state.gate[row * width_ + c] + bias[j * width_ + c];
        }
      }
      const int64_t offset = overlap_ ? dim_ : 0;  // window w's second series (or only series)
      for (int64_t j = 0; j < rate_; ++j) {
        const int64_t row = w * rate_ + j;
        values[n] = state.kv[row * width_ + offset + c];
        logits[n++] = state.gate[row * width_ + offset + c] + bias[j * width_ + offset + c];
      }
      float max_logit = -INFINITY;
      for (int64_t i = 0; i < n; ++i) max_logit = std::max(max_logit, logits[i]);
      float denom = 0;
      for (int64_t i = 0; i < n; ++i) denom += (logits[i] = std::exp(logits[i] - max_logit));
      float sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += logits[i] / denom * values[i];
      pooled[c] = sum;
    }
    double ss = 0;
    for (float v : pooled) ss += static_cast<double>(v) * v;
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim_) + rms_eps_));
    float* entry = state.entries.data() + w * dim_;
    for (int64_t c = 0; c < dim_; ++c) entry[c] = norm_.data<float>()[c] * (pooled[c] * inv);
    rotary_.apply(entry, 1, dim_, w * rate_);
  }
  state.num_entries = std::max(state.num_entries, length / rate_);
}

}  // namespace r3::models
