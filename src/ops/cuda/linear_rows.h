// r3's own dense projection on the GPU (ops/cuda/sm90_linear_rows.cu): each output is one warp's
// dot product of a weight row with an activation row, in an order that depends on nothing else
// (batch invariant). Bfloat16 weights stay bfloat16 in memory and are widened exactly in registers;
// activations and sums are float32. Internal to ops/cuda: ops::linear reaches it through
// ops::cuda::linear (for bf16 weights, and for float32 ones when the context is batch invariant).
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]); x, bias, y: F32 on the device; w: BF16 or F32 on the device.
void linear_rows(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);

}  // namespace r3::ops::cuda
