// Quantized device matrices decoded into float32, or straight into split bfloat16 parts
// (ops/cuda/dequantize.h): a block per row, its threads taking the row's values in turn.
#include <cuda_bf16.h>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/state.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/split_value.cuh"
#include "ops/cuda/weight_rows.cuh"

namespace r3::ops::cuda {

namespace {

template <typename Matrix>
__global__ void dequantize_kernel(Matrix w, int64_t k, float* __restrict__ out) {
  backend::cuda::wait_for_predecessor();
  const auto row = row_of(w, blockIdx.x);
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) out[blockIdx.x * k + c] = load(row, c);
}

// The same values, each split as split_rows_bf16 splits a float (split_value).
template <typename Matrix>
__global__ void dequantize_split_kernel(Matrix w, int64_t n, int64_t k, __nv_bfloat16* __restrict__ parts) {
  backend::cuda::wait_for_predecessor();
  const auto row = row_of(w, blockIdx.x);
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
    const SplitValue s = split_value(load(row, c));
    parts[blockIdx.x * k + c] = s.hi;
    parts[(n + blockIdx.x) * k + c] = s.lo;
  }
}

// The matrix's rows and values, checked: quantized, on the device, out of `rows` x k.
void check(const Tensor& w, const Tensor& out, DType out_dtype, int64_t rows, const char* what) {
  const int64_t n = w.dim(0), k = value_shape(w)[1];
  R3_CHECK((w.dtype() == DType::F8_E4M3 || w.dtype() == DType::F4_E2M1X2) && out.dtype() == out_dtype &&
               out.device() == Device::kCuda && out.is_contiguous() && out.numel() == rows * k,
           what, " (cuda): ", dtype_name(w.dtype()), " ", shape_to_string(w.shape()), " into ",
           shape_to_string(out.shape()));
  R3_CHECK(n <= 2147483647, what, " (cuda): ", n, " rows");
}

}  // namespace

void dequantize_matrix(backend::Context& ctx, const Tensor& w, Tensor& out) {
  const int64_t n = w.dim(0), k = value_shape(w)[1];
  check(w, out, DType::F32, n, "dequantize");
  if (n == 0) return;
  with_weight_matrix(w, [&](auto matrix) {
    backend::cuda::launch_kernel(dequantize_kernel<decltype(matrix)>, static_cast<unsigned>(n), 256, 0,
                                 ctx.cuda_state().stream, matrix, k, out.data<float>());
  });
  R3_CUDA_CHECK(cudaGetLastError());
}

void dequantize_matrix_split_bf16(backend::Context& ctx, const Tensor& w, Tensor& parts) {
  const int64_t n = w.dim(0), k = value_shape(w)[1];
  check(w, parts, DType::BF16, 2 * n, "dequantize into split parts");
  if (n == 0) return;
  with_weight_matrix(w, [&](auto matrix) {
    backend::cuda::launch_kernel(dequantize_split_kernel<decltype(matrix)>, static_cast<unsigned>(n), 256, 0,
                                 ctx.cuda_state().stream, matrix, n, k, static_cast<__nv_bfloat16*>(parts.raw_data()));
  });
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::ops::cuda
