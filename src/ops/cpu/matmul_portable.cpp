// The portable definition of matmul_rows' arithmetic (see ops/matmul.h).
#include <cmath>

#include "ops/cpu/matmul_kernels.h"

namespace r3::ops {

namespace {

// Weight (row j, column c) as float32.
float weight_at(const WeightMatrix& w, int64_t j, int64_t c) {
  const int64_t index = j * w.cols + c;
  switch (w.dtype) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(w.data)[index]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(w.data)[index]);
    case DType::F8_E4M3:
      return f8_e4m3_to_f32(static_cast<const uint8_t*>(w.data)[index]) * w.scale_row(j)[c / w.block_cols];
    case DType::F4_E2M1X2: {
      const uint8_t byte = w.packed_row(j)[c / 2];
      return f4_e2m1_to_f32(c % 2 == 0 ? byte & 0xF : byte >> 4) * e8m0_to_f32(w.mx_scale_row(j)[c / MxScales::kBlock]);
    }
    default: return static_cast<const float*>(w.data)[index];
  }
}

}  // namespace

void matmul_rows_portable(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0,
                          int64_t n1, const float* bias, float* y, int64_t ldy) {
  const int64_t k = w.cols;
  const int64_t padded = (k + kMatmulLanes - 1) / kMatmulLanes * kMatmulLanes;
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * ldx;
    for (int64_t j = n0; j < n1; ++j) {
      float acc[kMatmulLanes] = {};
      for (int64_t c = 0; c < padded; c += kMatmulLanes) {
        for (int l = 0; l < kMatmulLanes; ++l) {
          const int64_t idx = c + l;
          const float xv = idx < k ? xi[idx] : 0.0f;
          const float wv = idx < k ? weight_at(w, j, idx) : 0.0f;
          acc[l] = std::fma(xv, wv, acc[l]);
        }
      }
      for (int width = kMatmulLanes / 2; width > 0; width /= 2) {
        for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
      }
      y[i * ldy + (j - n0)] = bias ? acc[0] + bias[j] : acc[0];
    }
  }
}

}  // namespace r3::ops
