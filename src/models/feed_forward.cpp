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

void add_shared_expert(backend::Context& ctx, const Tensor& x, const SwigluMlp& shared_expert, const Tensor& gate,
                       Tensor& out) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor shared = ctx.scratch(DType::F32, {tokens, hidden});
  shared_expert.forward(ctx, x, shared);
  Tensor gate_logit;
  if (gate.defined()) {
    gate_logit = ctx.scratch(DType::F32, {tokens, 1});
    ops::linear(ctx, x, gate, nullptr, gate_logit);
  }
  ops::add_rows(ctx, shared, gate_logit.if_defined(), out);
}

void MoeFeedForward::forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const {
  moe_->forward(ctx, input, out);
  if (shared_expert_) add_shared_expert(ctx, input.hidden, *shared_expert_, shared_gate_, out);
}

}  // namespace r3::models
