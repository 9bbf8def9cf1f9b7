#include "models/kimi_k3/situ_mlp.h"

#include "core/check.h"
#include "ops/activation.h"
#include "ops/linear.h"

namespace r3::models {

SituMlp::SituMlp(Tensor gate, Tensor up, Tensor down, moe::ExpertActivation activation)
    : gate_(std::move(gate)), up_(std::move(up)), down_(std::move(down)), activation_(activation) {
  R3_CHECK(activation_.kind == moe::ExpertActivation::Kind::kSitu, "SiTU MLP: built with another activation");
}

void SituMlp::forward(backend::Context& ctx, const Tensor& x, Tensor& out) const {
  const int64_t tokens = x.dim(0), width = gate_.dim(0);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor g = ctx.scratch(DType::F32, {tokens, width});
  Tensor u = ctx.scratch(DType::F32, {tokens, width});
  ops::linear(ctx, x, gate_, nullptr, g);
  ops::linear(ctx, x, up_, nullptr, u);
  ops::situ_and_mul(ctx, g, u, g, activation_.beta, activation_.linear_beta);
  ops::linear(ctx, g, down_, nullptr, out);
}

}  // namespace r3::models
