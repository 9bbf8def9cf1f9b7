// ops/cuda/l2_prefetch.h: bulk L2 prefetches spread over a few blocks of one warp each, so that
// several SMs' tensor memory accelerators issue them at once.
#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/l2_prefetch.h"

namespace r3::ops::cuda {

namespace {

constexpr int64_t kPieceBytes = 32 * 1024;  // one bulk prefetch instruction
constexpr int kThreads = 32;

// Each thread asks for its pieces before waiting on the kernel before it, so the requests go out
// while that kernel runs; the wait keeps the stream's order for the kernels after this one.
__global__ void prefetch_pieces(const char* __restrict__ bytes, int64_t size) {
  uint64_t keep;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kPieceBytes;
  for (int64_t at = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPieceBytes; at < size;
       at += stride) {
    backend::cuda::prefetch_to_l2<true>(bytes + at, min(kPieceBytes, size - at), keep);
  }
  backend::cuda::wait_for_predecessor();
}

}  // namespace

void prefetch_into_l2(backend::Context& ctx, const Tensor& w) {
  R3_CHECK(w.device() == Device::kCuda && w.is_contiguous(), "prefetch (cuda): a contiguous device tensor expected");
  const auto size = static_cast<int64_t>(w.nbytes());
  if (size == 0) return;
  const backend::cuda::State& s = ctx.cuda_state();
  const int64_t pieces = (size + kPieceBytes - 1) / kPieceBytes;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((pieces + kThreads - 1) / kThreads, s.sm_count));
  backend::cuda::launch_kernel(prefetch_pieces, blocks, kThreads, 0, s.stream, static_cast<const char*>(w.raw_data()),
                               size);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
