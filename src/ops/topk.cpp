#include "ops/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace r3::ops {

void softmax(std::span<float> values) {
  if (values.empty()) return;
  const float max_value = *std::max_element(values.begin(), values.end());
  double sum = 0;
  for (float& v : values) {
    v = std::exp(v - max_value);
    sum += v;
  }
  for (float& v : values) v = static_cast<float>(v / sum);
}

void topk_indices(std::span<const float> values, std::span<int32_t> out) {
  const auto k = static_cast<int64_t>(out.size()), n = static_cast<int64_t>(values.size());
  R3_CHECK(k <= n, "top-k: k = ", k, " with ", n, " values");
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = values[static_cast<std::size_t>(i)];
    // The first kept entry with a strictly smaller value: equal values stay ahead (lower index).
    int64_t at = kept;
    while (at > 0 && values[static_cast<std::size_t>(out[static_cast<std::size_t>(at - 1)])] < v) --at;
    if (at >= k) continue;
    for (int64_t j = std::min(kept, k - 1); j > at; --j) out[static_cast<std::size_t>(j)] = out[static_cast<std::size_t>(j - 1)];
    out[static_cast<std::size_t>(at)] = static_cast<int32_t>(i);
    kept = std::min(kept + 1, k);
  }
}

std::vector<int32_t> topk_indices(std::span<const float> values, int64_t k) {
  R3_CHECK(k >= 0 && k <= static_cast<int64_t>(values.size()), "top-k: k = ", k, " with ",
           values.size(), " values");
  std::vector<int32_t> out(static_cast<std::size_t>(k));
  topk_indices(values, out);
  return out;
}

std::vector<int32_t> torch_cpu_topk_set(std::span<const float> values, int64_t k) {
  const auto n = static_cast<int64_t>(values.size());
  R3_CHECK(k >= 0 && k <= n, "top-k: k = ", k, " with ", n, " values");
  std::vector<int32_t> out;
  if (k == 0) return out;
  auto nan_first_greater = [](double a, double b) { return (std::isnan(a) && !std::isnan(b)) || a > b; };
  if (k * 64 <= n) {  // torch's fast path: partial_sort of an index vector
    std::vector<int64_t> idx(static_cast<std::size_t>(n));
    std::iota(idx.begin(), idx.end(), int64_t{0});
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int64_t a, int64_t b) { return nan_first_greater(values[a], values[b]); });
    for (int64_t j = 0; j < k; ++j) out.push_back(static_cast<int32_t>(idx[j]));
    return out;
  }
  // (value, index) pairs in accumulate precision (double), nth_element at k - 1.
  std::vector<std::pair<double, int64_t>> queue(static_cast<std::size_t>(n));
  for (int64_t j = 0; j < n; ++j) queue[j] = {values[j], j};
  std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(),
                   [&](const auto& x, const auto& y) { return nan_first_greater(x.first, y.first); });
  for (int64_t j = 0; j < k; ++j) out.push_back(static_cast<int32_t>(queue[j].second));
  return out;
}

}  // namespace r3::ops
