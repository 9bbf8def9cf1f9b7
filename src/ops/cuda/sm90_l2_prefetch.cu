// ops/cuda/l2_prefetch.h on Hopper: each thread asks L2 for one piece of the weight with one
// bulk prefetch (cp.async.bulk.prefetch.L2), which needs no registers, barrier or completion:
// the kernel ends as soon as its requests are issued.
#include "backend/cuda/state.h"
#include "ops/cuda/l2_prefetch.h"
#include "ops/l2_prefetch.h"

namespace r3::ops::cuda {

namespace {

// 16 KiB a request: 1024 requests for o's 16.8 MB, four blocks of 256 threads.
constexpr uint64_t kPieceBytes = 16 << 10;
constexpr unsigned kThreads = 256;

__global__ void prefetch_pieces(const char* __restrict__ base, uint64_t bytes) {
  const uint64_t first = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) * kPieceBytes;
  if (first >= bytes) return;
  // The size must be a multiple of 16 (the last piece loses at most 15 bytes: a hint only).
  const auto size = static_cast<uint32_t>((bytes - first < kPieceBytes ? bytes - first : kPieceBytes) & ~uint64_t{15});
  if (size == 0) return;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + first), "r"(size) : "memory");
}

backend::cuda::State& side_ready(backend::Context& ctx) {
  backend::cuda::State& s = ctx.cuda_state();
  if (s.side == nullptr) {
    R3_CUDA_CHECK(cudaStreamCreateWithFlags(&s.side, cudaStreamNonBlocking));
    R3_CUDA_CHECK(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
    R3_CUDA_CHECK(cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming));
  }
  return s;
}

}  // namespace

bool o_prefetch_taken(int64_t tokens) {
  return tokens <= kPrefetchOTokens;
}

void prefetch_into_l2_beside(backend::Context& ctx, const Tensor& w) {
  const auto bytes = static_cast<uint64_t>(w.nbytes());
  // cudaMalloc'd weights start 256-byte aligned; a view that does not start on 16 bytes is skipped.
  if (bytes < 16 || reinterpret_cast<uintptr_t>(w.raw_data()) % 16 != 0) return;
  backend::cuda::State& s = side_ready(ctx);
  R3_CUDA_CHECK(cudaEventRecord(s.fork, s.stream));
  R3_CUDA_CHECK(cudaStreamWaitEvent(s.side, s.fork, 0));
  const uint64_t pieces = (bytes + kPieceBytes - 1) / kPieceBytes;
  const auto blocks = static_cast<unsigned>((pieces + kThreads - 1) / kThreads);
  prefetch_pieces<<<blocks, kThreads, 0, s.side>>>(static_cast<const char*>(w.raw_data()), bytes);
  R3_CUDA_CHECK(cudaGetLastError());
  s.side_pending = true;
}

void prefetch_weights_beside(backend::Context& ctx, const Tensor& w, int64_t tokens) {
  if (o_prefetch_taken(tokens)) prefetch_into_l2_beside(ctx, w);
}

void join_side_stream(backend::Context& ctx) {
  backend::cuda::State& s = ctx.cuda_state();
  if (!s.side_pending) return;
  R3_CUDA_CHECK(cudaEventRecord(s.join, s.side));
  R3_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.join, 0));
  s.side_pending = false;
}

}  // namespace r3::ops::cuda
