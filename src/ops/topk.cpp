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

std::vector<int32_t> topk_indices(std::span<const float> values, int64_t k) {
  R3_CHECK(k >= 0 && k <= static_cast<int64_t>(values.size()), "top-k: k = ", k, " with ",
           values.size(), " values");
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  order.resize(static_cast<std::size_t>(k));
  return order;
}

}  // namespace r3::ops
