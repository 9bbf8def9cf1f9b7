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
  // MoE layers [0, routed) of a step at once, as a device step brings them back: ids [tokens,
  // layers, top_k], weights [layers, tokens, top_k], margins [tokens, layers] (a failed step
  // routed fewer than `layers`). The default records layer by layer (gathering each layer's rows
  // into vectors of its own); the engine's buffer takes a whole step in one pass.
  virtual void record_layers(int64_t routed, int64_t layers, int64_t tokens, int64_t top_k,
                             std::span<const int32_t> ids, std::span<const float> weights,
                             std::span<const float> margins);
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
