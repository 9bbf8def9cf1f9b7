// The causal depthwise short convolution of Kimi Delta Attention (and other linear-attention
// layers): each channel c of a token is sum_j weight[c][j] * x[t - (K - 1) + j][c] over the
// kernel's K taps, the positions before the sequence's first being the channel's kept state (zeros
// at the start), then SiLU. The state is the last K - 1 inputs of each channel, kept per sequence
// across steps, so that a prefill in pieces and token-by-token decode give the full sequence's
// result (transformers' causal_conv1d_fn / causal_conv1d_update).
#pragma once

#include <cstdint>

#include "backend/dispatch.h"
#include "ops/step_view.h"

namespace r3::ops {

// x, out: [tokens, channels] (out may not alias x); weight: [channels, K] (the checkpoint's
// [channels, 1, K]); state: [channels, K - 1], oldest input first, read and then replaced by the
// last K - 1 inputs (earlier state included when tokens < K - 1).
void short_conv_silu(const float* x, int64_t tokens, int64_t channels, const float* weight, int64_t kernel,
                     float* state, float* out);

// The channels of a step's rows in `parts` parts of `part_channels` each (e.g. a layer's q, k and
// v), part i of row t at part[i] + t * stride, so that they may be columns of one projection's
// output or tensors of their own.
struct ConvInputs {
  static constexpr int kMaxParts = 3;
  const float* part[kMaxParts] = {};
  int parts = 0;
  int64_t part_channels = 0;
  int64_t stride = 0;
};

namespace cpu {  // ops/short_conv.cpp
void short_conv_silu_step(backend::Context& ctx, const ConvInputs& in, const float* weight, int64_t kernel,
                          const StepView& step, float* state, float* out);
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_short_conv.cu
void short_conv_silu_step(backend::Context& ctx, const ConvInputs& in, const float* weight, int64_t kernel,
                          const StepView& step, float* state, float* out);
}  // namespace cuda
#endif

// The same convolution over a step's rows, every sequence's run of consecutive rows (one run a
// sequence) continuing its state; padding rows are left unwritten. weight: [parts *
// part_channels, kernel]; state: [slots, parts * part_channels, kernel - 1] (each sequence slot's
// states, channel-major, part after part); out: [tokens, parts * part_channels]. All float32 on
// ctx's device.
inline void short_conv_silu_step(backend::Context& ctx, const ConvInputs& in, const float* weight, int64_t kernel,
                                 const StepView& step, float* state, float* out) {
  R3_DISPATCH_GPU(ctx, short_conv_silu_step, ctx, in, weight, kernel, step, state, out);
}

}  // namespace r3::ops
