#include "models/swiglu_mlp.h"

#include "ops/activation.h"
#include "ops/linear.h"

namespace r3::models {

SwigluMlp::SwigluMlp(Tensor gate, Tensor up, Tensor down, float limit)
    : gate_(std::move(gate)), up_(std::move(up)), down_(std::move(down)), limit_(limit) {}

void SwigluMlp::forward(backend::Context& ctx, const Tensor& x, Tensor& out) const {
  const int64_t tokens = x.dim(0), width = gate_.dim(0);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor g = ctx.scratch(DType::F32, {tokens, width});
  Tensor u = ctx.scratch(DType::F32, {tokens, width});
  ops::linear(ctx, x, gate_, nullptr, g);
  ops::linear(ctx, x, up_, nullptr, u);
  ops::silu_and_mul(ctx, g, u, g, limit_);
  ops::linear(ctx, g, down_, nullptr, out);
}

}  // namespace r3::models
