// The projection kernel every weight matmul in r3 goes through: y = x · wᵀ (+ bias), with x in
// float32 and the weights in the dtype the checkpoint stores (F32, BF16, F16, F8_E4M3 with block
// scales, or MXFP4: F4_E2M1X2 with e8m0 scales), widened to float32 inside the kernel so a bf16,
// fp8 or mxfp4 checkpoint never needs a widened copy in memory. An FP8 weight element is
// decode(fp8) * its block's scale, one float32 rounding; an MXFP4 one is e2m1 * 2^(scale - 127),
// also one float32 product: the kernels compute exactly what they compute on a float32 matrix
// holding those products.
//
// Every output element is computed with one fixed sequence of float32 operations, whatever the
// number of rows, the tiling, the thread count or the instruction set:
//   16 lanes; lane l accumulates acc = fma(x[k], w[k], acc) for k = l, l + 16, ... in ascending
//   order over the K range padded with zeros to a multiple of 16; the lanes are then added
//   pairwise (l + 8, l + 4, l + 2, l + 1); a bias, when given, is added last.
// That is what makes batched prefill, chunked steps and decode give the same bits (batch
// invariance), and the AVX-512 kernel equal to the portable one.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace r3::ops {

// A weight matrix [rows = out features, cols = in features], rows contiguous, as stored.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;  // F32, BF16, F16, F8_E4M3 or F4_E2M1X2
  int64_t rows = 0, cols = 0;  // cols: values (two per byte for F4_E2M1X2)
  // F8_E4M3 only (the weight's BlockScales): element (j, k) is
  // decode(data[j * cols + k]) * block_scales[((first_row + j) / block_rows) * scale_cols + k / block_cols].
  const float* block_scales = nullptr;
  int64_t block_rows = 0, block_cols = 0, scale_cols = 0, first_row = 0;
  bool plain_scales = false;  // BlockScales::plain
  // F4_E2M1X2 only (MXFP4, the weight's MxScales): row j's packed values start at
  // data + j * row_stride bytes (rows may be strided: GPT-OSS's gate and up rows interleave), its
  // e8m0 scales at mx_scales + j * scale_stride; element (j, k) is
  // e2m1(nibble k of the row: low nibble first) * 2^(scale k / 32 - 127).
  const uint8_t* mx_scales = nullptr;
  int64_t row_stride = 0, scale_stride = 0;

  // Checks `w` is a contiguous rank-2 F32/BF16/F16 tensor, F8_E4M3 with block scales, or
  // F4_E2M1X2 (rows contiguous) with MXFP4 scales.
  static WeightMatrix of(const Tensor& w);
  // The scales of weight row j (F8_E4M3): entry k / block_cols is column k's.
  const float* scale_row(int64_t j) const { return block_scales + ((first_row + j) / block_rows) * scale_cols; }
  // Weight row j's packed bytes and its e8m0 scales (F4_E2M1X2).
  const uint8_t* packed_row(int64_t j) const { return static_cast<const uint8_t*>(data) + j * row_stride; }
  const uint8_t* mx_scale_row(int64_t j) const { return mx_scales + j * scale_stride; }
};

// y[i * ldy + (j - n0)] = x[i] · w[j] (+ bias[j]) for rows i in [0, m), outputs j in [n0, n1).
// x rows are ldx floats apart and hold w.cols values. Single-threaded: callers split the work.
void matmul_rows(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0, int64_t n1,
                 const float* bias, float* y, int64_t ldy);

// The same contract in portable C++ (the definition of the arithmetic); tests compare the
// vectorised kernel against it bit for bit.
void matmul_rows_portable(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0,
                          int64_t n1, const float* bias, float* y, int64_t ldy);

// Which kernel matmul_rows uses on this machine: "avx512" or "portable".
const char* matmul_kernel_name();

// Weight rows a task should cover so that its block stays in the L1 cache while x streams past.
constexpr int64_t kMatmulPanelRows = 16;

}  // namespace r3::ops
