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

#include "ops/cpu/dot.h"

namespace r3::ops {

// runs(fn) calls fn(j, count, keys, values, stride) for consecutive runs of the n rows in order:
// rows j .. j + count - 1, the i-th at keys + i * stride and values + i * stride (d floats each).
// scores: scratch of at least n floats. out: d floats.
template <typename Runs>
void softmax_attention_head(const float* q, int64_t d, float scale, const float* sink, int64_t n, Runs&& runs,
                            std::span<float> scores, float* out) {
  scores = scores.first(static_cast<std::size_t>(n));
  runs([&](int64_t j, int64_t count, const float* keys, const float*, int64_t stride) {
    dot_rows(q, keys, stride, count, d, scale, scores.data() + j);
  });
  float max_score = sink ? *sink : -INFINITY;
  for (const float s : scores) max_score = std::max(max_score, s);
  float denom = sink ? std::exp(*sink - max_score) : 0.0f;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    denom += s;
  }
  // Each row's weight, as the sum below uses it.
  for (float& s : scores) s /= denom;
  std::fill(out, out + d, 0.0f);
  runs([&](int64_t j, int64_t count, const float*, const float* values, int64_t stride) {
    add_scaled_rows(scores.data() + j, values, stride, count, d, out);
  });
}

}  // namespace r3::ops
