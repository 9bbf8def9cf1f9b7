// The softmax attention of one query head over an ordered list of key/value rows, with an
// optional sink: a per-head logit that joins the softmax and takes probability mass but carries
// no value (GPT-OSS, DeepSeek-V4). Grouped-query attention over the paged cache and DeepSeek-V4's
// attention over its window and compressed entries both run this one loop, so they share its
// fixed operation order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "ops/dot.h"

namespace r3::ops {

// rows(fn) calls fn(j, key, value) for the n rows j = 0..n-1 in order (key and value: d floats).
// scores: scratch of at least n floats. out: d floats.
template <typename Rows>
void softmax_attention_head(const float* q, int64_t d, float scale, const float* sink, int64_t n, Rows&& rows,
                            std::span<float> scores, float* out) {
  scores = scores.first(static_cast<std::size_t>(n));
  float max_score = sink ? *sink : -INFINITY;
  rows([&](int64_t j, const float* key, const float*) {
    scores[static_cast<std::size_t>(j)] = dot(q, key, d) * scale;
    max_score = std::max(max_score, scores[static_cast<std::size_t>(j)]);
  });
  float denom = sink ? std::exp(*sink - max_score) : 0.0f;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    denom += s;
  }
  std::fill(out, out + d, 0.0f);
  rows([&](int64_t j, const float*, const float* value) {
    const float p = scores[static_cast<std::size_t>(j)] / denom;
    for (int64_t c = 0; c < d; ++c) out[c] += p * value[c];
  });
}


}  // namespace r3::ops
