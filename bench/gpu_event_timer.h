// Mean time of work queued on a CUDA context's stream, measured with CUDA events (the GPU
// benchmarks' one timing method): `warmup` calls, then the mean of `reps` timed calls. And the
// same for work captured into a CUDA graph, as a decode step runs.
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

// The mean time of one call of fn among `copies` calls captured back to back in one CUDA graph:
// what a small op costs inside a decode step's graph, where each kernel waits for the one before
// it (programmatic dependent launch) and no host launch stands between them. One eager call
// first sizes the workspace, as the decoder's first step does before it captures.
template <typename Fn>
double graph_mean_ms(backend::Context& gpu, Fn&& fn, int copies = 32) {
  const cudaStream_t stream = gpu.cuda_state().stream;
  fn();
  R3_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  R3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < copies; ++i) fn();
  R3_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  R3_CUDA_CHECK(status);
  const double ms = mean_ms(gpu, [&] { R3_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, 2, 10);
  cudaGraphExecDestroy(exec);
  return ms / copies;
}

}  // namespace r3::bench
