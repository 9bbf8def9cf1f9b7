// The attention-residual mix on the GPU (ops/residual_mix.h): one block per token. Per value row
// (each snapshot's, then the current one) the block sums its squares in double and its
// normalised elements against the query in double, as AttentionResidual::mix does on the CPU;
// then the softmax in double over the few scores, and each element's weighted sum in double.
#include <cmath>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/block_sum.cuh"
#include "ops/residual_mix.h"

namespace r3::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

__global__ void residual_mix_rows(const float* __restrict__ query, const float* __restrict__ norm, float eps,
                                  const float* __restrict__ snapshots, int64_t count, int64_t snapshot_stride,
                                  const float* __restrict__ current, int64_t hidden, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const int64_t t = blockIdx.x, values = count + 1;
  __shared__ double partials[kThreads / kWarp];
  __shared__ float weights[kMaxResidualMixValues];
  auto value = [&](int64_t n) {
    return n < count ? snapshots + n * snapshot_stride + t * hidden : current + t * hidden;
  };
  for (int64_t n = 0; n < values; ++n) {
    const float* v = value(n);
    double squares = 0;
    for (int64_t i = threadIdx.x; i < hidden; i += kThreads) squares += static_cast<double>(v[i]) * v[i];
    const auto inv = static_cast<float>(1.0 / sqrt(block_sum(squares, partials) / static_cast<double>(hidden) + eps));
    double score = 0;
    for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
      score += static_cast<double>(query[i]) * static_cast<double>(norm[i] * (v[i] * inv));
    }
    score = block_sum(score, partials);
    if (threadIdx.x == 0) weights[n] = static_cast<float>(score);
  }
  // The softmax's exponentials (max subtracted) replace the scores, by one thread.
  __shared__ double total;
  if (threadIdx.x == 0) {
    double top = -INFINITY;
    for (int64_t n = 0; n < values; ++n) top = fmax(top, static_cast<double>(weights[n]));
    total = 0;
    for (int64_t n = 0; n < values; ++n) {
      weights[n] = static_cast<float>(exp(static_cast<double>(weights[n]) - top));
      total += weights[n];
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    double sum = 0;
    for (int64_t n = 0; n < values; ++n) sum += static_cast<double>(weights[n]) * value(n)[i];
    out[t * hidden + i] = static_cast<float>(sum / total);
  }
}

}  // namespace

void residual_mix(backend::Context& ctx, const float* query, const float* norm, float eps, const float* snapshots,
                  int64_t count, int64_t snapshot_stride, const float* current, int64_t tokens, int64_t hidden,
                  float* out) {
  R3_CHECK(count >= 0 && count + 1 <= kMaxResidualMixValues && hidden > 0, "residual mix (cuda): ", count,
           " snapshots (at most ", kMaxResidualMixValues - 1, ") of width ", hidden);
  if (tokens == 0) return;
  backend::cuda::launch_kernel(residual_mix_rows, static_cast<unsigned>(tokens), kThreads, 0, ctx.cuda_state().stream,
                               query, norm, eps, snapshots, count, snapshot_stride, current, hidden, out);
  R3_CUDA_CHECK(cudaGetLastError());
}

void residual_mix(backend::Context& ctx, const Tensor& query, const Tensor& norm, float eps, const Tensor& snapshots,
                  int64_t count, const Tensor& current, Tensor& out) {
  const int64_t tokens = current.dim(0), hidden = current.dim(1);
  R3_CHECK(query.numel() == hidden && norm.numel() == hidden && snapshots.dim(1) == tokens && snapshots.dim(2) == hidden &&
               count <= snapshots.dim(0),
           "attention residual (cuda): ", count, " snapshots of ", shape_to_string(snapshots.shape()), " for rows ",
           shape_to_string(current.shape()));
  residual_mix(ctx, query.data<float>(), norm.data<float>(), eps, snapshots.data<float>(), count, tokens * hidden,
               current.data<float>(), tokens, hidden, out.data<float>());
}

}  // namespace r3::ops::cuda
