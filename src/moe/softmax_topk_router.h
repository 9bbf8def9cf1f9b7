// Softmax over a linear gate's logits, top-k selection, optional renormalisation of the k
// weights (Qwen3-MoE/Qwen2-MoE/OLMoE `norm_topk_prob`, always on for Mixtral).
#pragma once

#include "moe/router.h"

namespace r3::moe {

class SoftmaxTopKRouter final : public Router {
 public:
  // gate_weight: F32 [num_experts, hidden].
  SoftmaxTopKRouter(Tensor gate_weight, int64_t top_k, bool normalize_topk);

  int64_t num_experts() const override { return gate_weight_.dim(0); }
  int64_t top_k() const override { return top_k_; }
  std::string name() const override { return "softmax-topk"; }
  void route(ThreadPool& pool, const Tensor& hidden, Routing& out) const override;

 private:
  Tensor gate_weight_;
  int64_t top_k_;
  bool normalize_topk_;
};

}  // namespace r3::moe
