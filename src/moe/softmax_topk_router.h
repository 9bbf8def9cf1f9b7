// Router for the softmax top-k rule (see softmax_topk.h) over a linear gate.
#pragma once

#include "moe/router.h"

namespace r3::moe {

class SoftmaxTopKRouter final : public Router {
 public:
  // gate_weight: F32 [num_experts, hidden].
  SoftmaxTopKRouter(int64_t layer_id, Tensor gate_weight, int64_t top_k, bool normalize_topk);

  int64_t num_experts() const override { return gate_weight_.dim(0); }
  int64_t top_k() const override { return top_k_; }
  std::string name() const override { return "softmax-topk"; }
  const Tensor& gate_weight() const { return gate_weight_; }
  bool normalize_topk() const { return normalize_topk_; }

 protected:
  void select(ThreadPool& pool, const Tensor& hidden, std::span<const int32_t> forced,
              Routing& out) const override;

 private:
  Tensor gate_weight_;
  int64_t top_k_;
  bool normalize_topk_;
};

}  // namespace r3::moe
