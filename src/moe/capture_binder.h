// Binds routed-experts capture to every MoE layer of a model, at start-up.
#pragma once

#include <span>
#include <vector>

#include "moe/moe_block.h"

namespace r3::moe {

// Walks the MoE layers and binds `sink` to each layer's capture point: capture sources first,
// then routers of the layers still unbound. Throws r3::Error, before any token runs, when a
// layer cannot be bound:
//   "Routed-experts capture is not supported with monolithic MoE kernel <name>."
//   "No supported MoE router found for routed-experts capture."
// and checks that the number bound equals the number of MoE layers, each layer id once.
// Returns the number of layers bound.
int64_t bind_routing_capture(std::span<MoeBlock* const> layers, const CaptureSink& sink);

// Binds for the lifetime of the object and unbinds after, so no capture point keeps calling a
// sink (and its buffer) that is gone.
class ScopedCaptureBinding {
 public:
  ScopedCaptureBinding(std::vector<MoeBlock*> layers, const CaptureSink& sink);
  ~ScopedCaptureBinding();
  ScopedCaptureBinding(const ScopedCaptureBinding&) = delete;
  ScopedCaptureBinding& operator=(const ScopedCaptureBinding&) = delete;

 private:
  std::vector<MoeBlock*> layers_;
};

}  // namespace r3::moe
