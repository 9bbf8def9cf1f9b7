// RMSNorm over the last axis: y = x / sqrt(mean(x²) + eps) * weight.
#pragma once

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

namespace cpu {
void rms_norm(backend::Context& ctx, const Tensor& x, const Tensor* weight, float eps, Tensor& y);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_rms_norm.cu
void rms_norm(backend::Context& ctx, const Tensor& x, const Tensor* weight, float eps, Tensor& y);
// residual += branch, then y = rms_norm(residual): the decoder's residual add and the next norm
// in one kernel (one graph node instead of two), each element's sum and the norm as the two ops
// compute them.
void add_rms_norm(backend::Context& ctx, const Tensor& branch, Tensor& residual, const Tensor* weight, float eps,
                  Tensor& y);
}
#endif

// x, y: F32 [rows, D] contiguous (y may alias x); weight: F32 [D], or nullptr for no weight.
inline void rms_norm(backend::Context& ctx, const Tensor& x, const Tensor* weight, float eps, Tensor& y) {
  R3_DISPATCH_GPU(ctx, rms_norm, ctx, x, weight, eps, y);
}
// One row of d floats (y may alias x): the same arithmetic, for callers inside their own loops.
void rms_norm_row(const float* x, const float* weight, int64_t d, float eps, float* y);

}  // namespace r3::ops
