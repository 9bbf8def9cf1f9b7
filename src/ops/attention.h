// Scaled dot-product attention of query tokens over their own sequence's cached keys/values,
// with grouped-query heads (num_heads a multiple of num_kv_heads). The cache is read through a
// paged view (a block table over fixed-size blocks of positions), never copied into contiguous
// rows. Causality comes from the caller: each query sees exactly the positions [begin, end) it
// is given (an empty range: output zeros, for padding rows).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/dispatch.h"
#include "core/tensor.h"
#include "ops/step_view.h"

namespace r3::ops {

// One layer's cache for one sequence, as blocks of `block_size` positions. Position p lives in
// block block_table[p / block_size], row p % block_size; block b's key rows start at
// keys + b * block_size * key_width (values likewise). Which blocks a table names, and whether
// two tables share blocks, is the allocator's business; kernels only follow the table.
struct PagedKv {
  float* keys = nullptr;    // the layer's block pool
  float* values = nullptr;
  int64_t key_width = 0;    // floats per key row
  int64_t value_width = 0;  // floats per value row
  int64_t block_size = 0;   // positions per block
  std::span<const int32_t> block_table;

  int64_t row_index(int64_t position) const {
    return static_cast<int64_t>(block_table[static_cast<std::size_t>(position / block_size)]) * block_size +
           position % block_size;
  }
  float* key_row(int64_t position) const { return keys + row_index(position) * key_width; }
  float* value_row(int64_t position) const { return values + row_index(position) * value_width; }

  // Calls fn(first_position, count, key_rows, value_rows) for each run of consecutive positions
  // within one block, in position order, covering [begin, end).
  template <typename Fn>
  void for_each_run(int64_t begin, int64_t end, Fn&& fn) const {
    for (int64_t p = begin; p < end;) {
      const int64_t n = std::min(block_size - p % block_size, end - p);
      fn(p, n, static_cast<const float*>(key_row(p)), static_cast<const float*>(value_row(p)));
      p += n;
    }
  }
};

// Sequence `seq`'s view of a host pool (float32) through the step's block tables (host memory).
inline PagedKv paged_kv(const StepView& step, const KvPool& pool, int32_t seq) {
  return {static_cast<float*>(pool.keys), static_cast<float*>(pool.values), pool.key_width, pool.value_width,
          pool.block_size,
          std::span<const int32_t>(step.block_tables + seq * step.table_stride, static_cast<std::size_t>(step.table_stride))};
}

// What one query token attends to: positions [begin, end) of its sequence's paged cache.
struct KvWindow {
  PagedKv kv;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t length() const { return end - begin; }
};

// q: F32 [tokens, num_heads, head_dim]; out: F32 [tokens, num_heads, head_dim]; one KvWindow
// per token, its rows holding num_kv_heads * head_dim floats (key and value widths equal).
// sinks: per-head logits that join the softmax but carry no value (GPT-OSS), or nullptr.
namespace cpu {
void attention(backend::Context& ctx, const Tensor& q, std::span<const KvWindow> kv, int64_t num_kv_heads,
               float scale, Tensor& out, const float* sinks);
void paged_attention(backend::Context& ctx, const Tensor& q, const StepView& step, const KvPool& pool,
                     int64_t num_kv_heads, float scale, int64_t sliding_window, const float* sinks, Tensor& out);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_paged_attention.cu
// paged_attention below, over a device pool.
void paged_attention(backend::Context& ctx, const Tensor& q, const StepView& step, const KvPool& pool,
                     int64_t num_kv_heads, float scale, int64_t sliding_window, const float* sinks, Tensor& out);
}
#endif
inline void attention(backend::Context& ctx, const Tensor& q, std::span<const KvWindow> kv, int64_t num_kv_heads,
                      float scale, Tensor& out, const float* sinks = nullptr) {
  R3_DISPATCH(ctx, attention, ctx, q, kv, num_kv_heads, scale, out, sinks);
}

// The same attention with each token's window derived from the step (ops/step_view.h):
// positions [pos - sliding_window + 1, pos] of its sequence (all up to pos when sliding_window is
// 0), through the step's block tables into `pool`; a padding row's output is zeros. q, out:
// [step.tokens, num_heads, head_dim]; sinks: [num_heads] or nullptr; all on ctx's device.
inline void paged_attention(backend::Context& ctx, const Tensor& q, const StepView& step, const KvPool& pool,
                            int64_t num_kv_heads, float scale, int64_t sliding_window, const float* sinks,
                            Tensor& out) {
  R3_DISPATCH_GPU(ctx, paged_attention, ctx, q, step, pool, num_kv_heads, scale, sliding_window, sinks, out);
}

}  // namespace r3::ops
