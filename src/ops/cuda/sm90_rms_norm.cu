// RMSNorm on the GPU: one block per row, the mean of squares accumulated in double (as the CPU
// kernel does, so the normaliser stays as exact as the float64 reference), then each element
// scaled by it and by the weight.
#include "backend/cuda/state.h"
#include "ops/rms_norm.h"

namespace r3::ops::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_rows(const float* __restrict__ x, const float* __restrict__ weight, int64_t d, float eps,
                              float* __restrict__ y) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  float* yr = y + row * d;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) sum += static_cast<double>(xr[i]) * xr[i];
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / static_cast<double>(d) + eps));
  for (int64_t i = threadIdx.x; i < d; i += kThreads) yr[i] = weight ? weight[i] * (xr[i] * inv) : xr[i] * inv;
}

}  // namespace

void rms_norm(backend::Context& ctx, const Tensor& x, const Tensor* weight, float eps, Tensor& y) {
  R3_CHECK(x.rank() >= 1 && x.is_contiguous() && y.is_contiguous() && x.numel() == y.numel() &&
               x.device() == Device::kCuda && y.device() == Device::kCuda,
           "rms_norm (cuda): x ", shape_to_string(x.shape()), " y ", shape_to_string(y.shape()));
  const int64_t d = x.shape().back();
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  R3_CHECK(weight == nullptr || (weight->rank() == 1 && weight->dim(0) == d && weight->device() == Device::kCuda),
           "rms_norm (cuda): weight must be [", d, "] on the device");
  if (rows == 0) return;
  const auto& s = ctx.cuda_state();
  rms_norm_rows<<<static_cast<unsigned>(rows), kThreads, 0, s.stream>>>(
      x.data<float>(), weight ? weight->data<float>() : nullptr, d, eps, y.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
