// Where each logical expert lives: physical experts, each holding one logical expert, with every
// logical expert held by one or more physical experts (replicas). A token's k-th choice picks
// replica (token_index * top_k + choice) % replica_count, deterministically, as vLLM does.
#pragma once

#include <cstdint>
#include <vector>

namespace r3::moe {

class ExpertPlacement {
 public:
  // physical_to_logical[p] = logical expert held by physical expert p. Throws unless every
  // logical expert in [0, num_logical) has at least one.
  ExpertPlacement(std::vector<int32_t> physical_to_logical, int64_t num_logical);

  // Physical experts 0..E-1 hold experts 0..E-1; redundant physical expert E+r holds expert r % E.
  static ExpertPlacement initial(int64_t num_logical, int64_t num_redundant);

  int64_t num_logical() const { return static_cast<int64_t>(replicas_.size()); }
  int64_t num_physical() const { return static_cast<int64_t>(physical_to_logical_.size()); }
  int32_t logical_of(int32_t physical) const { return physical_to_logical_.at(static_cast<std::size_t>(physical)); }
  const std::vector<int32_t>& physical_to_logical() const { return physical_to_logical_; }
  // Physical experts holding `logical`, in ascending order.
  const std::vector<int32_t>& replicas(int32_t logical) const { return replicas_.at(static_cast<std::size_t>(logical)); }

  int32_t choose(int32_t logical, int64_t token_index, int64_t choice, int64_t top_k) const;

 private:
  std::vector<int32_t> physical_to_logical_;
  std::vector<std::vector<int32_t>> replicas_;
};

}  // namespace r3::moe
