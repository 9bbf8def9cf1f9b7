// What the CUDA op tests share: random host tensors, the relative error they are held to, and
// small int32 arrays on the device.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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

// The names of the kernels `work` launches on the context's stream, in no particular order: the
// launches are captured into a graph, which then runs once, so that `work`'s results are there as
// if it had run directly. For a test that must know which kernel a step took.
std::vector<std::string> kernels_launched(backend::Context& gpu, const std::function<void()>& work);

}  // namespace r3::test
