// RMSNorm over the last axis: y = x / sqrt(mean(x²) + eps) * weight.
#pragma once

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace r3::ops {

// x, y: F32 [rows, D] contiguous (y may alias x); weight: F32 [D], or nullptr for no weight.
void rms_norm(ThreadPool& pool, const Tensor& x, const Tensor* weight, float eps, Tensor& y);

}  // namespace r3::ops
