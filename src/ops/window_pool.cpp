#include "ops/window_pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"

namespace r3::ops {

void gated_window_pool(const PagedKv& rows, const float* bias, const WindowPoolShape& s, int64_t w,
                       std::span<float> scratch, float* pooled) {
  const int64_t candidates = (s.overlap ? 2 : 1) * s.rate;
  R3_CHECK(static_cast<int64_t>(scratch.size()) >= 2 * candidates, "window pool: scratch of ", scratch.size(),
           " floats for ", candidates, " candidates");
  float* logits = scratch.data();
  float* values = logits + candidates;
  for (int64_t c = 0; c < s.dim; ++c) {
    // Gather the candidate (kv, gate) of channel c from every position of the window.
    int64_t n = 0;
    if (s.overlap && w > 0) {  // window w-1's first series
      for (int64_t j = 0; j < s.rate; ++j) {
        const int64_t p = (w - 1) * s.rate + j;
        values[n] = rows.key_row(p)[c];
        logits[n++] = rows.value_row(p)[c] + bias[j * s.width + c];
      }
    }
    const int64_t offset = s.overlap ? s.dim : 0;  // window w's second series (or only series)
    for (int64_t j = 0; j < s.rate; ++j) {
      const int64_t p = w * s.rate + j;
      values[n] = rows.key_row(p)[offset + c];
      logits[n++] = rows.value_row(p)[offset + c] + bias[j * s.width + offset + c];
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

void gated_window_pool(backend::Context& ctx, const PagedKv& rows, const float* bias, const WindowPoolShape& shape,
                       int64_t window, float* pooled) {
  backend::Workspace::Scope scope(ctx.workspace());
  gated_window_pool(rows, bias, shape, window, ctx.workspace().array<float>(window_pool_scratch(shape)), pooled);
}

void gated_window_pool(const float* kv, const float* gate, const float* bias, const WindowPoolShape& shape,
                       int64_t window, float* pooled) {
  // Contiguous rows are one block that holds every position.
  const int32_t table[1] = {0};
  const PagedKv rows{const_cast<float*>(kv), const_cast<float*>(gate), shape.width, shape.width,
                     std::numeric_limits<int64_t>::max(), table};
  std::vector<float> scratch(static_cast<std::size_t>(window_pool_scratch(shape)));
  gated_window_pool(rows, bias, shape, window, scratch, pooled);
}

}  // namespace r3::ops
