// Kernel launches with programmatic dependent launch (Hopper): a kernel of the stream may be
// scheduled while the kernel before it drains, instead of after it has fully finished, which
// hides most of the gap between two kernels (a decode step at batch 1 is a chain of short
// kernels per layer). The contract: every kernel launched through launch_kernel calls
// wait_for_predecessor() as its first statement, before it reads or writes global memory and
// before any early return, so it sees everything the previous kernel wrote and overwrites
// nothing that kernel still reads.
// (A kernel that returned without waiting could let its successor run ahead of its predecessor.)
//
// Two exceptions let a kernel's memory trips overlap the kernel before it:
// - A short kernel may call release_successor() once it has waited: the next kernel is then
//   scheduled while this one still runs, rather than as its blocks exit. Never before the wait,
//   so that at most two kernels overlap: when a kernel starts, every kernel before its
//   predecessor has finished and its writes are visible.
// - Hence, before its wait, a kernel may read memory that its predecessor does not write: the
//   weights (no kernel writes them) and rows written by earlier steps (a KV pool's past
//   positions), through the step's metadata (written by a copy before the step's first kernel).
//   It writes nothing before its wait.
// Launches of other libraries (cuBLASLt) and copies keep the stream's ordinary full ordering.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/state.h"

namespace r3::backend::cuda {

// Blocks until the kernel before this one in the stream has finished and its writes are visible;
// returns at once when it was launched without the attribute.
__device__ __forceinline__ void wait_for_predecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Lets the stream's next kernel be scheduled now instead of when this kernel's blocks exit. Call
// it only after wait_for_predecessor() (see above); a no-op when the next kernel was launched
// without the attribute.
__device__ __forceinline__ void release_successor() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Lets `kernel` run in clusters of more than 8 blocks (non-portable sizes, up to 16 on Hopper), once.
void allow_large_clusters(const void* kernel);

// launch_kernel with the grid's blocks in thread-block clusters of `cluster` along x (0: none; 1:
// clusters of one block, for a kernel that uses the cluster API); the grid's x a multiple of it.
template <typename... Params, typename... Args>
void launch_kernel_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                               cudaStream_t stream, unsigned cluster, Args&&... args) {
  if (cluster > 8) allow_large_clusters(reinterpret_cast<const void*>(kernel));
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = cluster;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster > 0 ? 2 : 1;
  R3_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                   Args&&... args) {
  launch_kernel_in_clusters(kernel, grid, block, shared_bytes, stream, 0, std::forward<Args>(args)...);
}

}  // namespace r3::backend::cuda
