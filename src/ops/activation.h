// Gated activations used by SwiGLU feed-forward layers.
#pragma once

#include <cmath>

#include "core/tensor.h"

namespace r3::ops {

float silu(float x);
float sigmoid(float x);

// silu(min(gate, limit)) * clamp(up, -limit, limit); with limit = inf, silu(gate) * up exactly.
// (DeepSeek-V4's swiglu_limit.)
inline float clamped_swiglu(float gate, float up, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  return silu(g) * u;
}

// out[r, i] = clamped_swiglu(gate[r, i], up[r, i], limit); all F32 [rows, width] contiguous.
void silu_and_mul(const Tensor& gate, const Tensor& up, Tensor& out, float limit = INFINITY);

}  // namespace r3::ops
