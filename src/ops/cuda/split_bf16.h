// Float32 activations on bfloat16 tensor cores without rounding them to bfloat16: each value is
// split into a high and a low bfloat16 part (x = hi + lo to about 16 significant bits, against 8
// for hi alone), both parts multiply the same bfloat16 weights in one GEMM of twice the rows, and
// the two halves of the result are added back in float32. The weights, which bound a projection's
// time, are read once; the doubled multiply-adds are cheap on tensor cores. Internal to ops/cuda.
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

// x [m, k] F32 -> parts [2m, k] BF16: rows [0, m) the high parts, rows [m, 2m) the low ones.
void split_rows_bf16(backend::Context& ctx, const Tensor& x, Tensor& parts);

// halves [2m, n] F32 -> y [m, n] = halves[0, m) + halves[m, 2m) (+ bias[n]).
void add_split_halves(backend::Context& ctx, const Tensor& halves, const float* bias, Tensor& y);

}  // namespace r3::ops::cuda
