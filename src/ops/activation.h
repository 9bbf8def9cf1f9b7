// Gated activations used by SwiGLU feed-forward layers.
#pragma once

#include "core/tensor.h"

namespace r3::ops {

float silu(float x);
float sigmoid(float x);

// out[r, i] = silu(gate[r, i]) * up[r, i]; all F32 [rows, width] contiguous.
void silu_and_mul(const Tensor& gate, const Tensor& up, Tensor& out);

}  // namespace r3::ops
