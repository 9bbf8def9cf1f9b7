// Kimi K3's feed-forward layers. The MoE routes on the hidden state (DeepSeek-V3's rule, through
// the shared MoE pipeline: routing -> capture -> EPLB map -> experts), runs its routed experts in
// a smaller latent width:
//   routed = up(rms_norm(experts(down(x))))      (routed_expert_{down_proj, norm, up_proj})
// and adds the shared experts at full width; the dense layers are a SiTU MLP.
#pragma once

#include <memory>

#include "models/feed_forward.h"
#include "models/kimi_k3/situ_mlp.h"

namespace r3::models {

struct LatentMoeWeights {
  Tensor down;  // [latent, hidden]
  Tensor norm;  // [latent]
  Tensor up;    // [hidden, latent]
};

class LatentMoeFeedForward final : public FeedForward {
 public:
  LatentMoeFeedForward(std::unique_ptr<moe::MoeBlock> moe, LatentMoeWeights latent, float rms_eps, SituMlp shared);
  void forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const override;
  moe::MoeBlock* moe_block() override { return moe_.get(); }

  // Placing the model on a device copies them.
  const moe::MoeBlock& moe() const { return *moe_; }
  const LatentMoeWeights& latent() const { return latent_; }
  float rms_eps() const { return rms_eps_; }
  const SituMlp& shared() const { return shared_; }

 private:
  std::unique_ptr<moe::MoeBlock> moe_;
  LatentMoeWeights latent_;
  float rms_eps_;
  SituMlp shared_;
};

class SituFeedForward final : public FeedForward {
 public:
  explicit SituFeedForward(SituMlp mlp) : mlp_(std::move(mlp)) {}
  void forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const override {
    mlp_.forward(ctx, input.hidden, out);
  }
  const SituMlp& mlp() const { return mlp_; }

 private:
  SituMlp mlp_;
};

}  // namespace r3::models
