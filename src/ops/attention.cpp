#include "ops/attention.h"

#include <algorithm>
#include <cmath>

#include "ops/dot.h"

namespace r3::ops {

void attention(ThreadPool& pool, const Tensor& q, const std::vector<KvRows>& kv,
               int64_t num_kv_heads, float scale, Tensor& out, const float* sinks) {
  R3_CHECK(q.rank() == 3 && q.is_contiguous() && out.shape() == q.shape(),
           "attention: q ", shape_to_string(q.shape()), " out ", shape_to_string(out.shape()));
  const int64_t tokens = q.dim(0), heads = q.dim(1), head_dim = q.dim(2);
  R3_CHECK(num_kv_heads > 0 && heads % num_kv_heads == 0, "attention: ", heads,
           " heads not divisible by ", num_kv_heads, " kv heads");
  R3_CHECK(static_cast<int64_t>(kv.size()) == tokens, "attention: one KvRows per token");
  const int64_t group = heads / num_kv_heads;
  const float* qp = q.data<float>();
  float* op = out.data<float>();

  pool.parallel_for(tokens * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / heads, h = th % heads;
      const KvRows& rows = kv[static_cast<std::size_t>(t)];
      float* ov = op + th * head_dim;
      if (rows.length == 0) {  // a padding row: nothing to attend to
        std::fill(ov, ov + head_dim, 0.0f);
        continue;
      }
      const int64_t kv_offset = (h / group) * head_dim;
      const float* qv = qp + th * head_dim;
      scores.resize(static_cast<std::size_t>(rows.length));
      float max_score = sinks ? sinks[h] : -INFINITY;
      for (int64_t j = 0; j < rows.length; ++j) {
        scores[j] = dot(qv, rows.keys + j * rows.row_stride + kv_offset, head_dim) * scale;
        max_score = std::max(max_score, scores[j]);
      }
      float denom = sinks ? std::exp(sinks[h] - max_score) : 0.0f;
      for (int64_t j = 0; j < rows.length; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        denom += scores[j];
      }
      std::fill(ov, ov + head_dim, 0.0f);
      for (int64_t j = 0; j < rows.length; ++j) {
        const float p = scores[j] / denom;
        const float* vv = rows.values + j * rows.row_stride + kv_offset;
        for (int64_t d = 0; d < head_dim; ++d) ov[d] += p * vv[d];
      }
    }
  });
}

}  // namespace r3::ops
