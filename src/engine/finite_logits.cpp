#include "engine/finite_logits.h"

#include <cmath>

#include "core/check.h"

namespace r3::engine {

void check_finite_logits(const Tensor& logits, int64_t first_position) {
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  const float* scores = logits.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t v = 0; v < vocab; ++v) {
      const float s = scores[r * vocab + v];
      R3_CHECK(std::isfinite(s), "the model produced a non-finite logit (", s, ") for token ", v, " at position ",
               first_position + r,
               ": the checkpoint holds NaN or infinite weights, or activations overflowed");
    }
  }
}

}  // namespace r3::engine
