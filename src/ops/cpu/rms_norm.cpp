#include "ops/rms_norm.h"

#include <cmath>

namespace r3::ops {

void cpu::rms_norm(backend::Context& ctx, const Tensor& x, const Tensor* weight, float eps, Tensor& y) {
  R3_CHECK(x.rank() >= 1 && x.is_contiguous() && y.is_contiguous() && x.numel() == y.numel(),
           "rms_norm: x ", shape_to_string(x.shape()), " y ", shape_to_string(y.shape()));
  const int64_t d = x.shape().back();
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  R3_CHECK(weight == nullptr || (weight->rank() == 1 && weight->dim(0) == d),
           "rms_norm: weight shape");
  const float* xp = x.data<float>();
  const float* wp = weight ? weight->data<float>() : nullptr;
  float* yp = y.data<float>();
  ctx.parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row(xp + r * d, wp, d, eps, yp + r * d);
  });
}

void rms_norm_row(const float* x, const float* weight, int64_t d, float eps, float* y) {
  // The mean of squares in double: cheap, and keeps the normaliser as exact as the float64
  // reference.
  double sum = 0;
  for (int64_t i = 0; i < d; ++i) sum += static_cast<double>(x[i]) * x[i];
  const auto inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(d) + eps));
  for (int64_t i = 0; i < d; ++i) y[i] = weight ? weight[i] * (x[i] * inv) : x[i] * inv;
}

}  // namespace r3::ops
