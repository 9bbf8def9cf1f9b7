// A dense SwiGLU MLP: down(silu(gate(x)) * up(x)), optionally with DeepSeek-V4's clamps
// (gate <= limit, |up| <= limit). Dense layers and shared experts use it.
#pragma once

#include <cmath>

#include "core/tensor.h"
#include "backend/context.h"

namespace r3::models {

class SwigluMlp {
 public:
  SwigluMlp(Tensor gate, Tensor up, Tensor down, float limit = INFINITY);
  // x, out: F32 [tokens, hidden].
  void forward(backend::Context& ctx, const Tensor& x, Tensor& out) const;

  const Tensor& gate() const { return gate_; }
  const Tensor& up() const { return up_; }
  const Tensor& down() const { return down_; }
  float limit() const { return limit_; }

 private:
  Tensor gate_, up_, down_;
  float limit_;
};

}  // namespace r3::models
