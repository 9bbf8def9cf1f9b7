// The dense projection of decode-sized steps on bfloat16 tensor cores, bfloat16 or FP8 weights
// (ops/cuda/linear_mma_rows.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/linear_mma_rows.h"
#include "ops/cuda/mma_rows.cuh"
#include "ops/cuda/split_bf16.h"
#include "ops/cuda/weight_matrices.h"

namespace r3::ops::cuda {

namespace {

using namespace mma_rows;

constexpr int kWarps = 4;  // per block, one 16-row weight tile each
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

// The weight tile of 16 rows from row n0 times the activation rows, over K [k_begin, k_end):
// bfloat16 weights as they are, FP8 widened exactly with each K block's scale on its partial sums
// (the tile lies in one block of rows: block_rows and the first row multiples of 16). Either
// keeps unroll_for(kN) K steps' loads in flight.
template <int kN>
__device__ void multiply_tile(const SplitRows& x, int64_t first, int64_t m, const PlainMatrix<__nv_bfloat16>& w,
                              int64_t n0, float (&acc)[1][kN][4], int64_t k_begin, int64_t k_end) {
  const __nv_bfloat16* const rows[1] = {w.values + n0 * w.cols};
  multiply<1, kN, unroll_for(kN)>(x, first, m, rows, acc, k_begin, k_end);
}
template <int kN>
__device__ void multiply_tile(const SplitRows& x, int64_t first, int64_t m, const Fp8Matrix& w, int64_t n0,
                              float (&acc)[1][kN][4], int64_t k_begin, int64_t k_end) {
  const int64_t scale_row = (w.first_row + n0) / w.block_rows;  // a dense weight: one matrix
  const Fp8Tile tiles[1] = {{w.values + n0 * w.cols, w.scales + scale_row * w.scale_cols, w.block_cols}};
  multiply_fp8<1, kN, unroll_for(kN)>(x, first, m, tiles, acc, k_begin, k_end);
}

// Block (x, y, z): weight rows [64x, 64x + 64) against activation rows [8 kN y, 8 kN (y + 1)),
// over the z-th of `splits` equal ranges of K. One range: y gets the sums (+ bias); several: the
// range's partial sums go to partial[z] ([m, n] each), which add_ranges sums in range order.
template <int kN, typename Matrix>
__global__ void __launch_bounds__(kWarps * 32) dense_tiles(SplitRows x, int64_t m, Matrix w, int64_t n,
                                                            const float* __restrict__ bias, int64_t splits,
                                                            float* __restrict__ partial, float* __restrict__ y) {
  backend::cuda::wait_for_predecessor();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  if (n0 >= n) return;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kColsPerTile * kN;
  const int64_t range = x.width / splits, k_begin = blockIdx.z * range;
  float acc[1][kN][4] = {};
  multiply_tile<kN>(x, first, m, w, n0, acc, k_begin, k_begin + range);
  float* out = splits == 1 ? y : partial + blockIdx.z * m * n;
#pragma unroll
  for (int t = 0; t < kN; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = first + t * kColsPerTile + acc_col(lane, i);
      if (row >= m) continue;
      const int64_t col = n0 + acc_row(lane, i);
      out[row * n + col] = splits == 1 && bias != nullptr ? acc[0][t][i] + bias[col] : acc[0][t][i];
    }
  }
}

// y[i] = partial[0][i] + partial[1][i] + ... (+ bias), in range order.
__global__ void add_ranges(const float* __restrict__ partial, int64_t splits, int64_t count, int64_t n,
                           const float* __restrict__ bias, float* __restrict__ y) {
  backend::cuda::wait_for_predecessor();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = partial[i];
    for (int64_t z = 1; z < splits; ++z) sum += partial[z * count + i];
    y[i] = bias != nullptr ? sum + bias[i % n] : sum;
  }
}

