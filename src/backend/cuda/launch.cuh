// Kernel launches with programmatic dependent launch (Hopper): a kernel of the stream may be
// scheduled while the kernel before it runs, instead of after it has fully finished, which hides
// most of the gap between two kernels (a decode step at batch 1 is ~17 short kernels per layer)
// and lets a kernel start reading its weights while its predecessor still computes.
//
// The contract: every kernel launched through launch_kernel calls wait_for_predecessor() before
// it reads anything an earlier kernel of the step wrote, before it writes global memory and
// before any early return, so it sees everything the previous kernel wrote and overwrites nothing
// that kernel still reads. (A kernel that returned without waiting could let its successor run
// ahead of its predecessor.) wait_for_predecessor() then lets the successor launch: its blocks
// take the SM room this kernel leaves and wait in turn. So at most two kernels of a stream run
// at once, and what a kernel does before its wait overlaps its predecessor. Before the wait a
// kernel may only read: weights (nothing in a step writes them; prefetch_to_l2 is for them) and
// what kernels two or more launches back wrote (they had finished, and their writes were visible,
// before the predecessor's wait returned, which is before this kernel was launched).
// Launches of other libraries (cuBLASLt) and copies keep the stream's ordinary full ordering.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/state.h"

namespace r3::backend::cuda {

// Blocks until the kernel before this one in the stream has finished and its writes are visible
// (at once when it was launched without the attribute), then lets the next kernel launch.
__device__ __forceinline__ void wait_for_predecessor() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Asks the SM's tensor memory accelerator to bring bytes [p, p + bytes) into L2 without waiting
// for them (a hint: nothing is read into registers, nothing faults later). Called by one thread,
// before the kernel's wait, on weights it is about to stream: their reads then start while the
// kernel before it runs. The range is widened to whole 16-byte units, which the prefetch needs and
// which stay inside the allocation's pages (device allocations are at least 256-byte aligned). With
// a cache policy (createpolicy), the lines take its eviction priority.
template <bool kWithPolicy = false>
__device__ __forceinline__ void prefetch_to_l2(const void* p, int64_t bytes, uint64_t policy = 0) {
  constexpr uintptr_t kMaxPerInstruction = uintptr_t{1} << 30;
  auto begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{15};
  const auto end = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes) + 15) & ~uintptr_t{15};
  while (begin < end) {
    const auto size = static_cast<uint32_t>(end - begin < kMaxPerInstruction ? end - begin : kMaxPerInstruction);
    if constexpr (kWithPolicy) {
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(begin), "r"(size), "l"(policy)
                   : "memory");
    } else {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin), "r"(size) : "memory");
    }
    begin += size;
  }
}

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
