// One MoE layer, whatever runs it. Every execution path keeps the same order,
//
//   hidden -> routing -> CAPTURE(logical ids) -> EPLB map -> experts -> combine
//
// and the types make it the only order possible: PhysicalExperts::map() takes a
// CapturedRouting, which only capture() produces.
//
// For the binder, a block exposes its capture point: a capture source (fused modules that see
// the routing themselves), or a router (the modular path). A monolithic kernel that cannot
// report its routing exposes neither and names itself, so binding fails with a clear message.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "core/tensor.h"
#include "backend/context.h"
#include "moe/capture.h"
#include "moe/physical_experts.h"
#include "moe/router.h"

namespace r3::moe {

class MoeBlock {
 public:
  MoeBlock(int64_t layer_id, std::shared_ptr<PhysicalExperts> experts)
      : layer_id_(layer_id), experts_(std::move(experts)) {}
  virtual ~MoeBlock() = default;

  // Index among the model's MoE layers, assigned when the model is built.
  int64_t layer_id() const { return layer_id_; }
  PhysicalExperts& experts() { return *experts_; }
  const PhysicalExperts& experts() const { return *experts_; }
  virtual std::string path_name() const = 0;

  virtual CaptureSource* capture_source() { return nullptr; }
  virtual Router* capture_router() { return nullptr; }
  // Name of a monolithic kernel that cannot write its routing to a capture buffer; empty
  // otherwise.
  virtual std::string non_capturing_kernel() const { return ""; }

  // The layer's linear gate and routing rule, whatever path runs them: a device copy of the layer
  // (models/device_decoder.h) routes with these.
  struct Gate {
    const Tensor& weight;  // F32 [experts, hidden]
    const Tensor& bias;    // F32 [experts] or undefined
    const RoutingRule& rule;
  };
  virtual Gate gate() const = 0;

  // out: F32 [tokens, hidden].
  virtual void forward(backend::Context& ctx, const MoeInput& input, Tensor& out) const = 0;

 private:
  int64_t layer_id_;
  std::shared_ptr<PhysicalExperts> experts_;
};

}  // namespace r3::moe
