// Internal to the matmul op: the instruction-set variants behind ops::matmul_rows.
#pragma once

#include "ops/cpu/cpu_features.h"
#include "ops/matmul.h"

namespace r3::ops {

constexpr int kMatmulLanes = 16;

// AVX-512 (F + BW + VL) variant; only call when cpu_has_avx512() is true.
void matmul_rows_avx512(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n0, int64_t n1,
                        const float* bias, float* y, int64_t ldy);

}  // namespace r3::ops
