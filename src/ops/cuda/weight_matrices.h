// The weight matrices r3's weight-streaming kernels take as arguments (ops/cuda/weight_rows.cuh
// reads them): plain float32 / bfloat16, FP8 e4m3 with block scales, MXFP4 with e8m0 scales.
// Plain structs of device pointers and sizes, passed to kernels by value; with_weight_matrix
// makes the one a device Tensor holds and hands it to a generic launcher.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace r3::ops::cuda {

// [rows, cols] of T (float or __nv_bfloat16), rows contiguous one after another.
template <typename T>
struct PlainMatrix {
  const T* values;
  int64_t cols;
};

// [rows, cols] bytes of e4m3; row r's scales are the scale row of r's block. Stacked expert
// matrices each have their own grid of scales: row r is row r % rows_per_matrix of matrix
// r / rows_per_matrix, whose scales start scale_rows_per_matrix scale rows further on. first_row
// is the first row's index in the matrix the scales were made for (a row range of a weight).
struct Fp8Matrix {
  const uint8_t* values;
  const float* scales;  // [matrices * scale_rows_per_matrix, scale_cols]
  int64_t cols;
  int64_t rows_per_matrix;
  int64_t scale_rows_per_matrix;
  int64_t scale_cols;
  int64_t first_row;
  int32_t block_rows, block_cols;
  int32_t block_cols_shift;  // log2(block_cols) when a power of two, else -1 (fp8_block_cols_shift)
};

// log2(block_cols) when block_cols is a power of two (128 in every published checkpoint), else -1.
// The eight-value loads (kVec8) take such blocks only and find a group's scale by this shift, not
// by a 32-bit division for every eight values (a dozen instructions, about as many as widening
// the eight takes).
inline int32_t fp8_block_cols_shift(int64_t block_cols) {
  if (block_cols <= 0 || (block_cols & (block_cols - 1)) != 0) return -1;
  int32_t shift = 0;
  while ((int64_t{1} << shift) < block_cols) ++shift;
  return shift;
}

// An Fp8Matrix of `rows` rows in all (stacked matrices of rows_per_matrix each), checked to fit
// the 32-bit row arithmetic of row_of (weight_rows.cuh). An empty one is made as before: no
// kernel asks it for a row.
inline Fp8Matrix fp8_matrix(const uint8_t* values, const float* scales, int64_t rows, int64_t cols,
                            int64_t rows_per_matrix, int64_t scale_rows_per_matrix, int64_t scale_cols,
                            int64_t first_row, int64_t block_rows, int64_t block_cols) {
  constexpr int64_t kMaxRows = int64_t{1} << 31;
  R3_CHECK(rows >= 0 && rows < kMaxRows && first_row >= 0 && first_row + rows_per_matrix < kMaxRows &&
               rows_per_matrix >= 0 && block_rows > 0 && block_rows < kMaxRows && block_cols > 0 && block_cols < kMaxRows,
           "weights (cuda): an FP8 matrix of ", rows, " rows (from row ", first_row, ") in blocks of ", block_rows,
           " x ", block_cols, ": a matrix must hold fewer than 2^31 rows");
  return Fp8Matrix{values, scales, cols, rows_per_matrix, scale_rows_per_matrix, scale_cols, first_row,
                   static_cast<int32_t>(block_rows), static_cast<int32_t>(block_cols), fp8_block_cols_shift(block_cols)};
}

// [rows, cols / 2] bytes (value 2i of a row in the low nibble of byte i) and [rows, ceil(cols / 32)]
// e8m0 scales, both rows contiguous.
struct Mxfp4Matrix {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t cols;
};

// The matrix a device weight tensor holds (rank 2; FP8 with its device block scales attached,
// MXFP4 with its device e8m0 scales), given to launch(matrix). Other dtypes are refused by name.
template <typename Launch>
decltype(auto) with_weight_matrix(const Tensor& w, Launch&& launch) {
  R3_CHECK(w.rank() == 2 && w.device() == Device::kCuda, "weights (cuda): a device matrix expected, got ",
           shape_to_string(w.shape()));
  const int64_t cols = value_shape(w)[1];
  switch (w.dtype()) {
    case DType::F32: return launch(PlainMatrix<float>{w.data<float>(), cols});
    case DType::BF16: return launch(PlainMatrix<__nv_bfloat16>{static_cast<const __nv_bfloat16*>(w.raw_data()), cols});
    case DType::F8_E4M3: {
      const BlockScales* s = w.block_scales();
      R3_CHECK(s != nullptr && s->scales.device() == Device::kCuda, "weights (cuda): an F8_E4M3 matrix without its scales");
      return launch(fp8_matrix(static_cast<const uint8_t*>(w.raw_data()), s->scales.data<float>(), w.dim(0), cols,
                               w.dim(0), s->scales.dim(0), s->scales.dim(1), s->first_row, s->block_rows,
                               s->block_cols));
    }
    case DType::F4_E2M1X2: {
      const MxScales* s = w.mx_scales();
      R3_CHECK(s != nullptr && s->scales.device() == Device::kCuda && w.is_contiguous() && s->scales.is_contiguous(),
               "weights (cuda): an MXFP4 matrix without its scales, or with rows apart");
      return launch(Mxfp4Matrix{static_cast<const uint8_t*>(w.raw_data()), static_cast<const uint8_t*>(s->scales.raw_data()), cols});
    }
    default: R3_FAIL("weights (cuda): no kernels for ", dtype_name(w.dtype()), " weights");
  }
}

// Whether the eight-at-a-time loads (kVec8) may read the matrix: rows a multiple of 8 values
// long, 16-byte aligned starts, and FP8 blocks a power of two of at least 8 wide (eight values,
// one scale, found by a shift).
inline bool weights_vec8(const Tensor& w) {
  const int64_t cols = value_shape(w)[1];
  if (cols % 8 != 0 || reinterpret_cast<uintptr_t>(w.raw_data()) % 16 != 0) return false;
  const BlockScales* s = w.block_scales();
  return s == nullptr || (s->block_cols >= 8 && fp8_block_cols_shift(s->block_cols) >= 0);
}

}  // namespace r3::ops::cuda
