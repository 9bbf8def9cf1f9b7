// RMSNorm on the GPU: one block per row, the mean of squares accumulated in double (as the CPU
// kernel does, so the normaliser stays as exact as the float64 reference), then each element
// scaled by it and by the weight. At batch 1 a decode layer runs two of these on rows of a few
// KB, where the trips to memory, not the bytes, set the time: the row and its weight are loaded
// in one round, kept in registers, and the block's sum takes one barrier. Optionally the
// residual add before it (add_rms_norm): each thread adds, stores and squares its own
// elements, so the sum sees the stored values.
#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/rms_norm.h"

namespace r3::ops::cuda {

namespace {

constexpr int kThreads = 256;

// Elements a thread keeps in registers between the two passes (rows up to kThreads * kHeld wide
// entirely; wider rows read the rest again): the second pass then needs no load, and the
// weight's loads are issued with the row's, before the reduction instead of after it.
constexpr int kHeld = 8;

// The block's sum of its threads' partial sums: each warp's by shuffles, then the warps' in
// order by every thread (one barrier).
__device__ inline double block_sum(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __shared__ double warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return total;
}

// kAdd: x is the residual, updated in place with branch first.
template <bool kAdd>
__global__ void rms_norm_rows(float* __restrict__ x, const float* __restrict__ branch, const float* __restrict__ weight,
                              int64_t d, float eps, float* __restrict__ y) {
  backend::cuda::wait_for_predecessor();
  backend::cuda::release_successor();  // the next projection loads its weights meanwhile
  const int64_t row = blockIdx.x;
  float* xr = x + row * d;
  float* yr = y + row * d;
  float held[kHeld], held_weight[kHeld];
  double sum = 0;
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    held[j] = 0.0f;
    held_weight[j] = 1.0f;
    if (i < d) {
      float v = xr[i];
      if constexpr (kAdd) {
        v += branch[row * d + i];
        xr[i] = v;
      }
      held[j] = v;
      if (weight) held_weight[j] = weight[i];
    }
  }
#pragma unroll
  for (int j = 0; j < kHeld; ++j) sum += static_cast<double>(held[j]) * held[j];  // in element order, as below
  for (int64_t i = threadIdx.x + static_cast<int64_t>(kHeld) * kThreads; i < d; i += kThreads) {
    float v = xr[i];
    if constexpr (kAdd) {
      v += branch[row * d + i];
      xr[i] = v;
    }
    sum += static_cast<double>(v) * v;
  }
  const float inv = static_cast<float>(1.0 / sqrt(block_sum(sum) / static_cast<double>(d) + eps));
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < d) yr[i] = weight ? held_weight[j] * (held[j] * inv) : held[j] * inv;
  }
  for (int64_t i = threadIdx.x + static_cast<int64_t>(kHeld) * kThreads; i < d; i += kThreads) {
    yr[i] = weight ? weight[i] * (xr[i] * inv) : xr[i] * inv;
  }
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
