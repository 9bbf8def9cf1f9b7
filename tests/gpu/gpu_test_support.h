// What the CUDA op tests share: random host tensors, the relative error they are held to, and
// small int32 arrays on the device.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::test {

// A host float32 tensor of normal values (mean 0, `scale` standard deviation), the same for a seed.
Tensor gpu_random(Shape shape, uint32_t seed, float scale = 1.0f);

// Largest |a - b| over the largest |b|: a relative error of the whole tensor (host tensors of
// float32), or of n values.
double gpu_relative_error(const Tensor& a, const Tensor& b);
double gpu_relative_error(const float* a, const float* b, int64_t n);

// Host int32 values as a device tensor (kept alive by the caller).
Tensor gpu_ints(backend::Context& gpu, const std::vector<int32_t>& values);

}  // namespace r3::test
