#include "ops/matmul.h"

#include "ops/cpu/matmul_kernels.h"

namespace r3::ops {

WeightMatrix WeightMatrix::of(const Tensor& w) {
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
           "matmul: weights of dtype ", dtype_name(w.dtype()), " (expected F32, BF16, F16 or F8_E4M3)");
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
