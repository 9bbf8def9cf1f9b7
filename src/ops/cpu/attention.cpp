#include "ops/attention.h"

#include <algorithm>
#include <cmath>

#include "ops/softmax_attention.h"

namespace r3::ops::cpu {

void attention(backend::Context& ctx, const Tensor& q, std::span<const KvWindow> kv,
               int64_t num_kv_heads, float scale, Tensor& out, const float* sinks) {
  R3_CHECK(q.rank() == 3 && q.is_contiguous() && out.shape() == q.shape(),
           "attention: q ", shape_to_string(q.shape()), " out ", shape_to_string(out.shape()));
  const int64_t tokens = q.dim(0), heads = q.dim(1), head_dim = q.dim(2);
  R3_CHECK(num_kv_heads > 0 && heads % num_kv_heads == 0, "attention: ", heads,
           " heads not divisible by ", num_kv_heads, " kv heads");
  R3_CHECK(static_cast<int64_t>(kv.size()) == tokens, "attention: one KvWindow per token");
  for (const KvWindow& w : kv) {
    if (w.length() <= 0) continue;
    R3_CHECK(w.begin >= 0 && w.kv.block_size > 0 && w.kv.key_width == num_kv_heads * head_dim &&
                 w.kv.value_width == w.kv.key_width &&
                 (w.end - 1) / w.kv.block_size < static_cast<int64_t>(w.kv.block_table.size()),
             "attention: cache view of width ", w.kv.key_width, "/", w.kv.value_width, ", ",
             w.kv.block_table.size(), " blocks of ", w.kv.block_size, " does not fit positions [", w.begin, ", ",
             w.end, ") of ", num_kv_heads, " x ", head_dim);
  }
  const int64_t group = heads / num_kv_heads;
  int64_t longest = 0;
  for (const KvWindow& w : kv) longest = std::max(longest, w.length());
  backend::Workspace::Scope scope(ctx.workspace());
  const auto scores = ctx.per_thread<float>(longest);
  const float* qp = q.data<float>();
  float* op = out.data<float>();

  ctx.parallel_for(tokens * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / heads, h = th % heads;
      const KvWindow& w = kv[static_cast<std::size_t>(t)];
      float* ov = op + th * head_dim;
      if (w.length() <= 0) {  // a padding row: nothing to attend to
        std::fill(ov, ov + head_dim, 0.0f);
        continue;
      }
      const int64_t kv_offset = (h / group) * head_dim, stride = w.kv.key_width;
      auto runs = [&](auto&& fn) {
        w.kv.for_each_run(w.begin, w.end, [&](int64_t p, int64_t n, const float* keys, const float* values) {
          fn(p - w.begin, n, keys + kv_offset, values + kv_offset, stride);
        });
      };
      softmax_attention_head(qp + th * head_dim, head_dim, scale, sinks ? sinks + h : nullptr, w.length(), runs,
                             scores.mine(), ov);
    }
  });
}

}  // namespace r3::ops::cpu
