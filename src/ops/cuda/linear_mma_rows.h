// The dense projection of decode-sized steps on bfloat16 tensor cores (ops/cuda/
// sm90_linear_mma_rows.cu), bfloat16 or FP8 weights: the float32 activations split into high
// and low bfloat16 parts, then one warp per 16 weight rows running ops/cuda/mma_rows.cuh's
// swapped-operand MMAs over up to 32 activation rows per block. Each weight is read once per
// block of rows, which for a few rows the weight-streaming kernel does not achieve (it re-reads
// the activations for every weight row) and cuBLASLt's tiles only do for a few hundred. A
// projection of few weight rows also splits K into ranges (about 8 warps per SM), whose partial
// sums a second kernel adds in range order. Internal to ops/cuda: ops::linear reaches it through
// ops::cuda::linear for 5 to 16 rows (FP8 weights in a step of reduced precision: up to 256).
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

// Whether w (on the device) has what the kernel needs: rows a multiple of 16, columns a multiple
// of 32, and bfloat16 values or FP8 ones whose blocks hold whole 16-row tiles and 32-column steps
// (block rows and the first row's index multiples of 16, block columns of 32; published: 128).
// FP8 tiles are widened exactly to bfloat16 and each block's partial sums scaled: the weights are
// the CPU's, the activations split as for bfloat16 (Context::reduced_precision decides whether
// an FP8 weight comes here).
bool linear_mma_rows_fit(const Tensor& w);

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]); x, bias, y: F32 on the device; w: what linear_mma_rows_fit accepts.
void linear_mma_rows(backend::Context& ctx, const Tensor& x, const Tensor& w, const float* bias, Tensor& y);

}  // namespace r3::ops::cuda
