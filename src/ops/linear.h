// y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]): the projection every layer is made of.
// Weights use the Hugging Face [out_features, in_features] layout as stored in checkpoints, in
// their stored dtype (F32, BF16, F16); x, bias and y are float32. The arithmetic is matmul_rows'
// (ops/matmul.h), so results do not depend on M, the thread count or the instruction set.
#pragma once

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

namespace cpu {
void linear(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_linear.cpp: cuBLASLt and r3's row kernels, by dtype and rows
void linear(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);
}
#endif

// x: F32 [M, K] contiguous; w: F32/BF16/F16 [N, K]; bias: F32 [N] or nullptr; y: F32 [M, N].
inline void linear(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  R3_DISPATCH_GPU(ctx, linear, ctx, x, w, bias, y);
}

}  // namespace r3::ops
