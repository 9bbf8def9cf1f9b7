// Scaled dot-product attention of query tokens over their own sequence's cached keys/values,
// with grouped-query heads (num_heads a multiple of num_kv_heads). Causality comes from the
// caller: each query sees exactly the `length` cached rows it is given (0 rows: output zeros,
// for padding rows).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace r3::ops {

// Where one query token's keys and values live: `length` rows starting at `keys`/`values`,
// consecutive rows `row_stride` floats apart, each row holding num_kv_heads * head_dim floats.
struct KvRows {
  const float* keys = nullptr;
  const float* values = nullptr;
  int64_t length = 0;
  int64_t row_stride = 0;
};

// q: F32 [tokens, num_heads, head_dim]; out: F32 [tokens, num_heads, head_dim].
// sinks: per-head logits that join the softmax but carry no value (GPT-OSS), or nullptr.
void attention(ThreadPool& pool, const Tensor& q, const std::vector<KvRows>& kv,
               int64_t num_kv_heads, float scale, Tensor& out, const float* sinks = nullptr);

}  // namespace r3::ops
