#include "ops/grouped_projection.h"

#include "ops/cpu/dot.h"

namespace r3::ops {

void grouped_projection(const Tensor& x, const Tensor& w, int64_t groups, Tensor& y) {
  R3_CHECK(groups > 0 && x.rank() == 2 && w.rank() == 2 && y.rank() == 2 && x.dim(1) % groups == 0 &&
               w.dim(0) % groups == 0 && w.dim(1) == x.dim(1) / groups && y.dim(0) == x.dim(0) &&
               y.dim(1) == w.dim(0),
           "grouped projection: x ", shape_to_string(x.shape()), " w ", shape_to_string(w.shape()), " y ",
           shape_to_string(y.shape()), " in ", groups, " groups");
  const int64_t tokens = x.dim(0), in = w.dim(1), out = w.dim(0) / groups;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t r = 0; r < out; ++r) {
        y.data<float>()[t * groups * out + g * out + r] =
            dot(x.data<float>() + t * groups * in + g * in, w.data<float>() + (g * out + r) * in, in);
      }
    }
  }
}

}  // namespace r3::ops
