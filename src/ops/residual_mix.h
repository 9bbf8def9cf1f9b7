// Kimi K3's attention-residual mix on the device (the CPU form is models/kimi_k3/attention_residual.h,
// which has the formula): each token's layer input as a softmax-weighted sum of its rows in the
// block snapshots and its current hidden row, the weights from a learned query against the
// RMS-normalised rows.
#pragma once

#include <cstdint>

#include "backend/context.h"

namespace r3::ops {

#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_residual_mix.cu
constexpr int64_t kMaxResidualMixValues = 256;  // snapshots + the current row
// query, norm: device [hidden]; snapshot n's row of token t at snapshots + n * snapshot_stride +
// t * hidden (n < count); current, out: device [tokens, hidden] (out aliasing neither).
void residual_mix(backend::Context& ctx, const float* query, const float* norm, float eps, const float* snapshots,
                  int64_t count, int64_t snapshot_stride, const float* current, int64_t tokens, int64_t hidden,
                  float* out);
}  // namespace cuda
#endif

}  // namespace r3::ops
