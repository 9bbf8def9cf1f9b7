// How to run a loaded model's MoE layers: execution path and expert-parallel load balancing.
#pragma once

#include "moe/eplb/eplb_controller.h"
#include "moe/moe_path.h"

namespace r3::models {

struct LoadOptions {
  moe::MoePath moe_path = moe::MoePath::kMonolithic;  // the CPU default (paths compared: docs/performance.md)
  moe::EplbOptions eplb;
};

}  // namespace r3::models
