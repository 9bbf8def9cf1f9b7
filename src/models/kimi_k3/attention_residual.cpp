#include "models/kimi_k3/attention_residual.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ops/rms_norm.h"

namespace r3::models {

AttentionResidual::AttentionResidual(Tensor query, Tensor norm, float eps)
    : query_(std::move(query)), norm_(std::move(norm)), eps_(eps) {
  R3_CHECK(query_.numel() == norm_.numel(), "attention residual: pseudo-query of ", query_.numel(),
           " values for a norm of ", norm_.numel());
}

void AttentionResidual::mix(backend::Context& ctx, const Tensor& snapshots, int64_t count, const Tensor& current,
                            Tensor& out) const {
  const int64_t tokens = current.dim(0), hidden = current.dim(1);
  R3_CHECK(hidden == norm_.numel() && out.dim(0) == tokens && out.dim(1) == hidden &&
               (count == 0 || (snapshots.dim(0) >= count && snapshots.dim(1) >= tokens && snapshots.dim(2) == hidden)),
           "attention residual: shape mismatch");
  const int64_t values = count + 1;
  const auto scratch = ctx.per_thread<float>(hidden + values);
  const float* query = query_.data<float>();
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
        ops::rms_norm_row(value(n), norm_.data<float>(), hidden, eps_, normed);
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

}  // namespace r3::models
