// The dense projection for bfloat16 weights on the GPU (ops/cuda/sm90_linear_rows.cu): weights
// stay bfloat16 in memory and are widened exactly in registers, activations and sums are float32
// (weight-only bf16, the arithmetic the CPU runs on a bf16 checkpoint up to summation order).
// Internal to ops/cuda: ops::linear reaches it through ops::cuda::linear.
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]); x, bias, y: F32 on the device; w: BF16 on the device.
void linear_bf16_rows(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);

}  // namespace r3::ops::cuda
