#include "moe/swiglu_experts.h"

#include <algorithm>
#include <cstring>

#include "ops/activation.h"
#include "ops/linear.h"

namespace r3::moe {

SwigluExperts::SwigluExperts(std::vector<SwigluExpertWeights> experts)
    : experts_(std::move(experts)) {
  R3_CHECK(!experts_.empty(), "an MoE layer needs at least one expert");
  intermediate_ = experts_[0].gate.dim(0);
  hidden_ = experts_[0].gate.dim(1);
  for (const auto& e : experts_) {
    R3_CHECK(e.gate.shape() == Shape({intermediate_, hidden_}) && e.up.shape() == e.gate.shape() &&
                 e.down.shape() == Shape({hidden_, intermediate_}),
             "experts of one layer must share their shapes");
  }
}

void SwigluExperts::forward(ThreadPool& pool, const Tensor& hidden, const Routing& routing,
                            Tensor& out) const {
  const int64_t tokens = hidden.dim(0), k = routing.top_k;
  R3_CHECK(hidden.dim(1) == hidden_ && out.shape() == hidden.shape() && routing.tokens == tokens,
           "experts: shape mismatch");

  // Permute: the (token, slot) pairs of each expert, in token order.
  std::vector<std::vector<int64_t>> slots_of(experts_.size());
  for (int64_t s = 0; s < tokens * k; ++s) {
    const int32_t e = routing.expert_ids[static_cast<std::size_t>(s)];
    R3_CHECK(e >= 0 && e < num_experts(), "experts: id ", e, " out of range [0, ", num_experts(),
             ")");
    slots_of[static_cast<std::size_t>(e)].push_back(s);
  }

  // Grouped GEMMs: one gate/up/down pass per expert over its gathered rows.
  Tensor slot_out = Tensor::empty(DType::F32, {tokens * k, hidden_});
  const float* x = hidden.data<float>();
  for (std::size_t e = 0; e < experts_.size(); ++e) {
    const auto& slots = slots_of[e];
    const auto n = static_cast<int64_t>(slots.size());
    if (n == 0) continue;
    Tensor gathered = Tensor::empty(DType::F32, {n, hidden_});
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(gathered.data<float>() + i * hidden_, x + (slots[i] / k) * hidden_,
                  sizeof(float) * static_cast<std::size_t>(hidden_));
    }
    Tensor gate = Tensor::empty(DType::F32, {n, intermediate_});
    Tensor up = Tensor::empty(DType::F32, {n, intermediate_});
    Tensor down = Tensor::empty(DType::F32, {n, hidden_});
    ops::linear(pool, gathered, experts_[e].gate, nullptr, gate);
    ops::linear(pool, gathered, experts_[e].up, nullptr, up);
    ops::silu_and_mul(gate, up, gate);
    ops::linear(pool, gate, experts_[e].down, nullptr, down);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(slot_out.data<float>() + slots[i] * hidden_, down.data<float>() + i * hidden_,
                  sizeof(float) * static_cast<std::size_t>(hidden_));
    }
  }

  // Combine in slot order.
  float* o = out.data<float>();
  const float* so = slot_out.data<float>();
  std::fill(o, o + tokens * hidden_, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const float w = routing.weights[static_cast<std::size_t>(t * k + j)];
      const float* row = so + (t * k + j) * hidden_;
      for (int64_t d = 0; d < hidden_; ++d) o[t * hidden_ + d] += w * row[d];
    }
  }
}

}  // namespace r3::moe
