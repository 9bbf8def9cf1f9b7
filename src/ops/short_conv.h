// The causal depthwise short convolution of Kimi Delta Attention (and other linear-attention
// layers): each channel c of a token is sum_j weight[c][j] * x[t - (K - 1) + j][c] over the
// kernel's K taps, the positions before the sequence's first being the channel's kept state (zeros
// at the start), then SiLU. The state is the last K - 1 inputs of each channel, kept per sequence
// across steps, so that a prefill in pieces and token-by-token decode give the full sequence's
// result (transformers' causal_conv1d_fn / causal_conv1d_update).
#pragma once

#include <cstdint>

namespace r3::ops {

// x, out: [tokens, channels] (out may not alias x); weight: [channels, K] (the checkpoint's
// [channels, 1, K]); state: [channels, K - 1], oldest input first, read and then replaced by the
// last K - 1 inputs (earlier state included when tokens < K - 1).
void short_conv_silu(const float* x, int64_t tokens, int64_t channels, const float* weight, int64_t kernel,
                     float* state, float* out);

}  // namespace r3::ops
