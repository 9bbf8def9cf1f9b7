// Row-wise softmax and top-k selection for routers and samplers.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace r3::ops {

// In place, numerically stable (max subtracted).
void softmax(std::span<float> values);

// Indices of the out.size() largest values into `out`, largest first; ties go to the lower index
// (as a stable descending sort would order them). Allocates nothing (it runs per token inside
// the routers): an insertion into the k best, O(n k), for the small k of routing.
void topk_indices(std::span<const float> values, std::span<int32_t> out);
// The same, returning a vector of k indices.
std::vector<int32_t> topk_indices(std::span<const float> values, int64_t k);

// The k indices PyTorch's CPU `topk` returns, as a set, ties included: it partially sorts
// (value, index) pairs with std::nth_element (or std::partial_sort when k * 64 <= n), so which
// of several equal values are kept depends on that algorithm. DeepSeek-V4's indexer scores tie
// often (ReLU zeros); matching the reference needs the same choice.
std::vector<int32_t> torch_cpu_topk_set(std::span<const float> values, int64_t k);
// The same selection without allocating: scratch holds values.size() pairs, out receives the k
// indices (in the same order as the vector form returns them).
void torch_cpu_topk_set(std::span<const float> values, int64_t k, std::span<std::pair<double, int64_t>> scratch,
                        std::span<int32_t> out);

}  // namespace r3::ops
