#include "models/feed_forward.h"

#include "ops/elementwise.h"
#include "ops/linear.h"

namespace r3::models {

void DenseFeedForward::forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const {
  mlp_.forward(ctx, input.hidden, out);
}

MoeFeedForward::MoeFeedForward(std::unique_ptr<moe::MoeBlock> moe, std::optional<SwigluMlp> shared_expert,
                               Tensor shared_gate)
    : moe_(std::move(moe)),
      shared_expert_(std::move(shared_expert)),
      shared_gate_(std::move(shared_gate)) {}

void MoeFeedForward::forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const {
  const Tensor& x = input.hidden;
  moe_->forward(ctx, input, out);
  if (!shared_expert_) return;
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor shared = ctx.scratch(DType::F32, {tokens, hidden});
  shared_expert_->forward(ctx, x, shared);
  Tensor gate;
  if (shared_gate_.defined()) {  // Qwen2-MoE: out += sigmoid(x · g) * shared
    gate = ctx.scratch(DType::F32, {tokens, 1});
    ops::linear(ctx, x, shared_gate_, nullptr, gate);
  }
  ops::add_rows(ctx, shared, gate.if_defined(), out);
}

}  // namespace r3::models
