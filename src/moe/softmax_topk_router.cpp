#include "moe/softmax_topk_router.h"

#include <span>

#include "ops/linear.h"
#include "ops/topk.h"

namespace r3::moe {

SoftmaxTopKRouter::SoftmaxTopKRouter(Tensor gate_weight, int64_t top_k, bool normalize_topk)
    : gate_weight_(std::move(gate_weight)), top_k_(top_k), normalize_topk_(normalize_topk) {
  R3_CHECK(gate_weight_.rank() == 2, "router gate must be [num_experts, hidden]");
  R3_CHECK(top_k_ >= 1 && top_k_ <= gate_weight_.dim(0), "top_k ", top_k_, " must be in [1, ",
           gate_weight_.dim(0), "]");
}

void SoftmaxTopKRouter::route(ThreadPool& pool, const Tensor& hidden, Routing& out) const {
  const int64_t tokens = hidden.dim(0), experts = num_experts();
  Tensor logits = Tensor::empty(DType::F32, {tokens, experts});
  ops::linear(pool, hidden, gate_weight_, nullptr, logits);
  out.resize(tokens, top_k_);
  for (int64_t t = 0; t < tokens; ++t) {
    std::span<float> probs(logits.data<float>() + t * experts, static_cast<std::size_t>(experts));
    ops::softmax(probs);
    const std::vector<int32_t> chosen = ops::topk_indices(probs, top_k_);
    double sum = 0;
    for (int32_t e : chosen) sum += probs[static_cast<std::size_t>(e)];
    for (int64_t k = 0; k < top_k_; ++k) {
      const float p = probs[static_cast<std::size_t>(chosen[k])];
      out.expert_ids[t * top_k_ + k] = chosen[k];
      out.weights[t * top_k_ + k] = normalize_topk_ ? static_cast<float>(p / sum) : p;
    }
  }
}

}  // namespace r3::moe
