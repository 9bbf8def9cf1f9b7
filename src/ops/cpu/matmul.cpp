#include "ops/matmul.h"

#include "ops/cpu/matmul_kernels.h"

namespace r3::ops {

WeightMatrix WeightMatrix::of(const Tensor& w) {
  if (w.dtype() == DType::F4_E2M1X2) {
    const MxScales* s = w.mx_scales();
    R3_CHECK(w.rank() == 2 && w.strides()[1] == 1 && s != nullptr, "matmul: F4_E2M1X2 weights ",
             shape_to_string(w.shape()), " need contiguous rows and their MXFP4 scales");
    WeightMatrix m{w.raw_data(), w.dtype(), w.dim(0), 2 * w.dim(1)};
    m.mx_scales = static_cast<const uint8_t*>(s->scales.raw_data());
    m.row_stride = w.strides()[0];  // bytes: one per element
    m.scale_stride = s->scales.strides()[0];
    return m;
  }
  R3_CHECK(w.rank() == 2 && w.is_contiguous(), "matmul: weights must be a contiguous matrix, got ",
           shape_to_string(w.shape()));
  if (w.dtype() == DType::F8_E4M3) {
    const BlockScales* s = w.block_scales();
    R3_CHECK(s != nullptr, "matmul: F8_E4M3 weights ", shape_to_string(w.shape()), " without block scales");
    WeightMatrix m{w.raw_data(), w.dtype(), w.dim(0), w.dim(1)};
    m.block_scales = s->scales.data<float>();
    m.block_rows = s->block_rows;
    m.block_cols = s->block_cols;
    m.scale_cols = s->scales.dim(1);
    m.first_row = s->first_row;
    m.plain_scales = s->plain;
    return m;
  }
  R3_CHECK(w.dtype() == DType::F32 || w.dtype() == DType::BF16 || w.dtype() == DType::F16,
           "matmul: weights of dtype ", dtype_name(w.dtype()), " (expected F32, BF16, F16, F8_E4M3 or F4_E2M1X2)");
  return {w.raw_data(), w.dtype(), w.dim(0), w.dim(1)};
}

void matmul_rows(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0, int64_t n1,
                 const float* bias, float* y, int64_t ldy) {
  if (m <= 0 || n1 <= n0) return;
  if (cpu_has_avx512()) return matmul_rows_avx512(x, m, ldx, w, n0, n1, bias, y, ldy);
  matmul_rows_portable(x, m, ldx, w, n0, n1, bias, y, ldy);
}

const char* matmul_kernel_name() { return cpu_has_avx512() ? "avx512" : "portable"; }

}  // namespace r3::ops
