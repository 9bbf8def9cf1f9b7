#include "ops/linear.h"

#include <algorithm>

#include "ops/dot.h"

namespace r3::ops {

namespace {
// A block of weight rows stays in cache while every input row in the M block streams past it.
constexpr int64_t kBlockN = 32;
constexpr int64_t kBlockM = 16;
}  // namespace

void linear(ThreadPool& pool, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  R3_CHECK(x.rank() == 2 && w.rank() == 2 && y.rank() == 2, "linear: rank-2 tensors expected");
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  R3_CHECK(w.dim(1) == k, "linear: x ", shape_to_string(x.shape()), " vs w ",
           shape_to_string(w.shape()));
  R3_CHECK(y.dim(0) == m && y.dim(1) == n, "linear: y ", shape_to_string(y.shape()),
           " expected [", m, ", ", n, "]");
  R3_CHECK(x.is_contiguous() && w.is_contiguous() && y.is_contiguous(),
           "linear: contiguous tensors expected");
  R3_CHECK(bias == nullptr || (bias->rank() == 1 && bias->dim(0) == n), "linear: bias shape");

  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* bp = bias ? bias->data<float>() : nullptr;
  float* yp = y.data<float>();
  const int64_t blocks_m = (m + kBlockM - 1) / kBlockM;
  const int64_t blocks_n = (n + kBlockN - 1) / kBlockN;

  pool.parallel_for(blocks_m * blocks_n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t m0 = (b / blocks_n) * kBlockM, n0 = (b % blocks_n) * kBlockN;
      const int64_t m1 = std::min(m, m0 + kBlockM), n1 = std::min(n, n0 + kBlockN);
      for (int64_t i = m0; i < m1; ++i) {
        const float* xi = xp + i * k;
        float* yi = yp + i * n;
        for (int64_t j = n0; j < n1; ++j) {
          float v = dot(xi, wp + j * k, k);
          yi[j] = bp ? v + bp[j] : v;
        }
      }
    }
  });
}

}  // namespace r3::ops
