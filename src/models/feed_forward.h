// The feed-forward half of a decoder layer: a dense MLP, or an MoE layer with an optional
// (optionally gated) shared expert.
#pragma once

#include <memory>
#include <optional>

#include "models/swiglu_mlp.h"
#include "moe/moe_block.h"

namespace r3::models {

// out += shared(x), or out += sigmoid(x · gate) * shared(x) when `gate` (F32 [1, hidden]) is
// defined (Qwen2-MoE); the device layers share it.
void add_shared_expert(backend::Context& ctx, const Tensor& x, const SwigluMlp& shared, const Tensor& gate,
                       Tensor& out);

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // input.hidden, out: F32 [tokens, hidden]; input.forced: this layer's replayed routing.
  virtual void forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const = 0;
  // The MoE layer inside, if any (for capture binding and EPLB).
  virtual moe::MoeBlock* moe_block() { return nullptr; }
};

class DenseFeedForward final : public FeedForward {
 public:
  explicit DenseFeedForward(SwigluMlp mlp) : mlp_(std::move(mlp)) {}
  void forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const override;
  const SwigluMlp& mlp() const { return mlp_; }

 private:
  SwigluMlp mlp_;
};

class MoeFeedForward final : public FeedForward {
 public:
  // shared_gate: F32 [1, hidden] or empty (ungated shared expert).
  MoeFeedForward(std::unique_ptr<moe::MoeBlock> moe, std::optional<SwigluMlp> shared_expert,
                 Tensor shared_gate);
  void forward(backend::Context& ctx, const moe::MoeInput& input, Tensor& out) const override;
  moe::MoeBlock* moe_block() override { return moe_.get(); }
  const moe::MoeBlock& moe() const { return *moe_; }
  const std::optional<SwigluMlp>& shared_expert() const { return shared_expert_; }
  const Tensor& shared_gate() const { return shared_gate_; }

 private:
  std::unique_ptr<moe::MoeBlock> moe_;
  std::optional<SwigluMlp> shared_expert_;
  Tensor shared_gate_;
};

}  // namespace r3::models
