// RMSNorm over the last axis: y = x / sqrt(mean(x²) + eps) * weight.
#pragma once

#include "core/tensor.h"
#include "backend/context.h"

namespace r3::ops {

// x, y: F32 [rows, D] contiguous (y may alias x); weight: F32 [D], or nullptr for no weight.
void rms_norm(backend::Context& ctx, const Tensor& x, const Tensor* weight, float eps, Tensor& y);
// One row of d floats (y may alias x): the same arithmetic, for callers inside their own loops.
void rms_norm_row(const float* x, const float* weight, int64_t d, float eps, float* y);

}  // namespace r3::ops
