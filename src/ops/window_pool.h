// DeepSeek-V4's compressor pooling: window w of `rate` cached positions becomes one compressed
// entry. Each channel is a softmax-weighted sum of the window's values, the weights coming from
// the gate projection plus a learned per-position bias; with overlapping windows, the previous
// window's first series joins each window's second series.
#pragma once

#include <cstdint>
#include <span>

#include "backend/context.h"
#include "ops/attention.h"

namespace r3::ops {

struct WindowPoolShape {
  int64_t rate = 0;      // positions per window
  int64_t dim = 0;       // channels of an entry
  int64_t width = 0;     // floats per cached row: dim, or 2 * dim with overlap ([first | second series])
  bool overlap = false;
};

// Floats of scratch gated_window_pool needs: a logit and a value per candidate position.
inline int64_t window_pool_scratch(const WindowPoolShape& s) { return 2 * (s.overlap ? 2 : 1) * s.rate; }

// rows: the cached projections through their block table (key_row(p): kv, value_row(p): gate of
// position p; window w's rows are positions w * rate ...); bias: [rate, width]; pooled: dim floats;
// scratch: window_pool_scratch(shape) floats.
void gated_window_pool(const PagedKv& rows, const float* bias, const WindowPoolShape& shape, int64_t window,
                       std::span<float> scratch, float* pooled);
// The same with its scratch from the context's workspace.
void gated_window_pool(backend::Context& ctx, const PagedKv& rows, const float* bias, const WindowPoolShape& shape,
                       int64_t window, float* pooled);
// Contiguous rows: kv, gate [positions, width].
void gated_window_pool(const float* kv, const float* gate, const float* bias, const WindowPoolShape& shape,
                       int64_t window, float* pooled);

}  // namespace r3::ops
