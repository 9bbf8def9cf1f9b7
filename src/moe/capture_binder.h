// Checks, at start-up, that routed-experts capture reaches every MoE layer of a model.
#pragma once

#include <span>

#include "moe/moe_block.h"

namespace r3::moe {

// Walks the MoE layers and finds each layer's capture point: a capture source first, else the
// router (modular path). Throws r3::Error, before any token runs, when a layer has none:
//   "Routed-experts capture is not supported with monolithic MoE kernel <name>."
//   "No supported MoE router found for routed-experts capture."
// and checks that every layer id appears once and the count equals the number of MoE layers.
// Returns the number of layers with a capture point. Nothing is bound: each step passes its own
// capture buffer with its input (moe/capture.h).
int64_t check_routing_capture(std::span<MoeBlock* const> layers);

}  // namespace r3::moe
