// The capture point of routed-experts capture (R3).
//
// A step's routed experts go into a capture buffer that the step owns (the engine's
// RoutingCapturer) and passes with its input: nothing is bound into the model, so two engines
// over one model never see each other's routing. Every MoE path turns its Routing into a
// CapturedRouting by calling capture(), which needs that buffer; the EPLB map
// (PhysicalExperts::map) accepts nothing else, and a PhysicalRouting only comes out of the map.
// So no path can remap logical ids to physical replicas, or run experts, before the logical ids
// are in the step's buffer: the ordering DESIGN.md asks for holds by construction.
#pragma once

#include <cstdint>
#include <span>

#include "moe/routing.h"

namespace r3::moe {

// Where one step's routing goes: (MoE layer id, logical ids [tokens, top_k], weights [tokens, top_k],
// routing margins [tokens] or empty when the path does not compute them).
class CaptureBuffer {
 public:
  virtual ~CaptureBuffer() = default;
  virtual void record(int64_t moe_layer_id, std::span<const int32_t> logical_ids, std::span<const float> weights,
                      std::span<const float> margins) = 0;
};

// A fused module or kernel that sees the routing itself (the mega experts module, the capturing
// fused kernel) and captures it: the binder counts it as its layer's capture point. Its layer id
// is assigned when the model is built.
class CaptureSource {
 public:
  virtual ~CaptureSource() = default;
  virtual int64_t layer_id() const = 0;
};

// A Routing of logical ids that has passed the capture point.
class CapturedRouting {
 public:
  const Routing& routing() const { return routing_; }

 private:
  explicit CapturedRouting(Routing routing) : routing_(std::move(routing)) {}
  friend CapturedRouting capture(Routing routing, int64_t layer_id, CaptureBuffer* buffer);
  Routing routing_;
};

// Records the logical ids in the step's `buffer` and marks the routing as captured. Throws when
// the step brought no buffer.
CapturedRouting capture(Routing routing, int64_t layer_id, CaptureBuffer* buffer);

}  // namespace r3::moe
