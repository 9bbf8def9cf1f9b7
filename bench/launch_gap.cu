// What a kernel boundary costs inside a CUDA graph (the decode step is one graph of ~8 to 11
// kernels a layer): a graph of kKernels trivial kernels, each of `blocks` blocks of 256 threads
// that wait for their predecessor and write one value, launched like r3's kernels
// (backend/cuda/launch.cuh: programmatic dependent launch) or plainly. The time per kernel is the
// floor a fused kernel saves per boundary it removes.
#include <cuda_runtime.h>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "gpu_event_timer.h"
#include "launch_gap.h"

namespace r3::bench {

namespace {

constexpr int kKernels = 200;

__global__ void touch(int* out, int i) {
  backend::cuda::wait_for_predecessor();
  if (threadIdx.x == 0) out[blockIdx.x] = i;
}

}  // namespace

double graph_kernel_gap_us(backend::Context& gpu, unsigned blocks, bool programmatic) {
  const cudaStream_t stream = gpu.cuda_state().stream;
  int* out = nullptr;
  R3_CUDA_CHECK(cudaMalloc(&out, blocks * sizeof(int)));
  int i = 0;
  auto launch = [&] {
    if (programmatic) backend::cuda::launch_kernel(touch, blocks, 256, 0, stream, out, i);
    else touch<<<blocks, 256, 0, stream>>>(out, i);
    ++i;
  };
  const double ms = graph_mean_ms(gpu, launch, kKernels);
  cudaFree(out);
  return ms * 1e3;
}

}  // namespace r3::bench
