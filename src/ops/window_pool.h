// DeepSeek-V4's compressor pooling: window w of `rate` cached positions becomes one compressed
// entry. Each channel is a softmax-weighted sum of the window's values, the weights coming from
// the gate projection plus a learned per-position bias; with overlapping windows, the previous
// window's first series joins each window's second series.
#pragma once

#include <cstdint>

namespace r3::ops {

struct WindowPoolShape {
  int64_t rate = 0;      // positions per window
  int64_t dim = 0;       // channels of an entry
  int64_t width = 0;     // floats per cached row: dim, or 2 * dim with overlap ([first | second series])
  bool overlap = false;
};

// kv, gate: cached rows [positions, width] (window w's rows are w * rate ...); bias: [rate, width];
// pooled: dim floats.
void gated_window_pool(const float* kv, const float* gate, const float* bias, const WindowPoolShape& shape,
                       int64_t window, float* pooled);

}  // namespace r3::ops
