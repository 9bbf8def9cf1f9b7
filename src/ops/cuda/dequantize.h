// Quantized device matrices (FP8 with block scales, MXFP4) decoded for the GEMMs that cannot read
// them as stored: the float32 GEMM of a model placed for float32, and the split bfloat16 GEMM of
// a large quantized step (ops/cuda/sm90_linear.cpp). The values are those the weight-streaming
// kernel multiplies with (ops/cuda/weight_rows.cuh). Internal to ops/cuda.
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

// out [n, k] F32 = the decoded values of the quantized device matrix w [n, k].
void dequantize_matrix(backend::Context& ctx, const Tensor& w, Tensor& out);

// parts [2n, k] BF16 = the decoded values of w split into high and low bfloat16 parts, rows [0, n)
// the high ones and [n, 2n) the low: the bits split_rows_bf16 (ops/cuda/split_bf16.h) gives for
// dequantize_matrix's output, in one pass and without its float32 copy (half the scratch).
void dequantize_matrix_split_bf16(backend::Context& ctx, const Tensor& w, Tensor& parts);

}  // namespace r3::ops::cuda
