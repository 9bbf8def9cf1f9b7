// The split of float32 activations into high and low bfloat16 parts and the sum of the two result
// halves (ops/cuda/split_bf16.h).
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/split_bf16.h"
#include "ops/cuda/split_value.cuh"

namespace r3::ops::cuda {

namespace {

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)); }

__global__ void split_elements(const float* __restrict__ x, int64_t n, __nv_bfloat16* __restrict__ parts) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const SplitValue s = split_value(x[i]);
    parts[i] = s.hi;
    parts[n + i] = s.lo;
  }
}

__global__ void add_halves(const float* __restrict__ halves, int64_t n, int64_t cols, const float* __restrict__ bias,
                           float* __restrict__ y) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float sum = halves[i] + halves[n + i];
    y[i] = bias != nullptr ? sum + bias[i % cols] : sum;
  }
}

}  // namespace

void split_rows_bf16(backend::Context& ctx, const Tensor& x, Tensor& parts) {
  R3_CHECK(x.rank() == 2 && x.dtype() == DType::F32 && parts.dtype() == DType::BF16 && parts.rank() == 2 &&
               parts.dim(0) == 2 * x.dim(0) && parts.dim(1) == x.dim(1) && x.is_contiguous() && parts.is_contiguous(),
           "split_rows_bf16 (cuda): x ", shape_to_string(x.shape()), " parts ", shape_to_string(parts.shape()));
  const int64_t n = x.numel();
  if (n == 0) return;
  backend::cuda::launch_kernel(split_elements, blocks_for(n), 256, 0, ctx.cuda_state().stream, x.data<float>(), n,
                               static_cast<__nv_bfloat16*>(parts.raw_data()));
  R3_CUDA_CHECK(cudaGetLastError());
}

void add_split_halves(backend::Context& ctx, const Tensor& halves, const float* bias, Tensor& y) {
  R3_CHECK(y.rank() == 2 && halves.rank() == 2 && halves.dim(0) == 2 * y.dim(0) && halves.dim(1) == y.dim(1) &&
               halves.dtype() == DType::F32 && y.dtype() == DType::F32,
           "add_split_halves (cuda): halves ", shape_to_string(halves.shape()), " y ", shape_to_string(y.shape()));
  const int64_t n = y.numel();
  if (n == 0) return;
  backend::cuda::launch_kernel(add_halves, blocks_for(n), 256, 0, ctx.cuda_state().stream, halves.data<float>(), n,
                               y.dim(1), bias, y.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
