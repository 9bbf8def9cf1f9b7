#include "ops/elementwise.h"

#include <algorithm>

#include "ops/activation.h"

namespace r3::ops::cpu {

void add_rows(backend::Context&, const Tensor& x, const Tensor* gate, Tensor& y) {
  R3_CHECK(x.rank() == 2 && x.shape() == y.shape() && x.is_contiguous() && y.is_contiguous(), "add_rows: x ",
           shape_to_string(x.shape()), " y ", shape_to_string(y.shape()));
  R3_CHECK(gate == nullptr || (gate->numel() == x.dim(0)), "add_rows: one gate per row");
  const int64_t tokens = x.dim(0), d = x.dim(1);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    if (gate == nullptr) {
      for (int64_t i = 0; i < d; ++i) yp[t * d + i] += xp[t * d + i];
    } else {
      const float scale = sigmoid(gate->data<float>()[t]);
      for (int64_t i = 0; i < d; ++i) yp[t * d + i] += scale * xp[t * d + i];
    }
  }
}

void clamp(backend::Context&, Tensor& x, float limit) {
  R3_CHECK(x.is_contiguous(), "clamp: contiguous tensor expected");
  float* p = x.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] = std::clamp(p[i], -limit, limit);
}

}  // namespace r3::ops::cpu
