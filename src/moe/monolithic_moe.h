// The monolithic path: one fused routine computes the gate, the routing (any RoutingRule) and
// the experts. A fused kernel must declare whether it can write the routing it chose to a
// capture buffer. r3 has two: "cpu-fused-<rule>", which can (it is then a capture source), and
// "cpu-fused-<rule>-nocapture", a minimal kernel that cannot, so that asking for capture with
// it fails at start-up rather than returning nothing.
#pragma once

#include "moe/moe_block.h"

namespace r3::moe {

class MonolithicMoe final : public MoeBlock, public CaptureSource {
 public:
  MonolithicMoe(int64_t layer_id, Tensor gate_weight, std::shared_ptr<const RoutingRule> rule,
                std::shared_ptr<PhysicalExperts> experts, bool can_capture, Tensor gate_bias = Tensor());

  std::string kernel_name() const;
  std::string path_name() const override { return can_capture_ ? "monolithic" : "monolithic-nocapture"; }
  CaptureSource* capture_source() override { return can_capture_ ? this : nullptr; }
  std::string non_capturing_kernel() const override { return can_capture_ ? "" : kernel_name(); }

  int64_t layer_id() const override { return MoeBlock::layer_id(); }
  Gate gate() const override { return {gate_weight_, gate_bias_, *rule_}; }

  void forward(backend::Context& ctx, const MoeInput& input, Tensor& out) const override;

 private:
  Tensor gate_weight_;
  std::shared_ptr<const RoutingRule> rule_;
  Tensor gate_bias_;
  bool can_capture_;
};

}  // namespace r3::moe
