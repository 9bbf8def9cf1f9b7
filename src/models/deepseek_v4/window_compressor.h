// DeepSeek-V4's KV compressor: every window of `rate` positions becomes one compressed entry,
// a per-channel softmax(gate + position bias)-weighted sum of the window's projected rows, then
// RMSNorm and rotary at the window's first position. With `overlap` (CSA and its indexer) each
// position projects two series: entry w mixes window w-1's first series with window w's second.
#pragma once

#include "core/tensor.h"
#include "backend/context.h"
#include "models/deepseek_v4/v4_cache.h"
#include "models/forward_batch.h"
#include "ops/interleaved_rotary.h"

namespace r3::models {

class WindowCompressor {
 public:
  // kv_proj, gate_proj: [width, hidden]; position_bias: [rate, width]; norm: [dim];
  // width = 2 * dim with overlap, dim without.
  WindowCompressor(Tensor kv_proj, Tensor gate_proj, Tensor position_bias, Tensor norm, int64_t rate,
                   bool overlap, float rms_eps, const ops::TrailingInterleavedRotary& rotary);

  int64_t rate() const { return rate_; }
  int64_t dim() const { return dim_; }

  // Projects the rows of `x` [tokens, hidden]; then, token by token in batch order, caches the
  // token's projections at its position and emits the entry of the window it completes. A sequence's
  // tokens come in position order, so a window's rows are all cached when it completes, and the
  // ring of projections only ever drops rows whose entries have been emitted.
  void update(backend::Context& ctx, const Tensor& x, const ForwardBatch& batch, CompressorCache& cache) const;

 private:
  // Emits the entries of every window completed within the first `length` positions.
  void emit(backend::Context& ctx, const CompressorView& seq, int64_t length) const;

  Tensor kv_proj_, gate_proj_, position_bias_, norm_;
  int64_t rate_, dim_, width_;
  bool overlap_;
  float rms_eps_;
  const ops::TrailingInterleavedRotary& rotary_;
};

}  // namespace r3::models
