// The fused experts' kernels over ids given as they are: what moe/device_experts.h's
// fused_experts_on_device runs for a routing out of the EPLB map. Kernel tests and benchmarks
// call it with ids of their own; a model's MoE layer goes through fused_experts_on_device, which
// takes only a DevicePhysicalRouting.
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"
#include "moe/device_experts.h"

namespace r3::moe {

// ids, weights: device [tokens, k] (physical ids within the experts); the rest as
// fused_experts_on_device.
void fused_experts_of_ids(backend::Context& ctx, const Tensor& hidden, const int32_t* ids, const float* weights,
                          int64_t k, const DeviceExperts& experts, Tensor& grouping, Tensor& activated,
                          Tensor& expert_out, Tensor& out, bool always_grouped = false);

}  // namespace r3::moe
