// Weights brought into L2 on a side stream while the context's stream runs kernels that read
// little from memory, so that the kernel after them streams its weights from L2: a decode step's
// o projection, requested once q/k/v has finished, while the q/k prepare and attention run
// (2 MB of KV at a 1k context against o's 16.8 MB at Qwen3-30B-A3B's shape). The side stream
// holds nothing the chain waits on: no kernel of `stream` depends on a prefetch, so the chain's
// programmatic launches stay as they were, and the bits cannot change.
// Taken for steps of up to kPrefetchOTokens tokens: decode steps, whose kernels between q/k/v and
// o read little from memory.
#pragma once

#include <cstdint>

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

constexpr int64_t kPrefetchOTokens = 8;

// Whether a step of `tokens` tokens prefetches its o projections.
bool o_prefetch_taken(int64_t tokens);

// Asks L2 for w's stored bytes (values only) on the context's side stream, once every kernel
// queued on its stream so far has finished. In a graph capture the request becomes a branch off
// the last captured kernel.
void prefetch_into_l2_beside(backend::Context& ctx, const Tensor& w);

// Makes the context's stream wait for what the side stream was given (a no-op when nothing is
// pending). A graph capture must end joined, so a step calls this before its capture ends.
void join_side_stream(backend::Context& ctx);

}  // namespace r3::ops::cuda
