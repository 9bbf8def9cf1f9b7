// r3's own dense projection on the GPU (ops/cuda/sm90_linear_rows.cu): each output is one warp's
// dot product of a weight row with an activation row, in an order that depends on nothing else
// (batch invariant). Bfloat16, FP8 and MXFP4 weights stay as they are in memory and are decoded
// exactly in registers (ops/cuda/weight_rows.cuh); activations and sums are float32. Internal to
// ops/cuda: ops::linear reaches it through ops::cuda::linear.
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]); x, bias, y: F32 on the device; w: F32, BF16, F8_E4M3
// (block scales attached) or F4_E2M1X2 (MXFP4 scales attached) on the device.
void linear_rows(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);

}  // namespace r3::ops::cuda
