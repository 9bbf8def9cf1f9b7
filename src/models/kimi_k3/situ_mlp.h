// Kimi K3's dense MLP (dense layers and shared experts): down(situ(gate(x), up(x))), the same
// activation as its routed experts (moe::ExpertActivation::situ, ops::situ).
#pragma once

#include "backend/context.h"
#include "core/tensor.h"
#include "moe/physical_experts.h"

namespace r3::models {

class SituMlp {
 public:
  SituMlp(Tensor gate, Tensor up, Tensor down, moe::ExpertActivation activation);
  // x, out: F32 [tokens, hidden].
  void forward(backend::Context& ctx, const Tensor& x, Tensor& out) const;

 private:
  Tensor gate_, up_, down_;
  moe::ExpertActivation activation_;
};

}  // namespace r3::models
