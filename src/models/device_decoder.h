// A loaded decoder placed on a CUDA device: its weights copied to device memory, its KV caches
// made there, and every step run by the CUDA kernels, with the routed experts captured on the
// device by the routing kernel itself (moe/device_routing.h) before the experts run.
//
// The host model stays the source of truth: the device copy is made from it, keeps it alive
// (checkpoint mapping, MoE blocks for capture binding), and reports its info and MoE layers. A
// step's host work is building its metadata (one asynchronous upload, models/device_step_builder.h);
// the host waits once, for the logits, then collects the captured rows from pinned memory.
//
// Float32 weights (the parity mode; experts keep their stored dtype, which the experts kernel
// widens exactly). What has no device kernels yet is refused by name when the model is placed:
// DeepSeek-V4, multi-head latent attention (DeepSeek-V2/V3), DeepSeek-V2's routing, and EPLB
// replicas or rebalancing.
#pragma once

#include <memory>

#include "backend/context.h"
#include "models/causal_lm.h"

namespace r3::models {

// `model` on ctx's CUDA device (ctx must outlive the result). Throws r3::Error for what the CUDA
// backend cannot run yet, or when this build has no CUDA backend.
std::unique_ptr<CausalLM> place_on_device(backend::Context& ctx, std::unique_ptr<CausalLM> model);

}  // namespace r3::models
