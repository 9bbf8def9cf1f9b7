#include "ops/linear.h"

#include <algorithm>

#include "ops/matmul.h"

namespace r3::ops::cpu {

void linear(backend::Context& ctx, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  R3_CHECK(x.rank() == 2 && w.rank() == 2 && y.rank() == 2, "linear: rank-2 tensors expected");
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  R3_CHECK(w.dim(1) == k, "linear: x ", shape_to_string(x.shape()), " vs w ",
           shape_to_string(w.shape()));
  R3_CHECK(y.dim(0) == m && y.dim(1) == n, "linear: y ", shape_to_string(y.shape()),
           " expected [", m, ", ", n, "]");
  R3_CHECK(x.is_contiguous() && y.is_contiguous(), "linear: contiguous tensors expected");
  R3_CHECK(bias == nullptr || (bias->rank() == 1 && bias->dim(0) == n), "linear: bias shape");
  const WeightMatrix weights = WeightMatrix::of(w);
  const float* xp = x.data<float>();
  const float* bp = bias ? bias->data<float>() : nullptr;
  float* yp = y.data<float>();
  // Tasks are panels of weight rows over every x row: each weight is read from memory once.
  const int64_t panels = (n + kMatmulPanelRows - 1) / kMatmulPanelRows;
  ctx.parallel_for(panels, 1, [&](int64_t begin, int64_t end) {
    const int64_t n0 = begin * kMatmulPanelRows, n1 = std::min(n, end * kMatmulPanelRows);
    matmul_rows(xp, m, k, weights, n0, n1, bp, yp + n0, n);
  });
}

}  // namespace r3::ops::cpu
