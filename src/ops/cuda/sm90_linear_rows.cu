// Weight-streaming GEMV: one warp per weight row (output column), reading the
// row once per pass with wide loads (float32, bfloat16, FP8 or MXFP4 weights: weight_rows.cuh) and multiplying it with up to kMaxRowsPerPass activation rows
// whose partial sums stay in registers. Decode steps have a few rows, so one pass reads every
// weight once, which is what bounds a decode step (the weight bytes); larger steps take several
// passes over the weights (prefill at this kernel's rate is a known limit; a tensor-core GEMM is
// the next step there).
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/linear_rows.h"
#include "ops/cuda/warp_row_dots.cuh"

namespace r3::ops::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
// Activation rows per pass over the weights, at most: 8, or the call's rows when fewer (decode
// steps), so that the warps hold only the partial sums they use and more of them fit on an SM.
constexpr int kMaxRowsPerPass = 8;

// kSplit warps of a block share an output column, warp s of them taking the s-th of kSplit equal
// slices of k; their sums are added in slice order through shared memory. A projection with
// fewer rows than the GPU holds warps (a decode step's o projection, 2048 rows; the router's 128)
// so runs on more warps, each streaming fewer bytes one round after another.
//
// With wide loads, each warp issues its row's first round of loads before it waits for its
// predecessor (the weights are no kernel's output: backend/cuda/launch.cuh), so that, where the
// short kernel before it releases it early (an RMSNorm, the attention's merge), they come from
// memory while that kernel runs. It releases its own successor once it has waited (a short
// kernel: the q/k norms and rotary, the routing), which can then do what needs no output of this
// one. kLaneScales: FP8 rows whose slice's scales fit the lanes (fp8_lane_scales_fit)
// load them, one a lane, with the first round, and each group takes its scale by a shuffle, so
// after the wait only the activations are left to load.
template <bool kVec8, typename Matrix, int kRowsPerPass, int kSplit, bool kLaneScales = false>
__device__ __forceinline__ void rows_body(const float* __restrict__ x, int64_t m, int64_t k, Matrix w, int64_t n,
                                          const float* __restrict__ bias, float* __restrict__ y) {
  static_assert(kWarpsPerBlock % kSplit == 0);
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * (kWarpsPerBlock / kSplit) + warp / kSplit;
  const int slice = warp % kSplit;
  const int64_t per_slice = k / kSplit, begin = slice * per_slice, end = (slice + 1) * per_slice;
  using Row = decltype(row_of(w, 0));
  const Row weight_row[1] = {row_of(w, col < n ? col : 0)};
  RoundOf<Row, 1> first_round;
  if constexpr (kVec8) {
    if (col < n) first_round_loads(weight_row, end, lane, first_round, begin);
  }
  using Widen = std::conditional_t<kLaneScales, Fp8LaneScales<1>, WidenByRow>;
  Widen widen{};
  if constexpr (kLaneScales) {
    if (col < n) widen = fp8_lane_scales(weight_row, begin, end, lane);
  }
  backend::cuda::wait_for_predecessor();
  backend::cuda::release_successor();
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kRowsPerPass;
  if constexpr (kSplit == 1) {
    if (col >= n) return;  // (split: every warp reaches the barrier below)
  }
  const int count = static_cast<int>(min(static_cast<int64_t>(kRowsPerPass), m - first));
  const float* rows[kRowsPerPass];
#pragma unroll
  for (int j = 0; j < kRowsPerPass; ++j) rows[j] = x + (first + min(j, count - 1)) * k;
  float acc[1][kRowsPerPass] = {};
  if (col < n) {
    if constexpr (kVec8) {
      row_dots_after_first_round(weight_row, rows, count, end, lane, first_round, acc, begin, widen);
    } else {
      row_dots<false>(weight_row, rows, count, end, lane, acc, begin);
    }
  }
  if constexpr (kSplit == 1) {
#pragma unroll
    for (int j = 0; j < kRowsPerPass; ++j) {
      const float sum = warp_sum(acc[0][j]);
      if (lane == 0 && j < count) y[(first + j) * n + col] = bias != nullptr ? sum + bias[col] : sum;
    }
  } else {
    __shared__ float partial[kWarpsPerBlock][kRowsPerPass];
#pragma unroll
    for (int j = 0; j < kRowsPerPass; ++j) {
      const float sum = warp_sum(acc[0][j]);
      if (lane == 0) partial[warp][j] = sum;
    }
    __syncthreads();
    if (slice == 0 && col < n && lane < count) {
      float sum = partial[warp][lane];
#pragma unroll
      for (int s = 1; s < kSplit; ++s) sum += partial[warp + s][lane];
      y[(first + lane) * n + col] = bias != nullptr ? sum + bias[col] : sum;
    }
  }
}

template <bool kVec8, typename Matrix, int kRowsPerPass, int kSplit, bool kLaneScales = false>
__global__ void rows_kernel(const float* __restrict__ x, int64_t m, int64_t k, Matrix w, int64_t n,
                            const float* __restrict__ bias, float* __restrict__ y) {
  rows_body<kVec8, Matrix, kRowsPerPass, kSplit, kLaneScales>(x, m, k, w, n, bias, y);
}

