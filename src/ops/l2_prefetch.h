// A hint that the kernel after the next few reads `w`: on a CUDA device, w's bytes brought into L2
// on a side stream for a step of a few tokens (ops/cuda/l2_prefetch.h says when and why); on the
// CPU, nothing. The bits of every result are the same either way.
#pragma once

#include <cstdint>

#include "backend/dispatch.h"
#include "core/tensor.h"

namespace r3::ops {

namespace cpu {
inline void prefetch_weights_beside(backend::Context&, const Tensor&, int64_t) {}
}
#if R3_WITH_CUDA
namespace cuda {  // ops/cuda/sm90_l2_prefetch.cu
void prefetch_weights_beside(backend::Context& ctx, const Tensor& w, int64_t tokens);
}
#endif

// w: a weight on ctx's device; tokens: the step's.
inline void prefetch_weights_beside(backend::Context& ctx, const Tensor& w, int64_t tokens) {
  R3_DISPATCH_GPU(ctx, prefetch_weights_beside, ctx, w, tokens);
}

}  // namespace r3::ops
