#include "models/kimi_k3/attention_residual.h"

#include "core/check.h"
#include "ops/residual_mix.h"

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
  ops::residual_mix(ctx, query_, norm_, eps_, snapshots, count, current, out);
}

}  // namespace r3::models