// Ranges of K per weight tile: enough that the step has about 8 warps per SM (a projection of a
// few thousand rows has only n / 16 tiles: o_proj of Qwen3-30B-A3B, 128), each range at least
// 512 positions and a multiple of `unit` (32, or an FP8 weight's block width: a range takes
// whole blocks, each scaled once).
int64_t k_splits(backend::Context& ctx, int64_t warps, int64_t k, int64_t unit) {
  const int64_t wanted = 8 * static_cast<int64_t>(ctx.cuda_state().sm_count);
  int64_t splits = 1;
  while (warps * splits < wanted && k % (2 * splits * unit) == 0 && k / (2 * splits) >= 512) splits *= 2;
  return splits;
}

int64_t k_unit(const PlainMatrix<__nv_bfloat16>&) { return kStepK; }
int64_t k_unit(const Fp8Matrix& w) { return std::max<int64_t>(kStepK, w.block_cols); }

template <int kN, typename Matrix>
void launch_tiles(backend::Context& ctx, const SplitRows& parts, int64_t m, const Matrix& w, int64_t n,
                  const float* bias, Tensor& y) {
  const cudaStream_t stream = ctx.cuda_state().stream;
  const auto tiles = (n + kRowsPerBlock - 1) / kRowsPerBlock, row_blocks = (m + kColsPerTile * kN - 1) / (kColsPerTile * kN);
  const int64_t splits = k_splits(ctx, tiles * kWarps * row_blocks, parts.width, k_unit(w));
  Tensor partial;
  if (splits > 1) partial = ctx.scratch_for_output(DType::F32, {splits, m, n});
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
  backend::cuda::launch_kernel(dense_tiles<kN, Matrix>, grid, kWarps * 32, 0, stream, parts, m, w, n, bias,
                               splits, splits > 1 ? partial.data<float>() : nullptr, y.data<float>());
  if (splits > 1) {
    const int64_t count = m * n;
    backend::cuda::launch_kernel(add_ranges, static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 4096)), 256, 0,
                                 stream, partial.data<float>(), splits, count, n, bias, y.data<float>());
  }
}

}  // namespace

bool linear_mma_rows_fit(const Tensor& w) {
  if (w.device() != Device::kCuda || w.rank() != 2 || !w.is_contiguous() || w.dim(0) % kRowsPerWarp != 0 ||
      w.dim(1) % kStepK != 0 || reinterpret_cast<uintptr_t>(w.raw_data()) % 16 != 0) {
    return false;
  }
  if (w.dtype() == DType::BF16) return true;
  const BlockScales* s = w.block_scales();
  return w.dtype() == DType::F8_E4M3 && s != nullptr && s->block_rows % kRowsPerWarp == 0 &&
         s->first_row % kRowsPerWarp == 0 && s->block_cols % kStepK == 0;
}

void linear_mma_rows(backend::Context& ctx, const Tensor& x, const Tensor& w, const float* bias, Tensor& y) {
  R3_CHECK(linear_mma_rows_fit(w), "linear (cuda, tensor-core rows): weights ", shape_to_string(w.shape()), " of ",
           dtype_name(w.dtype()));
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  R3_CHECK(m <= int64_t{65535} * 8, "linear (cuda, tensor-core rows): ", m, " rows in one call");
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor parts = ctx.scratch_for_output(DType::BF16, {2 * m, k});
  split_rows_bf16(ctx, x, parts);
  auto* hi = static_cast<__nv_bfloat16*>(parts.raw_data());
  const SplitRows split{hi, hi + m * k, k};
  with_weight_matrix(w, [&](auto matrix) {
    using Matrix = decltype(matrix);
    if constexpr (std::is_same_v<Matrix, PlainMatrix<__nv_bfloat16>> || std::is_same_v<Matrix, Fp8Matrix>) {
      // Activation rows per block: the step's rows up to 32 (more blocks read the weights again).
      if (m <= kColsPerTile) launch_tiles<1>(ctx, split, m, matrix, n, bias, y);
      else if (m <= 2 * kColsPerTile) launch_tiles<2>(ctx, split, m, matrix, n, bias, y);
      else launch_tiles<4>(ctx, split, m, matrix, n, bias, y);
    }
  });
}

}  // namespace r3::ops::cuda
