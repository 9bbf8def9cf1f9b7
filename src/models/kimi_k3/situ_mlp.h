// Kimi K3's dense MLP (dense layers and shared experts): down(situ(gate(x), up(x))), the same
// activation as its routed experts (moe::ExpertActivation::situ, ops::situ). Runs wherever its
// context and weights are (every step is an op with a CUDA implementation).
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

  const Tensor& gate() const { return gate_; }
  const Tensor& up() const { return up_; }
  const Tensor& down() const { return down_; }
  const moe::ExpertActivation& activation() const { return activation_; }

 private:
  Tensor gate_, up_, down_;
  moe::ExpertActivation activation_;
};

}  // namespace r3::models
