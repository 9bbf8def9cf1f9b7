// The routed experts of one sequence, per the data contract in DESIGN.md: rows are sequence
// positions (row i = routing computed while token i was the model input), then the model's MoE
// layers in order, then the router's top-k choices in selection order. Logical expert ids; beside
// them each row's routing margin per MoE layer (moe/routing_rule.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moe/routing_capturer.h"

namespace r3::engine {

class RoutedExperts {
 public:
  RoutedExperts(int64_t num_moe_layers, int64_t top_k) : layers_(num_moe_layers), top_k_(top_k) {}

  int64_t rows() const {
    return layers_ * top_k_ == 0 ? 0 : static_cast<int64_t>(ids_.size()) / (layers_ * top_k_);
  }
  int64_t num_moe_layers() const { return layers_; }
  int64_t top_k() const { return top_k_; }
  // ids of (row, MoE layer j, k-th choice).
  int32_t at(int64_t row, int64_t layer, int64_t choice) const;
  const std::vector<int32_t>& flat() const { return ids_; }
  // Margins [rows, MoE layers] flattened (empty after assign()).
  const std::vector<float>& margins() const { return margins_; }

  // Replaces the rows by `ids` ([rows, MoE layers, top_k] flattened), without margins.
  void assign(std::vector<int32_t> ids);
  // Appends the captured row of the last step's token `row`.
  void append(const moe::RoutingCapturer& capturer, int64_t row);

 private:
  int64_t layers_;
  int64_t top_k_;
  std::vector<int32_t> ids_;
  std::vector<float> margins_;
};

}  // namespace r3::engine
