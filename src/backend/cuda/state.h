// What a CUDA context holds: its device, its stream (every kernel and copy of the context runs on
// it, in order) and a cuBLASLt handle with the workspace its GEMMs may use. Included only by
// CUDA code (src/backend/cuda, src/ops/cuda).
#pragma once

#include <cstddef>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernel_choices.h"
#include "core/check.h"

namespace r3::backend::cuda {

struct State {
  int device = 0;
  int sm_count = 1;  // streaming multiprocessors: kernels size their grids to fill them
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  std::size_t lt_workspace_bytes = 0;
  // A second stream for work beside the chain of `stream`'s kernels (ops/cuda/l2_prefetch.h):
  // forked from `stream` by `fork`, joined back by `join`; `side_pending` while not yet joined.
  // Made on first use.
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr;
  cudaEvent_t join = nullptr;
  bool side_pending = false;
  // The kernel choices made by shape (backend/cuda/kernel_choices.h): each by its rule unless
  // set otherwise for an experiment.
  KernelChoices choices;
};

// Throws r3::Error naming the call and CUDA's message.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);

}  // namespace r3::backend::cuda

#define R3_CUDA_CHECK(call) ::r3::backend::cuda::check((call), #call)
