// The two ways r3 runs the routed experts of a step (SwiGLU: down(silu(gate x) * up x)).
// Both compute each (token, choice) output with the same fixed-order dot products and combine a
// token's k outputs in choice order, so they agree bit for bit and neither depends on which other
// tokens share the step.
#pragma once

#include "core/tensor.h"
#include "backend/context.h"
#include "moe/physical_experts.h"

namespace r3::moe {

// Modular: permute (token, choice) pairs by physical expert, gather each expert's rows, run its
// gate/up/down GEMMs over the group, scatter back, combine.
void grouped_experts(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                     const PhysicalExperts& experts, Tensor& out);

// Fused: one pass over (token, choice) pairs doing dispatch, both projections, the activation and
// the combine per pair, with no permutation (the shape of a fused "mega" experts kernel).
void fused_experts(backend::Context& ctx, const Tensor& hidden, const PhysicalRouting& routing,
                   const PhysicalExperts& experts, Tensor& out);

}  // namespace r3::moe
