// Element-wise steps between the layers: the residual add (with the optional sigmoid gate of a
// shared expert) and the symmetric clamp of OLMoE's clip_qkv.
#pragma once

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

namespace cpu {
void add_rows(const Tensor& x, const Tensor* gate, Tensor& y);
void clamp(Tensor& x, float limit);
}

// y[t] += x[t], or y[t] += sigmoid(gate[t]) * x[t] when a gate [tokens, 1] is given; x, y: F32
// [tokens, D] contiguous.
inline void add_rows(backend::Context& ctx, const Tensor& x, const Tensor* gate, Tensor& y) {
  R3_DISPATCH(ctx, add_rows, x, gate, y);
}
// x = clamp(x, -limit, limit), F32 contiguous.
inline void clamp(backend::Context& ctx, Tensor& x, float limit) { R3_DISPATCH(ctx, clamp, x, limit); }

}  // namespace r3::ops
