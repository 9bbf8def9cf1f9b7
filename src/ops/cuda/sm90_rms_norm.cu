// RMSNorm on the GPU: one block per row, the mean of squares accumulated in double (as the CPU
// kernel does, so the normaliser stays as exact as the float64 reference), then each element
// scaled by it and by the weight. Optionally the residual add before it (add_rms_norm): each
// thread adds, stores and squares its own elements, so the sum sees the stored values.
#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/rms_norm.h"

namespace r3::ops::cuda {

namespace {

constexpr int kThreads = 256;

// kAdd: x is the residual, updated in place with branch first.
template <bool kAdd>
__global__ void rms_norm_rows(float* __restrict__ x, const float* __restrict__ branch, const float* __restrict__ weight,
                              int64_t d, float eps, float* __restrict__ y) {
  backend::cuda::wait_for_predecessor();
  const int64_t row = blockIdx.x;
  float* xr = x + row * d;
  float* yr = y + row * d;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    float v = xr[i];
    if constexpr (kAdd) {
      v += branch[row * d + i];
      xr[i] = v;
    }
    sum += static_cast<double>(v) * v;
  }
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
  // Not written without kAdd.
  auto* xp = const_cast<float*>(x.data<float>());
  backend::cuda::launch_kernel(rms_norm_rows<false>, static_cast<unsigned>(rows), kThreads, 0, ctx.cuda_state().stream,
                               xp, nullptr, weight ? weight->data<float>() : nullptr, d, eps, y.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

void add_rms_norm(backend::Context& ctx, const Tensor& branch, Tensor& residual, const Tensor* weight, float eps,
                  Tensor& y) {
  R3_CHECK(residual.rank() == 2 && branch.shape() == residual.shape() && y.shape() == residual.shape() &&
               branch.is_contiguous() && residual.is_contiguous() && y.is_contiguous() &&
               branch.device() == Device::kCuda && residual.device() == Device::kCuda && y.device() == Device::kCuda,
           "add_rms_norm (cuda): branch ", shape_to_string(branch.shape()), " residual ",
           shape_to_string(residual.shape()), " y ", shape_to_string(y.shape()));
  const int64_t rows = residual.dim(0), d = residual.dim(1);
  R3_CHECK(weight == nullptr || (weight->rank() == 1 && weight->dim(0) == d && weight->device() == Device::kCuda),
           "add_rms_norm (cuda): weight must be [", d, "] on the device");
  if (rows == 0 || d == 0) return;
  backend::cuda::launch_kernel(rms_norm_rows<true>, static_cast<unsigned>(rows), kThreads, 0, ctx.cuda_state().stream,
                               residual.data<float>(), branch.data<float>(), weight ? weight->data<float>() : nullptr,
                               d, eps, y.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
