// Kimi K3's attention-residual mix: each token's layer input as a softmax-weighted sum of its rows
// in the block snapshots and its current hidden row, the weights from a learned query against the
// RMS-normalised rows (models/kimi_k3/attention_residual.h has the formula). One op, dispatched:
// ops/cpu/residual_mix.cpp and ops/cuda/sm90_residual_mix.cu, with the same arithmetic (scores,
// exponentials and sums in double).
#pragma once

#include <cstdint>

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

namespace cpu {
void residual_mix(backend::Context& ctx, const Tensor& query, const Tensor& norm, float eps, const Tensor& snapshots,
                  int64_t count, const Tensor& current, Tensor& out);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_residual_mix.cu
constexpr int64_t kMaxResidualMixValues = 256;  // snapshots + the current row
// query, norm: device [hidden]; snapshot n's row of token t at snapshots + n * snapshot_stride +
// t * hidden (n < count); current, out: device [tokens, hidden] (out aliasing neither).
void residual_mix(backend::Context& ctx, const float* query, const float* norm, float eps, const float* snapshots,
                  int64_t count, int64_t snapshot_stride, const float* current, int64_t tokens, int64_t hidden,
                  float* out);
void residual_mix(backend::Context& ctx, const Tensor& query, const Tensor& norm, float eps, const Tensor& snapshots,
                  int64_t count, const Tensor& current, Tensor& out);
}  // namespace cuda
#endif

// query: the pseudo-query F32 [1, hidden] or [hidden]; norm: F32 [hidden]; snapshots: F32
// [>= count, tokens, hidden] (the first `count` used); current, out: F32 [tokens, hidden] (out
// aliasing neither). All on ctx's device, contiguous.
inline void residual_mix(backend::Context& ctx, const Tensor& query, const Tensor& norm, float eps,
                         const Tensor& snapshots, int64_t count, const Tensor& current, Tensor& out) {
  R3_DISPATCH_GPU(ctx, residual_mix, ctx, query, norm, eps, snapshots, count, current, out);
}

}  // namespace r3::ops
