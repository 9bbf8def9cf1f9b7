// moe/device_ep_dispatch.h: the plan (one warp walking the pairs 32 at a time: lanes bound for the
// same rank find each other with a match and take consecutive slots), the pack and the combine.
#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "core/check.h"
#include "moe/device_ep_dispatch.h"

namespace r3::moe {

namespace {

constexpr int kWarp = 32;

__global__ void plan_slots(const int32_t* __restrict__ ids, int64_t pairs, const int32_t* __restrict__ owner_of,
                           int ranks, int32_t* __restrict__ counts, int32_t* __restrict__ offsets,
                           int32_t* __restrict__ pair_slot) {
  backend::cuda::wait_for_predecessor();
  __shared__ int32_t taken[kMaxDeviceEpRanks];
  const int lane = static_cast<int>(threadIdx.x);
  for (int r = lane; r < ranks; r += kWarp) taken[r] = 0;
  __syncwarp();
  for (int64_t base = 0; base < pairs; base += kWarp) {
    const int64_t p = base + lane;
    const int rank = p < pairs ? owner_of[ids[p]] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, rank);
    const int before = __popc(same & ((1u << lane) - 1u));
    if (rank >= 0) pair_slot[p] = taken[rank] + before;
    __syncwarp();
    if (rank >= 0 && lane == 31 - __clz(same)) taken[rank] += __popc(same);  // the group's last lane
    __syncwarp();
  }
  if (lane == 0) {
    int32_t sum = 0;
    for (int r = 0; r < ranks; ++r) {
      counts[r] = taken[r];
      offsets[r] = sum;
      sum += taken[r];
    }
  }
}

// Block (x, y): elements of hidden row p's copy, for pairs p = y, y + gridDim.y, ...
__global__ void pack_rows(const float* __restrict__ hidden, int64_t h, int64_t k, const int32_t* __restrict__ ids,
                          int64_t pairs, const int32_t* __restrict__ owner_of, const int32_t* __restrict__ offsets,
                          const int32_t* __restrict__ pair_slot, float* __restrict__ send_rows,
                          int32_t* __restrict__ send_ids) {
  backend::cuda::wait_for_predecessor();
  for (int64_t p = blockIdx.y; p < pairs; p += gridDim.y) {
    const int64_t row = offsets[owner_of[ids[p]]] + pair_slot[p];
    const float* from = hidden + (p / k) * h;
    float* to = send_rows + row * h;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < h;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      to[i] = from[i];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) send_ids[row] = ids[p];
  }
}

__global__ void combine_rows(const float* __restrict__ back, const int32_t* __restrict__ ids,
                             const float* __restrict__ weights, int64_t tokens, int64_t k, int64_t h,
                             const int32_t* __restrict__ owner_of, const int32_t* __restrict__ offsets,
                             const int32_t* __restrict__ pair_slot, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * h) return;
  const int64_t t = i / h, d = i % h;
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = t * k + j;
    const int64_t row = offsets[owner_of[ids[p]]] + pair_slot[p];
    sum = __fadd_rn(sum, __fmul_rn(weights[p], back[row * h + d]));
  }
  out[i] = sum;
}

}  // namespace

void plan_expert_parallel_slots(backend::Context& ctx, const int32_t* ids, int64_t pairs, const int32_t* owner_of,
                                int ranks, int32_t* counts, int32_t* offsets, int32_t* pair_slot) {
  R3_CHECK(ranks >= 1 && ranks <= kMaxDeviceEpRanks, "expert parallelism (cuda): ", ranks, " ranks (at most ",
           kMaxDeviceEpRanks, ")");
  backend::cuda::launch_kernel(plan_slots, 1, kWarp, 0, ctx.cuda_state().stream, ids, pairs, owner_of, ranks, counts,
                               offsets, pair_slot);
  R3_CUDA_CHECK(cudaGetLastError());
}

void pack_expert_parallel_rows(backend::Context& ctx, const Tensor& hidden, int64_t k, const int32_t* ids,
                               const int32_t* owner_of, const int32_t* offsets, const int32_t* pair_slot,
                               Tensor& send_rows, int32_t* send_ids) {
  const int64_t tokens = hidden.dim(0), h = hidden.dim(1), pairs = tokens * k;
  R3_CHECK(send_rows.rank() == 2 && send_rows.dim(0) == pairs && send_rows.dim(1) == h,
           "expert parallelism (cuda): a send buffer of ", shape_to_string(send_rows.shape()), " for ", pairs,
           " pairs of ", h);
  if (pairs == 0) return;
  constexpr unsigned kThreads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((h + kThreads - 1) / kThreads, 8)),
                  static_cast<unsigned>(std::min<int64_t>(pairs, 65535)));
  backend::cuda::launch_kernel(pack_rows, grid, kThreads, 0, ctx.cuda_state().stream, hidden.data<float>(), h, k,
                               ids, pairs, owner_of, offsets, pair_slot, send_rows.data<float>(), send_ids);
  R3_CUDA_CHECK(cudaGetLastError());
}

void combine_expert_parallel_rows(backend::Context& ctx, const Tensor& back_rows, const int32_t* ids,
                                  const float* weights, int64_t k, const int32_t* owner_of, const int32_t* offsets,
                                  const int32_t* pair_slot, Tensor& out) {
  const int64_t tokens = out.dim(0), h = out.dim(1);
  R3_CHECK(back_rows.rank() == 2 && back_rows.dim(0) == tokens * k && back_rows.dim(1) == h,
           "expert parallelism (cuda): ", shape_to_string(back_rows.shape()), " rows back for ", tokens,
           " tokens of top-", k);
  if (tokens == 0) return;
  backend::cuda::launch_kernel(combine_rows, static_cast<unsigned>((tokens * h + 255) / 256), 256, 0,
                               ctx.cuda_state().stream, back_rows.data<float>(), ids, weights, tokens, k, h, owner_of,
                               offsets, pair_slot, out.data<float>());
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::moe
