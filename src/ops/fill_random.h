// Random weights made on the device, for benchmarks at real model shapes without a checkpoint
// (models/device_decoder.h, synthetic_on_device): value i = center + bound * u(seed, i), u
// uniform in [-1, 1) from a counter-based hash, so a tensor is the same for a seed whatever the
// launch shape. CUDA only.
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops {

#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_fill_random.cu
// t: a contiguous F32, BF16 or F8_E4M3 (rounded to nearest, saturating at ±448) device tensor.
void fill_uniform(backend::Context& ctx, Tensor& t, uint64_t seed, float center, float bound);
}
#endif

}  // namespace r3::ops
