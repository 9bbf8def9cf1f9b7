// Weight-streaming GEMV: one warp per weight row (output column), reading the
// row once per pass with wide loads (float32, bfloat16, FP8 or MXFP4 weights: weight_rows.cuh) and multiplying it with up to kMaxRowsPerPass activation rows
// whose partial sums stay in registers. Decode steps have a few rows, so one pass reads every
// weight once, which is what bounds a decode step (the weight bytes); larger steps take several
// passes over the weights (prefill at this kernel's rate is a known limit; a tensor-core GEMM is
// the next step there).
#include <cuda_bf16.h>

#include <algorithm>

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

template <bool kVec8, typename Matrix, int kRowsPerPass>
__global__ void rows_kernel(const float* __restrict__ x, int64_t m, int64_t k, Matrix w, int64_t n,
                            const float* __restrict__ bias, float* __restrict__ y) {
  backend::cuda::wait_for_predecessor();
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kRowsPerPass;
  if (col >= n) return;
  const int count = static_cast<int>(min(static_cast<int64_t>(kRowsPerPass), m - first));
  const float* rows[kRowsPerPass];
#pragma unroll
  for (int j = 0; j < kRowsPerPass; ++j) rows[j] = x + (first + min(j, count - 1)) * k;
  float acc[1][kRowsPerPass] = {};
  const decltype(row_of(w, 0)) weight_row[1] = {row_of(w, col)};
  row_dots<kVec8>(weight_row, rows, count, k, lane, acc);
#pragma unroll
  for (int j = 0; j < kRowsPerPass; ++j) {
    const float sum = warp_sum(acc[0][j]);
    if (lane == 0 && j < count) y[(first + j) * n + col] = bias != nullptr ? sum + bias[col] : sum;
  }
}

template <typename Matrix>
__global__ void dequantize_kernel(Matrix w, int64_t k, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const auto row = row_of(w, blockIdx.x);
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) out[blockIdx.x * k + c] = load(row, c);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int kRowsPerPass, typename Matrix>
void launch(cudaStream_t stream, const Tensor& x, const Tensor& w, Matrix matrix, const float* bias, Tensor& y) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  const dim3 grid(static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>((m + kRowsPerPass - 1) / kRowsPerPass));
  if (weights_vec8(w) && aligned16(x.raw_data())) {
    backend::cuda::launch_kernel(rows_kernel<true, Matrix, kRowsPerPass>, grid, kWarpsPerBlock * kWarp, 0, stream,
                                 x.data<float>(), m, k, matrix, n, bias, y.data<float>());
  } else {
    backend::cuda::launch_kernel(rows_kernel<false, Matrix, kRowsPerPass>, grid, kWarpsPerBlock * kWarp, 0, stream,
                                 x.data<float>(), m, k, matrix, n, bias, y.data<float>());
  }
}

template <typename Matrix>
void launch_for_rows(cudaStream_t stream, const Tensor& x, const Tensor& w, Matrix matrix, const float* bias,
                     Tensor& y) {
  const int64_t m = x.dim(0);
  if (m <= 1) launch<1>(stream, x, w, matrix, bias, y);
  else if (m <= 2) launch<2>(stream, x, w, matrix, bias, y);
  else if (m <= 4) launch<4>(stream, x, w, matrix, bias, y);
  else launch<kMaxRowsPerPass>(stream, x, w, matrix, bias, y);
}

}  // namespace

void linear_rows(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t m = x.dim(0), n = w.dim(0);
  if (m == 0 || n == 0) return;
  R3_CHECK(m <= int64_t{65535} * kMaxRowsPerPass, "linear (cuda, rows): ", m, " rows in one call");
  const float* bp = bias != nullptr ? bias->data<float>() : nullptr;
  const cudaStream_t stream = ctx.cuda_state().stream;
  with_weight_matrix(w, [&](auto matrix) { launch_for_rows(stream, x, w, matrix, bp, y); });
  R3_CUDA_CHECK(cudaGetLastError());
}

void dequantize_matrix(backend::Context& ctx, const Tensor& w, Tensor& out) {
  const int64_t n = w.dim(0), k = value_shape(w)[1];
  R3_CHECK((w.dtype() == DType::F8_E4M3 || w.dtype() == DType::F4_E2M1X2) && out.dtype() == DType::F32 &&
               out.device() == Device::kCuda && out.is_contiguous() && out.numel() == n * k,
           "dequantize (cuda): ", dtype_name(w.dtype()), " ", shape_to_string(w.shape()), " into ",
           shape_to_string(out.shape()));
  if (n == 0) return;
  R3_CHECK(n <= 2147483647, "dequantize (cuda): ", n, " rows");
  with_weight_matrix(w, [&](auto matrix) {
    backend::cuda::launch_kernel(dequantize_kernel<decltype(matrix)>, static_cast<unsigned>(n), 256, 0,
                                 ctx.cuda_state().stream, matrix, k, out.data<float>());
  });
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
