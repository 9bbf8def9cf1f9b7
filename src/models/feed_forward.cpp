#include "models/feed_forward.h"

#include "ops/activation.h"
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
  if (shared_gate_.defined()) {
    gate = ctx.scratch(DType::F32, {tokens, 1});
    ops::linear(ctx, x, shared_gate_, nullptr, gate);
  }
  float* o = out.data<float>();
  const float* s = shared.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float scale = gate.defined() ? ops::sigmoid(gate.data<float>()[t]) : 1.0f;
    for (int64_t d = 0; d < hidden; ++d) o[t * hidden + d] += scale * s[t * hidden + d];
  }
}

}  // namespace r3::models
