// Host tensors the GPU benchmarks upload (bench/gpu_kernels_bench.cpp, bench/in_graph_ops.cpp):
// random values of a dtype, random e4m3 bytes and their block scales, each from a seed.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace r3::bench {

// Normal values of standard deviation `scale`: float32, or rounded to bfloat16 for DType::BF16.
Tensor random_host(DType dtype, Shape shape, uint32_t seed, float scale);

// Random e4m3 bytes (no NaN codes) of `shape`, for FP8 weights; their scales are separate.
Tensor random_fp8_host(Shape shape, uint32_t seed);

// Float32 scales of 128x128 blocks for matrices of [..., rows, cols], all `scale`.
Tensor fp8_scales_host(Shape shape, float scale);

}  // namespace r3::bench
