// The dense projection of decode-sized steps on bfloat16 tensor cores (ops/cuda/linear_mma_rows.h).
#include <cuda_bf16.h>

#include "backend/cuda/launch.cuh"
#include "ops/cuda/linear_mma_rows.h"
#include "ops/cuda/mma_rows.cuh"
#include "ops/cuda/split_bf16.h"

namespace r3::ops::cuda {

namespace {

using namespace mma_rows;

constexpr int kWarps = 4;  // per block, one 16-row weight tile each
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

// Block (x, y): weight rows [64x, 64x + 64) against activation rows [8 kN y, 8 kN (y + 1)).
template <int kN>
__global__ void __launch_bounds__(kWarps * 32) dense_tiles(SplitRows x, int64_t m, const __nv_bfloat16* __restrict__ w,
                                                            int64_t n, const float* __restrict__ bias,
                                                            float* __restrict__ y) {
  backend::cuda::wait_for_predecessor();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  if (n0 >= n) return;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kColsPerTile * kN;
  const __nv_bfloat16* const rows[1] = {w + n0 * x.width};
  float acc[1][kN][4] = {};
  multiply<1, kN, unroll_for(kN)>(x, first, m, rows, acc);
#pragma unroll
  for (int t = 0; t < kN; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = first + t * kColsPerTile + acc_col(lane, i);
      if (row >= m) continue;
      const int64_t col = n0 + acc_row(lane, i);
      y[row * n + col] = bias != nullptr ? acc[0][t][i] + bias[col] : acc[0][t][i];
    }
  }
}

template <int kN>
void launch(cudaStream_t stream, const SplitRows& parts, int64_t m, const Tensor& w, const float* bias, Tensor& y) {
  const int64_t n = w.dim(0);
  const dim3 grid(static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((m + kColsPerTile * kN - 1) / (kColsPerTile * kN)));
  backend::cuda::launch_kernel(dense_tiles<kN>, grid, kWarps * 32, 0, stream, parts, m,
                               static_cast<const __nv_bfloat16*>(w.raw_data()), n, bias, y.data<float>());
}

}  // namespace

bool linear_mma_rows_fit(const Tensor& w) {
  return w.dtype() == DType::BF16 && w.dim(0) % kRowsPerWarp == 0 && w.dim(1) % kStepK == 0 &&
         reinterpret_cast<uintptr_t>(w.raw_data()) % 16 == 0;
}

void linear_mma_rows(backend::Context& ctx, const Tensor& x, const Tensor& w, const float* bias, Tensor& y) {
  R3_CHECK(linear_mma_rows_fit(w), "linear (cuda, tensor-core rows): weights ", shape_to_string(w.shape()), " of ",
           dtype_name(w.dtype()));
  const int64_t m = x.dim(0), k = x.dim(1);
  R3_CHECK(m <= int64_t{65535} * 8, "linear (cuda, tensor-core rows): ", m, " rows in one call");
  backend::Workspace::Scope scope(ctx.workspace());
  Tensor parts = ctx.scratch_for_output(DType::BF16, {2 * m, k});
  split_rows_bf16(ctx, x, parts);
  auto* hi = static_cast<__nv_bfloat16*>(parts.raw_data());
  const SplitRows split{hi, hi + m * k, k};
  const cudaStream_t stream = ctx.cuda_state().stream;
  // Activation rows per block: the step's rows up to 32 (more blocks read the weights again).
  if (m <= kColsPerTile) launch<1>(stream, split, m, w, bias, y);
  else if (m <= 2 * kColsPerTile) launch<2>(stream, split, m, w, bias, y);
  else launch<4>(stream, split, m, w, bias, y);
}

}  // namespace r3::ops::cuda
