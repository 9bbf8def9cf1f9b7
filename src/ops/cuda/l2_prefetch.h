// Weights brought into L2 on a side stream while the context's stream runs kernels that read
// little from memory, so that the kernel after them streams its weights from L2: a decode step's
// o projection, requested once q/k/v has finished, while the q/k prepare and attention run
// (2 MB of KV at a 1k context against o's 16.8 MB at Qwen3-30B-A3B's shape). The side stream
// holds nothing the chain waits on: no kernel of `stream` depends on a prefetch, so the chain's
// programmatic launches stay as they were, and the bits cannot change.
// Taken for steps of up to kPrefetchOTokens tokens: on an H100 it took bf16 batch 1 from 3.366 to
// 3.318 ms, FP8 from 2.857 to 2.833, batch 8 by 0.3 to 0.5% (bench/RESULTS.md, session 29).
// R3_PREFETCH_O=0: never (a diagnostic, to measure it). The next layer's q/k/v prefetched beside
// down + combine measured no gain for bf16, and with o's cost bf16 batch 1 +5.8%: not kept
// (branch gpu-o-prefetch).
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

constexpr int64_t kPrefetchOTokens = 8;

// Whether a step of `tokens` tokens prefetches its o projections (R3_PREFETCH_O).
bool o_prefetch_taken(int64_t tokens);

// Asks L2 for w's stored bytes (values only) on the context's side stream, once every kernel
// queued on its stream so far has finished. In a graph capture the request becomes a branch off
// the last captured kernel.
void prefetch_into_l2_beside(backend::Context& ctx, const Tensor& w);

// Makes the context's stream wait for what the side stream was given (a no-op when nothing is
// pending). A graph capture must end joined, so a step calls this before its capture ends.
void join_side_stream(backend::Context& ctx);

}  // namespace r3::ops::cuda
