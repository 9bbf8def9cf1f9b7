// Kernel launches with programmatic dependent launch (Hopper): a kernel of the stream may be
// scheduled while the kernel before it drains, instead of after it has fully finished, which
// hides most of the gap between two kernels (a decode step at batch 1 is ~17 short kernels per
// layer). The contract: every kernel launched through launch_kernel calls wait_for_predecessor()
// as its first statement, before it reads or writes global memory and before any early return,
// so it sees everything the previous kernel wrote and overwrites nothing that kernel still reads.
// (A kernel that returned without waiting could let its successor run ahead of its predecessor.)
// Launches of other libraries (cuBLASLt) and copies keep the stream's ordinary full ordering.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/state.h"

namespace r3::backend::cuda {

// Blocks until the kernel before this one in the stream has finished and its writes are visible;
// returns at once when it was launched without the attribute.
__device__ __forceinline__ void wait_for_predecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  R3_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace r3::backend::cuda
