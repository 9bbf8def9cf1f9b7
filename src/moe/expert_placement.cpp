#include "moe/expert_placement.h"

#include "core/check.h"

namespace r3::moe {

ExpertPlacement::ExpertPlacement(std::vector<int32_t> physical_to_logical, int64_t num_logical)
    : physical_to_logical_(std::move(physical_to_logical)),
      replicas_(static_cast<std::size_t>(num_logical)) {
  R3_CHECK(num_logical > 0, "placement: no logical experts");
  for (std::size_t p = 0; p < physical_to_logical_.size(); ++p) {
    const int32_t l = physical_to_logical_[p];
    R3_CHECK(l >= 0 && l < num_logical, "placement: physical expert ", p, " holds expert ", l,
             ", outside [0, ", num_logical, ")");
    replicas_[static_cast<std::size_t>(l)].push_back(static_cast<int32_t>(p));
  }
  for (int64_t l = 0; l < num_logical; ++l) {
    R3_CHECK(!replicas_[static_cast<std::size_t>(l)].empty(), "placement: logical expert ", l,
             " has no physical replica");
  }
}

ExpertPlacement ExpertPlacement::initial(int64_t num_logical, int64_t num_redundant) {
  R3_CHECK(num_redundant >= 0, "redundant experts must be >= 0, got ", num_redundant);
  std::vector<int32_t> p2l;
  for (int64_t p = 0; p < num_logical + num_redundant; ++p) {
    p2l.push_back(static_cast<int32_t>(p % num_logical));
  }
  return ExpertPlacement(std::move(p2l), num_logical);
}

int32_t ExpertPlacement::choose(int32_t logical, int64_t token_index, int64_t choice,
                                int64_t top_k) const {
  const auto& r = replicas(logical);
  return r[static_cast<std::size_t>((token_index * top_k + choice) % static_cast<int64_t>(r.size()))];
}

}  // namespace r3::moe
