// Mean time of work queued on a CUDA context's stream, measured with CUDA events (the GPU
// benchmarks' one timing method): `warmup` calls, then the mean of `reps` timed calls.
#pragma once

#include <cuda_runtime.h>

#include "backend/context.h"
#include "backend/cuda/state.h"

namespace r3::bench {

template <typename Fn>
double mean_ms(backend::Context& gpu, Fn&& fn, int warmup = 5, int reps = 50) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const cudaStream_t stream = gpu.cuda_state().stream;
  cudaEventRecord(start, stream);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(ms) / reps;
}

}  // namespace r3::bench
