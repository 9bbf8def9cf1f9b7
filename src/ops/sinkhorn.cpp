#include "ops/sinkhorn.h"

#include <algorithm>
#include <cmath>

namespace r3::ops {

namespace {

void normalise_columns(float* m, int64_t n, float eps) {
  for (int64_t k = 0; k < n; ++k) {
    float sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += m[j * n + k];
    for (int64_t j = 0; j < n; ++j) m[j * n + k] /= sum + eps;
  }
}

void normalise_rows(float* m, int64_t n, float eps) {
  for (int64_t j = 0; j < n; ++j) {
    float sum = 0;
    for (int64_t k = 0; k < n; ++k) sum += m[j * n + k];
    for (int64_t k = 0; k < n; ++k) m[j * n + k] /= sum + eps;
  }
}

}  // namespace

void sinkhorn_mix(float* m, int64_t n, int64_t iters, float eps) {
  for (int64_t j = 0; j < n; ++j) {  // softmax over the row (last axis), + eps
    float* row = m + j * n;
    float max_logit = -INFINITY;
    for (int64_t k = 0; k < n; ++k) max_logit = std::max(max_logit, row[k]);
    float sum = 0;
    for (int64_t k = 0; k < n; ++k) sum += (row[k] = std::exp(row[k] - max_logit));
    for (int64_t k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
  }
  normalise_columns(m, n, eps);
  for (int64_t it = 1; it < iters; ++it) {
    normalise_rows(m, n, eps);
    normalise_columns(m, n, eps);
  }
}

}  // namespace r3::ops
