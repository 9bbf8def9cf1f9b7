// The cost of one kernel boundary inside a CUDA graph (bench/launch_gap.cu).
#pragma once

#include "backend/context.h"

namespace r3::bench {

// Microseconds per kernel of a graph of trivial kernels of `blocks` blocks, launched with
// programmatic dependent launch (as r3's kernels are) or plainly.
double graph_kernel_gap_us(backend::Context& gpu, unsigned blocks, bool programmatic);

}  // namespace r3::bench
