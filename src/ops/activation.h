// Gated activations used by SwiGLU feed-forward layers.
#pragma once

#include <cmath>

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

// Scalar forms, for kernels that apply them inside their own loops.
float silu(float x);
float sigmoid(float x);

// silu(min(gate, limit)) * clamp(up, -limit, limit); with limit = inf, silu(gate) * up exactly.
// (DeepSeek-V4's swiglu_limit.)
inline float clamped_swiglu(float gate, float up, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  return silu(g) * u;
}

namespace cpu {
void silu_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float limit);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_activation.cu
void silu_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float limit);
}
#endif

// out[r, i] = clamped_swiglu(gate[r, i], up[r, i], limit); all F32 [rows, width] contiguous.
inline void silu_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out,
                         float limit = INFINITY) {
  R3_DISPATCH_GPU(ctx, silu_and_mul, ctx, gate, up, out, limit);
}

}  // namespace r3::ops
