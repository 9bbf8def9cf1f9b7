// The residual add (with the optional per-row sigmoid gate of a shared expert) and the clamp on
// the GPU, element for element the CPU's arithmetic (the clamp as std::clamp: NaN stays NaN).
#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/elementwise.h"

namespace r3::ops::cuda {

namespace {

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)); }

__global__ void add_rows_elements(const float* __restrict__ x, const float* __restrict__ gate, int64_t d, int64_t n,
                                  float* __restrict__ y) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (gate == nullptr) {
      y[i] += x[i];
    } else {
      const float scale = 1.0f / (1.0f + expf(-gate[i / d]));
      y[i] += scale * x[i];
    }
  }
}

__global__ void clamp_elements(float* __restrict__ x, int64_t n, float limit) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = x[i] < -limit ? -limit : (limit < x[i] ? limit : x[i]);
  }
}

}  // namespace

void add_rows(backend::Context& ctx, const Tensor& x, const Tensor* gate, Tensor& y) {
  R3_CHECK(x.rank() == 2 && x.shape() == y.shape() && x.is_contiguous() && y.is_contiguous() &&
               x.device() == Device::kCuda && y.device() == Device::kCuda,
           "add_rows (cuda): x ", shape_to_string(x.shape()), " y ", shape_to_string(y.shape()));
  R3_CHECK(gate == nullptr || (gate->numel() == x.dim(0) && gate->device() == Device::kCuda),
           "add_rows (cuda): one gate per row, on the device");
  const int64_t n = x.numel();
  if (n == 0) return;
  backend::cuda::launch_kernel(add_rows_elements, blocks_for(n), 256, 0, ctx.cuda_state().stream, x.data<float>(),
                               gate ? gate->data<float>() : nullptr, x.dim(1), n, y.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

void clamp(backend::Context& ctx, Tensor& x, float limit) {
  R3_CHECK(x.is_contiguous() && x.device() == Device::kCuda, "clamp (cuda): a contiguous device tensor expected");
  const int64_t n = x.numel();
  if (n == 0) return;
  backend::cuda::launch_kernel(clamp_elements, blocks_for(n), 256, 0, ctx.cuda_state().stream, x.data<float>(), n,
                               limit);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
