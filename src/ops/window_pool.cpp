#include "ops/window_pool.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace r3::ops {

void gated_window_pool(const float* kv, const float* gate, const float* bias, const WindowPoolShape& s,
                       int64_t w, float* pooled) {
  const int64_t candidates = (s.overlap ? 2 : 1) * s.rate;
  std::vector<float> logits(static_cast<std::size_t>(candidates)), values(static_cast<std::size_t>(candidates));
  for (int64_t c = 0; c < s.dim; ++c) {
    // Gather the candidate (kv, gate) of channel c from every position of the window.
    int64_t n = 0;
    if (s.overlap && w > 0) {  // window w-1's first series
      for (int64_t j = 0; j < s.rate; ++j) {
        const int64_t row = (w - 1) * s.rate + j;
        values[n] = kv[row * s.width + c];
        logits[n++] = gate[row * s.width + c] + bias[j * s.width + c];
      }
    }
    const int64_t offset = s.overlap ? s.dim : 0;  // window w's second series (or only series)
    for (int64_t j = 0; j < s.rate; ++j) {
      const int64_t row = w * s.rate + j;
      values[n] = kv[row * s.width + offset + c];
      logits[n++] = gate[row * s.width + offset + c] + bias[j * s.width + offset + c];
    }
    float max_logit = -INFINITY;
    for (int64_t i = 0; i < n; ++i) max_logit = std::max(max_logit, logits[i]);
    float denom = 0;
    for (int64_t i = 0; i < n; ++i) denom += (logits[i] = std::exp(logits[i] - max_logit));
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += logits[i] / denom * values[i];
    pooled[c] = sum;
  }
}

}  // namespace r3::ops
