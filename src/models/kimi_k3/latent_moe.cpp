#include "models/kimi_k3/latent_moe.h"

#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::models {

LatentMoeFeedForward::LatentMoeFeedForward(std::unique_ptr<moe::MoeBlock> moe, LatentMoeWeights latent,
                                           float rms_eps, SituMlp shared)
    : moe_(std::move(moe)), latent_(std::move(latent)), rms_eps_(rms_eps), shared_(std::move(shared)) {}

void LatentMoeFeedForward::forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const {
  const int64_t tokens = input.hidden.dim(0), width = latent_.down.dim(0);
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor latent_in = ctx.scratch(DType::F32, {tokens, width});
  ops::linear(ctx, input.hidden, latent_.down, nullptr, latent_in);
  moe::MoeInput routed_input = input;  // routes on the hidden state, the experts take the latent
  routed_input.experts_input = &latent_in;
  Tensor routed = ctx.scratch(DType::F32, {tokens, width});
  moe_->forward(ctx, routed_input, routed);
  ops::rms_norm(ctx, routed, &latent_.norm, rms_eps_, routed);
  ops::linear(ctx, routed, latent_.up, nullptr, out);
  Tensor shared = ctx.scratch(DType::F32, {tokens, out.dim(1)});
  shared_.forward(ctx, input.hidden, shared);
  ops::add_rows(ctx, shared, nullptr, out);
}

}  // namespace r3::models
