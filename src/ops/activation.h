// Gated activations used by SwiGLU (and Kimi K3's SiTU) feed-forward layers.
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

// Kimi K3's SiTU-GLU: beta * tanh(gate / beta) * sigmoid(gate) * u, with the up input soft-capped
// first, u = linear_beta * tanh(up / linear_beta) (transformers' situ_and_mul; linear_beta inf:
// u = up). Both tanh caps keep the product bounded however large the projections grow.
inline float situ(float gate, float up, float beta, float linear_beta) {
  const float u = std::isinf(linear_beta) ? up : linear_beta * std::tanh(up / linear_beta);
  return beta * std::tanh(gate / beta) * sigmoid(gate) * u;
}

namespace cpu {
void silu_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float limit);
void situ_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float beta,
                  float linear_beta);
void mul_sigmoid(backend::Context& ctx, const Tensor& gate, Tensor& x);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_activation.cu
void silu_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float limit);
void situ_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float beta,
                  float linear_beta);
void mul_sigmoid(backend::Context& ctx, const Tensor& gate, Tensor& x);
}
#endif

// out[r, i] = clamped_swiglu(gate[r, i], up[r, i], limit); all F32 [rows, width] contiguous.
inline void silu_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out,
                         float limit = INFINITY) {
  R3_DISPATCH_GPU(ctx, silu_and_mul, ctx, gate, up, out, limit);
}

// out[r, i] = situ(gate[r, i], up[r, i], beta, linear_beta) (Kimi K3's MLPs); out may be gate.
inline void situ_and_mul(backend::Context& ctx, const Tensor& gate, const Tensor& up, Tensor& out, float beta,
                         float linear_beta) {
  R3_DISPATCH_GPU(ctx, situ_and_mul, ctx, gate, up, out, beta, linear_beta);
}

// x[r, i] *= sigmoid(gate[r, i]) (Kimi K3's gated MLA on its attended values); both F32, same shape.
inline void mul_sigmoid(backend::Context& ctx, const Tensor& gate, Tensor& x) {
  R3_DISPATCH_GPU(ctx, mul_sigmoid, ctx, gate, x);
}

}  // namespace r3::ops
