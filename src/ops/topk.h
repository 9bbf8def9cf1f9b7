// Row-wise softmax and top-k selection for routers and samplers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace r3::ops {

// In place, numerically stable (max subtracted).
void softmax(std::span<float> values);

// Indices of the k largest values, largest first; ties go to the lower index (as a stable
// descending sort would order them).
std::vector<int32_t> topk_indices(std::span<const float> values, int64_t k);

}  // namespace r3::ops
