// Bringing a weight into the GPU's L2 cache ahead of the kernel that reads it. A decode step of a
// few tokens is a chain of short kernels, and while the latency-bound ones run (attention over
// the KV cache, the router's top-k) the memory system is mostly idle; a weight asked for then
// is read from L2 by its projection later in the step instead of from device memory. Internal to
// the device models (models/cuda), which know which weight comes next.
#pragma once

#include "backend/context.h"
#include "core/tensor.h"

namespace r3::ops::cuda {

// Launches a short kernel, in the stream's order, that asks for w's stored bytes (values only,
// not block scales) to be brought into L2 with a high retention priority (evict-last), so that
// the weights streamed meanwhile (read evict-first: ops/cuda/weight_rows.cuh) do not push them
// out; the reading kernel's evict-first loads lower them again. A hint: nothing waits for the
// bytes, and results do not change. w: a contiguous device tensor.
void prefetch_into_l2(backend::Context& ctx, const Tensor& w);

}  // namespace r3::ops::cuda
