// DeepSeek-V4's lightning indexer score of compressed entries for one query token:
// score_s = sum_h w_h * relu(q_h . K_s) / sqrt(index_dim), heads in order.
#pragma once

#include <cstdint>

#include "ops/attention.h"

namespace r3::ops {

// q: [heads, dim]; w: [heads]; keys: the indexer's entries through their block table
// (key_row(s): entry s, dim floats); scores: n floats for entries 0..n-1.
void lightning_index_scores(const float* q, const float* w, const PagedKv& keys, int64_t n, int64_t heads,
                            int64_t dim, float* scores);
// Contiguous keys: [n, dim].
void lightning_index_scores(const float* q, const float* w, const float* keys, int64_t n, int64_t heads, int64_t dim,
                            float* scores);

}  // namespace r3::ops
