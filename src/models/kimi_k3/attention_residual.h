// Kimi K3's attention residuals. Instead of one running residual sum, a layer's input is mixed
// from snapshots of the hidden state taken at the start of each block of layers: per token, the
// block snapshots and the current state are the keys and values of a one-query attention whose
// query is a learned vector (pseudo-queries), keys RMS-normalised:
//   p = softmax_n(query · rms_norm(v_n) * norm_weight),   mixed = sum_n p_n v_n
// Each token mixes only its own rows, so the result does not depend on the batch.
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::models {

class AttentionResidual {
 public:
  // query: the pseudo-queries' weight F32 [1, hidden] (or [hidden]); norm: F32 [hidden].
  AttentionResidual(Tensor query, Tensor norm, float eps);

  // snapshots: F32 [count, tokens, hidden] (count >= 0 used), current: F32 [tokens, hidden];
  // out: F32 [tokens, hidden] (not aliasing either).
  void mix(backend::Context& ctx, const Tensor& snapshots, int64_t count, const Tensor& current, Tensor& out) const;

  // Placing the model on a device copies them.
  const Tensor& query() const { return query_; }
  const Tensor& norm() const { return norm_; }
  float eps() const { return eps_; }

 private:
  Tensor query_, norm_;
  float eps_;
};

}  // namespace r3::models
