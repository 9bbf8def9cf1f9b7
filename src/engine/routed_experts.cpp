#include "engine/routed_experts.h"

#include "core/check.h"

namespace r3::engine {

int32_t RoutedExperts::at(int64_t row, int64_t layer, int64_t slot) const {
  R3_CHECK(row >= 0 && row < rows() && layer >= 0 && layer < layers_ && slot >= 0 && slot < top_k_,
           "routed experts: index (", row, ", ", layer, ", ", slot, ") out of range");
  return ids_[static_cast<std::size_t>((row * layers_ + layer) * top_k_ + slot)];
}

void RoutedExperts::append(const moe::RoutingCapture& capture, int64_t first, int64_t count) {
  R3_CHECK(capture.num_moe_layers() == layers_ && capture.top_k() == top_k_,
           "routed experts: capture layout differs");
  for (int64_t t = first; t < first + count; ++t) {
    auto row = capture.row(t);
    ids_.insert(ids_.end(), row.begin(), row.end());
  }
}

}  // namespace r3::engine
