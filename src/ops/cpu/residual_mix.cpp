// The attention-residual mix on the CPU (ops/residual_mix.h): a token per task, the scores,
// exponentials and sums in double.
#include "ops/residual_mix.h"

#include <algorithm>
#include <cmath>

#include "ops/rms_norm.h"

namespace r3::ops::cpu {

void residual_mix(backend::Context& ctx, const Tensor& query_t, const Tensor& norm_t, float eps, const Tensor& snapshots,
                  int64_t count, const Tensor& current, Tensor& out) {
  const int64_t tokens = current.dim(0), hidden = current.dim(1);
  const int64_t values = count + 1;
  const auto scratch = ctx.per_thread<float>(hidden + values);
  const float* query = query_t.data<float>();
  ctx.parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
    float* normed = scratch.mine().data();
    float* weights = normed + hidden;
    for (int64_t t = begin; t < end; ++t) {
      auto value = [&](int64_t n) {
        return n < count ? snapshots.data<float>() + (n * snapshots.dim(1) + t) * hidden
                         : current.data<float>() + t * hidden;
      };
      // Scores against the normalised values, then a softmax over them (max subtracted).
      double top = -INFINITY;
      for (int64_t n = 0; n < values; ++n) {
        ops::rms_norm_row(value(n), norm_t.data<float>(), hidden, eps, normed);
        double score = 0;
        for (int64_t i = 0; i < hidden; ++i) score += static_cast<double>(query[i]) * normed[i];
        weights[n] = static_cast<float>(score);
        top = std::max(top, score);
      }
      double total = 0;
      for (int64_t n = 0; n < values; ++n) {
        weights[n] = static_cast<float>(std::exp(static_cast<double>(weights[n]) - top));
        total += weights[n];
      }
      float* y = out.data<float>() + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) {
        double sum = 0;
        for (int64_t n = 0; n < values; ++n) sum += static_cast<double>(weights[n]) * value(n)[i];
        y[i] = static_cast<float>(sum / total);
      }
    }
  });
}

}  // namespace r3::ops::cpu
