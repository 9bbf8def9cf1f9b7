// The routed experts of one MoE layer, each a SwiGLU MLP: down(silu(gate(x)) * up(x)).
// Tokens are grouped by expert, each expert runs its GEMMs on its group, and the k outputs of a
// token are combined in the router's slot order (so a token's result never depends on which
// other tokens share the step).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "moe/routing.h"

namespace r3::moe {

struct SwigluExpertWeights {
  Tensor gate;  // [intermediate, hidden]
  Tensor up;    // [intermediate, hidden]
  Tensor down;  // [hidden, intermediate]
};

class SwigluExperts {
 public:
  explicit SwigluExperts(std::vector<SwigluExpertWeights> experts);

  int64_t num_experts() const { return static_cast<int64_t>(experts_.size()); }
  int64_t hidden_size() const { return hidden_; }

  // hidden, out: F32 [tokens, hidden]; routing ids index this module's experts.
  void forward(ThreadPool& pool, const Tensor& hidden, const Routing& routing, Tensor& out) const;

 private:
  std::vector<SwigluExpertWeights> experts_;
  int64_t hidden_ = 0;
  int64_t intermediate_ = 0;
};

}  // namespace r3::moe
