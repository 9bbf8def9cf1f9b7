// Tokens each physical expert received in one step, per MoE layer: what the EPLB map counts while
// it maps (padding rows excluded) and the engine's EPLB control consumes. Owned by the step, so
// a model's forward changes no state of the model.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace r3::moe {

class ExpertLoads {
 public:
  // One row of counts per MoE layer, `num_physical[j]` wide.
  explicit ExpertLoads(const std::vector<int64_t>& num_physical);

  void clear();
  std::span<int64_t> layer(int64_t moe_layer);
  std::span<const int64_t> layer(int64_t moe_layer) const;
  int64_t num_layers() const { return static_cast<int64_t>(counts_.size()); }

 private:
  std::vector<std::vector<int64_t>> counts_;
};

// Where the EPLB map of one layer counts a step's tokens: that layer's counts, and which rows of
// the step are padding (not counted). Empty counts: nothing is counted.
struct LoadCount {
  std::span<int64_t> counts;           // [num_physical]
  std::span<const uint8_t> padding;    // [tokens]; 1 = padding row; empty: no padding
};

}  // namespace r3::moe
