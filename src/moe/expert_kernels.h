// The two ways r3 runs the routed experts of a step (SwiGLU: down(silu(gate x) * up x)). Both
// take the step's pairs from a Dispatcher (moe/dispatcher.h), multiply each expert's group of
// rows with its weights from the ExpertBank, and let the dispatcher combine. Every (token,
// choice) output comes from the same fixed-order dot products and a token's k outputs are
// combined in choice order, so the two agree bit for bit and neither depends on which other
// tokens share the step. Scratch comes from the context's workspace.
#pragma once

#include "backend/context.h"
#include "core/tensor.h"
#include "moe/dispatcher.h"
#include "moe/physical_experts.h"

namespace r3::moe {

// Modular: expert by expert, a gate/up GEMM over the group, the activation, a down GEMM (each
// GEMM parallel over its weight rows).
void grouped_experts(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                     const PhysicalExperts& experts, Tensor& out, const Dispatcher& dispatcher = local_dispatcher());

// Fused: both projections and the activation of every expert as one task list over (expert,
// panel of output rows), so all experts' weights stream through the threads in one pass (the
// shape of a fused "mega" experts kernel).
void fused_experts(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                   const PhysicalExperts& experts, Tensor& out, const Dispatcher& dispatcher = local_dispatcher());

}  // namespace r3::moe
