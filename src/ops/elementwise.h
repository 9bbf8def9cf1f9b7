// Element-wise steps between the layers: the residual add (with the optional sigmoid gate of a
// shared expert) and the symmetric clamp of OLMoE's clip_qkv.
#pragma once

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

namespace cpu {
void add_rows(backend::Context& ctx, const Tensor& x, const Tensor* gate, Tensor& y);
void clamp(backend::Context& ctx, Tensor& x, float limit);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_elementwise.cu
void add_rows(backend::Context& ctx, const Tensor& x, const Tensor* gate, Tensor& y);
void clamp(backend::Context& ctx, Tensor& x, float limit);
}
#endif

// y[t] += x[t], or y[t] += sigmoid(gate[t]) * x[t] when a gate [tokens, 1] is given; x, y: F32
// [tokens, D] contiguous.
inline void add_rows(backend::Context& ctx, const Tensor& x, const Tensor* gate, Tensor& y) {
  R3_DISPATCH_GPU(ctx, add_rows, ctx, x, gate, y);
}
// x = clamp(x, -limit, limit), F32 contiguous.
inline void clamp(backend::Context& ctx, Tensor& x, float limit) { R3_DISPATCH_GPU(ctx, clamp, ctx, x, limit); }

}  // namespace r3::ops
