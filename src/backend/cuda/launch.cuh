// Kernel launches with programmatic dependent launch (Hopper): a kernel of the stream may be
// scheduled while the kernel before it still runs, instead of after it has fully finished, which
// hides the gap between two kernels and lets a kernel start its own preparation early (a decode
// step at batch 1 is ~10 short kernels per layer).
//
// The contract: every kernel launched through launch_kernel calls wait_for_predecessor() before
// it reads what the previous stream operation wrote, before it writes global memory at all, and
// before any early return (a kernel that returned without waiting could let its successor run
// ahead of its predecessor). wait_for_predecessor() then releases the next kernel at once, so at
// most two kernels of the stream overlap: the one running and the next, held at its wait.
// Before its wait a kernel may only read what nobody in flight writes (weights: prefetch_to_l2),
// or what the stream wrote two or more operations before it (done before the previous kernel
// got past its own wait, which is what released this one).
// Launches of other libraries (cuBLASLt) and copies keep the stream's ordinary full ordering.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "backend/cuda/state.h"

namespace r3::backend::cuda {

// Blocks until the kernel before this one in the stream has finished and its writes are visible
// (at once when it was launched without the attribute), then lets the next kernel be scheduled.
__device__ __forceinline__ void wait_for_predecessor() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Asks L2 for [p, p + bytes) without waiting for it: a kernel's weights, requested before its wait
// so that they stream from memory while the previous kernel (often latency-bound at decode)
// runs. Each lane of a warp takes every 32nd line of 128 bytes.
__device__ __forceinline__ void prefetch_to_l2(const void* p, int64_t bytes, int lane) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = static_cast<int64_t>(lane) * 128; off < bytes; off += 32 * 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
  }
}

// False when the environment sets R3_SERIAL_LAUNCHES=1: kernels then launch without the
// attribute, each after the previous one has finished, to measure what the overlap buys.
inline bool programmatic_launches() {
  static const bool enabled = [] {
    const char* v = std::getenv("R3_SERIAL_LAUNCHES");
    return v == nullptr || std::string_view(v) != "1";
  }();
  return enabled;
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
  config.numAttrs = programmatic_launches() ? 1 : 0;
  R3_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace r3::backend::cuda
