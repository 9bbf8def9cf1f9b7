// The routed experts on the GPU, the analogue of the `mega` path: one call takes the step's
// top-k ids and weights (as the routing kernel left them, on the device) and runs dispatch, the
// gate/up GEMVs with the activation, the down GEMV and the weighted combine, with no host
// round trip. This first version gives every (token, choice) pair its own warps over the
// expert's rows, so an expert chosen by several tokens is read once per token: correct for
// every batch, bandwidth-optimal only at batch 1 (grouping pairs by expert comes next).
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"
#include "moe/physical_experts.h"

namespace r3::moe {

// Every expert's weights stacked on the device in one dtype (F32 or BF16): gate and up
// [experts, intermediate, hidden], down [experts, hidden, intermediate]; biases F32
// [experts, intermediate] / [experts, hidden] or undefined.
struct DeviceExperts {
  Tensor gate, up, down;
  Tensor gate_bias, up_bias, down_bias;
  ExpertActivation activation;
};

#if R3_WITH_CUDA
// hidden: device F32 [tokens, H]; ids, weights: device [tokens, k] (physical ids); out: device F32
// [tokens, H] (overwritten); activated [tokens * k, I] and expert_out [tokens * k, H]: device F32
// scratch.
void fused_experts_on_device(backend::Context& ctx, const Tensor& hidden, const int32_t* ids, const float* weights,
                             int64_t k, const DeviceExperts& experts, Tensor& activated, Tensor& expert_out,
                             Tensor& out);
#endif

}  // namespace r3::moe
