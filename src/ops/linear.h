// y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]): the projection every layer is made of.
// Weights use the Hugging Face [out_features, in_features] layout as stored in checkpoints.
#pragma once

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace r3::ops {

// x: F32 [M, K] contiguous; w: F32 [N, K]; bias: F32 [N] or nullptr; y: F32 [M, N], preallocated.
void linear(ThreadPool& pool, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);

}  // namespace r3::ops
