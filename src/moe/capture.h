// The capture point of routed-experts capture (R3).
//
// Every MoE execution path turns its Routing into a CapturedRouting by calling capture(), and
// the EPLB map (PhysicalExperts::map) accepts nothing else. So no path can remap logical ids
// to physical replicas, or run experts, before the logical ids have been offered to the capture
// sink: the ordering DESIGN.md asks for holds by construction.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "moe/routing.h"

namespace r3::moe {

// Receives (MoE layer id, logical ids [tokens, top_k], weights [tokens, top_k]).
using CaptureSink = std::function<void(int64_t moe_layer_id, std::span<const int32_t> logical_ids,
                                       std::span<const float> weights)>;

// Anything with an explicit MoE layer id (assigned when the model is built) and a settable
// capture callback: a fused experts module, or a fused kernel that can report its routing.
class CaptureSource {
 public:
  virtual ~CaptureSource() = default;
  virtual int64_t layer_id() const = 0;
  virtual void set_capture(CaptureSink sink) = 0;
};

// A Routing of logical ids that has passed the capture point.
class CapturedRouting {
 public:
  const Routing& routing() const { return routing_; }

 private:
  explicit CapturedRouting(Routing routing) : routing_(std::move(routing)) {}
  friend CapturedRouting capture(Routing routing, int64_t layer_id, const CaptureSink& sink);
  Routing routing_;
};

// Offers the logical ids to `sink` (when one is bound) and marks the routing as captured.
CapturedRouting capture(Routing routing, int64_t layer_id, const CaptureSink& sink);

}  // namespace r3::moe
