// The mega path: the model computes top-k ids and weights with its gate, and a fused experts
// module does dispatch, both GEMMs, the activation and the combine. That module bypasses the
// router object, so it is itself the capture source (explicit layer id, settable callback).
#pragma once

#include "moe/moe_block.h"

namespace r3::moe {

class MegaExperts final : public CaptureSource {
 public:
  MegaExperts(int64_t layer_id, const PhysicalExperts& experts) : layer_id_(layer_id), experts_(experts) {}

  int64_t layer_id() const override { return layer_id_; }
  // routing: the logical top-k ids and weights the model computed; capture: the step's buffer;
  // dispatcher: where the pairs' rows go (this device, or an expert-parallel rank's all-to-all).
  void forward(backend::Context& ctx, const Tensor& hidden, Routing routing, CaptureBuffer* capture, LoadCount load,
               const Dispatcher& dispatcher, Tensor& out) const;

 private:
  int64_t layer_id_;
  const PhysicalExperts& experts_;
};

class MegaMoe final : public MoeBlock {
 public:
  // gate: computes the routing on the model side (compute() only: it is not the capture point).
  MegaMoe(std::unique_ptr<Router> gate, std::shared_ptr<PhysicalExperts> experts);

  std::string path_name() const override { return "mega"; }
  CaptureSource* capture_source() override { return &mega_; }
  Gate gate() const override { return {gate_->gate_weight(), gate_->gate_bias(), gate_->rule()}; }
  void forward(backend::Context& ctx, const MoeInput& input, Tensor& out) const override;

 private:
  std::unique_ptr<Router> gate_;
  MegaExperts mega_;
};

}  // namespace r3::moe
