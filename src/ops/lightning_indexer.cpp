#include "ops/lightning_indexer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu/dot.h"

namespace r3::ops {

void lightning_index_scores(const float* q, const float* w, const PagedKv& keys, int64_t n, int64_t heads,
                            int64_t dim, float* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  for (int64_t s = 0; s < n; ++s) {
    const float* key = keys.key_row(s);
    float total = 0.0f;
    for (int64_t h = 0; h < heads; ++h) {
      const float qk = dot(q + h * dim, key, dim);
      total += std::max(qk, 0.0f) * scale * w[h];
    }
    scores[s] = total;
  }
}

void lightning_index_scores(const float* q, const float* w, const float* keys, int64_t n, int64_t heads, int64_t dim,
                            float* scores) {
  const int32_t table[1] = {0};  // contiguous keys: one block that holds every entry
  const PagedKv view{const_cast<float*>(keys), const_cast<float*>(keys), dim, dim,
                     std::numeric_limits<int64_t>::max(), table};
  lightning_index_scores(q, w, view, n, heads, dim, scores);
}

}  // namespace r3::ops
