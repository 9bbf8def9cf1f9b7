#include "ops/lightning_indexer.h"

#include <algorithm>
#include <cmath>

#include "ops/dot.h"

namespace r3::ops {

void lightning_index_scores(const float* q, const float* w, const float* keys, int64_t n, int64_t heads, int64_t dim,
                            float* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  for (int64_t s = 0; s < n; ++s) {
    const float* key = keys + s * dim;
    float total = 0.0f;
    for (int64_t h = 0; h < heads; ++h) {
      const float qk = dot(q + h * dim, key, dim);
      total += std::max(qk, 0.0f) * scale * w[h];
    }
    scores[s] = total;
  }
}

}  // namespace r3::ops
