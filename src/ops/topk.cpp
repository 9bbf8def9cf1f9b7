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

void torch_cpu_topk_set(std::span<const float> values, int64_t k, std::span<std::pair<double, int64_t>> scratch,
                        std::span<int32_t> out) {
  const auto n = static_cast<int64_t>(values.size());
  R3_CHECK(k >= 0 && k <= n, "top-k: k = ", k, " with ", n, " values");
  R3_CHECK(static_cast<int64_t>(scratch.size()) >= n && static_cast<int64_t>(out.size()) >= k,
           "top-k: scratch for ", scratch.size(), " values and room for ", out.size(), " of ", n, " values, k = ", k);
  if (k == 0) return;
  auto nan_first_greater = [](double a, double b) { return (std::isnan(a) && !std::isnan(b)) || a > b; };
  if (k * 64 <= n) {  // torch's fast path: partial_sort of an index vector (here: the pairs' indices)
    for (int64_t j = 0; j < n; ++j) scratch[j] = {0.0, j};
    std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.begin() + n, [&](const auto& a, const auto& b) {
      return nan_first_greater(values[a.second], values[b.second]);
    });
    for (int64_t j = 0; j < k; ++j) out[j] = static_cast<int32_t>(scratch[j].second);
    return;
  }
  // (value, index) pairs in accumulate precision (double), nth_element at k - 1.
  for (int64_t j = 0; j < n; ++j) scratch[j] = {values[j], j};
  std::nth_element(scratch.begin(), scratch.begin() + k - 1, scratch.begin() + n,
                   [&](const auto& x, const auto& y) { return nan_first_greater(x.first, y.first); });
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<int32_t>(scratch[j].second);
}

std::vector<int32_t> torch_cpu_topk_set(std::span<const float> values, int64_t k) {
  R3_CHECK(k >= 0 && k <= static_cast<int64_t>(values.size()), "top-k: k = ", k, " with ", values.size(), " values");
  std::vector<std::pair<double, int64_t>> scratch(values.size());
  std::vector<int32_t> out(static_cast<std::size_t>(k));
  torch_cpu_topk_set(values, k, scratch, out);
  return out;
}

}  // namespace r3::ops
