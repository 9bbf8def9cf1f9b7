// DeepSeek-V4's hyper-connections keep `hc` residual streams per token. Before a sublayer they
// are collapsed into its input with per-token weights `pre`; after it, each stream becomes
// post[k] * sublayer output + sum_j comb[j][k] * stream[j]. (The weights themselves come from
// the model's Sinkhorn-normalised mixing, models/deepseek_v4/hyper_connection and ops/sinkhorn.)
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops {

// streams: F32 [tokens, hc, hidden]; pre: [tokens, hc]; x: F32 [tokens, hidden].
void hc_collapse(const Tensor& streams, const float* pre, Tensor& x);
// post: [tokens, hc]; comb: [tokens, hc, hc] (comb[t][j][k]); sublayer_out: F32 [tokens, hidden];
// streams: F32 [tokens, hc, hidden], updated in place (tokens in parallel, each token's new
// streams built in per-thread scratch from the workspace).
void hc_expand(backend::Context& ctx, const float* post, const float* comb, const Tensor& sublayer_out,
               Tensor& streams);
// The same on the calling thread, with scratch of its own.
void hc_expand(const float* post, const float* comb, const Tensor& sublayer_out, Tensor& streams);

}  // namespace r3::ops
