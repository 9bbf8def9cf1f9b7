// R3_CARVEOUT (backend/cuda/launch.cuh): one shared-memory carveout for every kernel r3 launches.
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <unordered_set>

#include "backend/cuda/state.h"

namespace r3::backend::cuda {

void prefer_carveout(const void* kernel);  // (declared in launch.cuh, which only nvcc reads)

void prefer_carveout(const void* kernel) {
  static const char* const setting = std::getenv("R3_CARVEOUT");  // read once: no cost at each launch
  if (setting == nullptr) return;
  static std::mutex mutex;
  static std::unordered_set<const void*> set;
  const std::lock_guard lock(mutex);
  if (!set.insert(kernel).second) return;
  R3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, std::atoi(setting)));
}

}  // namespace r3::backend::cuda
