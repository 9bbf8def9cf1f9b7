// Kernel attributes set once per kernel at its first launch (backend/cuda/launch.cuh).
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_set>

#include "backend/cuda/state.h"

namespace r3::backend::cuda {

// (Declared in launch.cuh, which only nvcc reads.)
void allow_large_clusters(const void* kernel);

namespace {

// Whether this is the first time the kernel comes here.
bool first_time(std::unordered_set<const void*>& seen, std::mutex& mutex, const void* kernel) {
  const std::lock_guard lock(mutex);
  return seen.insert(kernel).second;
}

}  // namespace

void allow_large_clusters(const void* kernel) {
  static std::mutex mutex;
  static std::unordered_set<const void*> seen;
  if (!first_time(seen, mutex, kernel)) return;
  R3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

}  // namespace r3::backend::cuda
