#include "moe/softmax_topk_router.h"

#include "moe/softmax_topk.h"
#include "ops/linear.h"

namespace r3::moe {

SoftmaxTopKRouter::SoftmaxTopKRouter(int64_t layer_id, Tensor gate_weight, int64_t top_k,
                                     bool normalize_topk)
    : Router(layer_id),
      gate_weight_(std::move(gate_weight)),
      top_k_(top_k),
      normalize_topk_(normalize_topk) {
  R3_CHECK(gate_weight_.rank() == 2, "router gate must be [num_experts, hidden]");
  R3_CHECK(top_k_ >= 1 && top_k_ <= gate_weight_.dim(0), "top_k ", top_k_, " must be in [1, ",
           gate_weight_.dim(0), "]");
}

void SoftmaxTopKRouter::select(ThreadPool& pool, const Tensor& hidden,
                               std::span<const int32_t> forced, Routing& out) const {
  const int64_t tokens = hidden.dim(0), experts = num_experts();
  Tensor logits = Tensor::empty(DType::F32, {tokens, experts});
  ops::linear(pool, hidden, gate_weight_, nullptr, logits);
  for (int64_t t = 0; t < tokens; ++t) {
    std::span<float> row(logits.data<float>() + t * experts, static_cast<std::size_t>(experts));
    auto forced_row = forced.empty() ? forced : forced.subspan(static_cast<std::size_t>(t * top_k_),
                                                               static_cast<std::size_t>(top_k_));
    softmax_topk_route(row, top_k_, normalize_topk_, forced_row, out.expert_ids.data() + t * top_k_,
                       out.weights.data() + t * top_k_);
  }
}

}  // namespace r3::moe
