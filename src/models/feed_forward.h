// The feed-forward half of a decoder layer: a dense MLP, or an MoE layer with an optional
// (optionally gated) shared expert.
#pragma once

#include <memory>
#include <optional>

#include "models/swiglu_mlp.h"
#include "moe/moe_layer.h"

namespace r3::models {

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // x, out: F32 [tokens, hidden]; capture may be null.
  virtual void forward(ThreadPool& pool, const Tensor& x, moe::RoutingCapture* capture,
                       Tensor& out) const = 0;
};

class DenseFeedForward final : public FeedForward {
 public:
  explicit DenseFeedForward(SwigluMlp mlp) : mlp_(std::move(mlp)) {}
  void forward(ThreadPool& pool, const Tensor& x, moe::RoutingCapture* capture,
               Tensor& out) const override;

 private:
  SwigluMlp mlp_;
};

class MoeFeedForward final : public FeedForward {
 public:
  // shared_gate: F32 [1, hidden] or empty (ungated shared expert).
  MoeFeedForward(moe::MoeLayer moe, std::optional<SwigluMlp> shared_expert, Tensor shared_gate);
  void forward(ThreadPool& pool, const Tensor& x, moe::RoutingCapture* capture,
               Tensor& out) const override;

 private:
  moe::MoeLayer moe_;
  std::optional<SwigluMlp> shared_expert_;
  Tensor shared_gate_;
};

}  // namespace r3::models
