// DeepSeek-V4's Sinkhorn mixing: an n x n matrix of logits becomes (approximately) doubly
// stochastic, as the reference computes it in float32: softmax over each row, + eps, then one
// column normalisation, then `iters - 1` rounds of row and column normalisations, each dividing
// by (sum + eps) with the sums taken in index order.
#pragma once

#include <cstdint>

namespace r3::ops {

// m: [n, n] (m[j * n + k]), logits in, mixing weights out; iters >= 1.
void sinkhorn_mix(float* m, int64_t n, int64_t iters, float eps);

}  // namespace r3::ops