// FP8 rows at one row a pass, unsplit, with wide loads: held to 48 registers so that 5 blocks fit
// an SM where 4 would otherwise (a batch-1 q/k/v projection's 640 blocks, 5120 rows, then run as
// one wave on 132 SMs).
constexpr int kOccupiedBlocks = 5;
template <typename Matrix, bool kLaneScales = false>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp, kOccupiedBlocks)
    rows_kernel_occupied(const float* __restrict__ x, int64_t m, int64_t k, Matrix w, int64_t n,
                         const float* __restrict__ bias, float* __restrict__ y) {
  rows_body<true, Matrix, 1, 1, kLaneScales>(x, m, k, w, n, bias, y);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int kRowsPerPass, int kSplit, typename Matrix>
void launch(cudaStream_t stream, const Tensor& x, const Tensor& w, Matrix matrix, const float* bias, Tensor& y,
            bool vec8) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  constexpr int kColsPerBlock = kWarpsPerBlock / kSplit;
  const dim3 grid(static_cast<unsigned>((n + kColsPerBlock - 1) / kColsPerBlock),
                  static_cast<unsigned>((m + kRowsPerPass - 1) / kRowsPerPass));
  if constexpr (std::is_same_v<Matrix, Fp8Matrix> && kRowsPerPass == 1) {
    // One row a pass (decode at batch 1): the scales from the lanes where the slices fit them,
    // every slice starting on a block boundary.
    const int64_t slice = k / kSplit;
    const bool lanes = vec8 && fp8_lane_scales_fit(0, slice, matrix.block_cols) &&
                       (kSplit == 1 || slice % matrix.block_cols == 0);
    if constexpr (kSplit == 1) {
      if (vec8) {
        backend::cuda::launch_kernel(lanes ? rows_kernel_occupied<Matrix, true> : rows_kernel_occupied<Matrix, false>,
                                     grid, kWarpsPerBlock * kWarp, 0, stream, x.data<float>(), m, k, matrix, n, bias,
                                     y.data<float>());
        return;
      }
    } else {
      if (lanes) {
        backend::cuda::launch_kernel(rows_kernel<true, Matrix, 1, kSplit, true>, grid, kWarpsPerBlock * kWarp, 0,
                                     stream, x.data<float>(), m, k, matrix, n, bias, y.data<float>());
        return;
      }
    }
  }
  if (vec8) {
    backend::cuda::launch_kernel(rows_kernel<true, Matrix, kRowsPerPass, kSplit>, grid, kWarpsPerBlock * kWarp, 0,
                                 stream, x.data<float>(), m, k, matrix, n, bias, y.data<float>());
  } else if constexpr (kSplit == 1) {  // (split_for splits wide loads only)
    backend::cuda::launch_kernel(rows_kernel<false, Matrix, kRowsPerPass, 1>, grid, kWarpsPerBlock * kWarp, 0,
                                 stream, x.data<float>(), m, k, matrix, n, bias, y.data<float>());
  }
}

template <int kRowsPerPass, typename Matrix>
void launch_split(cudaStream_t stream, const Tensor& x, const Tensor& w, Matrix matrix, const float* bias, Tensor& y,
                  bool vec8, int split) {
  if (split == 8) launch<kRowsPerPass, 8>(stream, x, w, matrix, bias, y, vec8);
  else if (split == 4) launch<kRowsPerPass, 4>(stream, x, w, matrix, bias, y, vec8);
  else if (split == 2) launch<kRowsPerPass, 2>(stream, x, w, matrix, bias, y, vec8);
  else launch<kRowsPerPass, 1>(stream, x, w, matrix, bias, y, vec8);
}

// How many warps share a column (rows_kernel's kSplit): doubled, up to 8, while the columns times
// the split stay within half of about one wave of warps (32 resident an SM) and each slice keeps
// at least 256 elements (one wide load a lane). It depends on the weight's shape and the GPU
// only, never on the rows (so a row's sum is the same at every batch size: batch invariance).
int split_for(int64_t n, int64_t k, bool vec8, int sm_count) {
  if (!vec8) return 1;
  const int64_t wave = int64_t{32} * sm_count;
  int split = 1;
  while (split < 8 && n * split * 2 <= wave && k % (split * 2 * 8) == 0 && k / (split * 2) >= 256) split *= 2;
  return split;
}

template <typename Matrix>
void launch_for_rows(const backend::cuda::State& state, const Tensor& x, const Tensor& w, Matrix matrix,
                     const float* bias, Tensor& y) {
  const int64_t m = x.dim(0);
  const bool vec8 = weights_vec8(w) && aligned16(x.raw_data());
  const int split = split_for(w.dim(0), x.dim(1), vec8, state.sm_count);
  const cudaStream_t stream = state.stream;
  if (m <= 1) launch_split<1>(stream, x, w, matrix, bias, y, vec8, split);
  else if (m <= 2) launch_split<2>(stream, x, w, matrix, bias, y, vec8, split);
  else if (m <= 4) launch_split<4>(stream, x, w, matrix, bias, y, vec8, split);
  else launch_split<kMaxRowsPerPass>(stream, x, w, matrix, bias, y, vec8, split);
}

}  // namespace

void linear_rows(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t m = x.dim(0), n = w.dim(0);
  if (m == 0 || n == 0) return;
  R3_CHECK(m <= int64_t{65535} * kMaxRowsPerPass, "linear (cuda, rows): ", m, " rows in one call");
  const float* bp = bias != nullptr ? bias->data<float>() : nullptr;
  with_weight_matrix(w, [&](auto matrix) { launch_for_rows(ctx.cuda_state(), x, w, matrix, bp, y); });
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
