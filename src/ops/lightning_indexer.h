// DeepSeek-V4's lightning indexer score of compressed entries for one query token:
// score_s = sum_h w_h * relu(q_h . K_s) / sqrt(index_dim), heads in order.
#pragma once

#include <cstdint>

namespace r3::ops {

// q: [heads, dim]; w: [heads]; keys: [n, dim]; scores: n floats.
void lightning_index_scores(const float* q, const float* w, const float* keys, int64_t n, int64_t heads, int64_t dim,
                            float* scores);

}  // namespace r3::ops
