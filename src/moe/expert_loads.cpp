#include "moe/expert_loads.h"

#include <algorithm>

#include "core/check.h"

namespace r3::moe {

ExpertLoads::ExpertLoads(const std::vector<int64_t>& num_physical) {
  for (int64_t n : num_physical) counts_.emplace_back(static_cast<std::size_t>(n), 0);
}

void ExpertLoads::clear() {
  for (auto& c : counts_) std::fill(c.begin(), c.end(), 0);
}

std::span<int64_t> ExpertLoads::layer(int64_t moe_layer) {
  R3_CHECK(moe_layer >= 0 && moe_layer < num_layers(), "expert loads: MoE layer ", moe_layer, " out of range");
  return counts_[static_cast<std::size_t>(moe_layer)];
}

std::span<const int64_t> ExpertLoads::layer(int64_t moe_layer) const {
  return const_cast<ExpertLoads*>(this)->layer(moe_layer);
}

}  // namespace r3::moe
