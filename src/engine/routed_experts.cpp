#include "engine/routed_experts.h"

#include "core/check.h"

namespace r3::engine {

int32_t RoutedExperts::at(int64_t row, int64_t layer, int64_t choice) const {
  R3_CHECK(row >= 0 && row < rows() && layer >= 0 && layer < layers_ && choice >= 0 && choice < top_k_,
           "routed experts: index (", row, ", ", layer, ", ", choice, ") out of range");
  return ids_[static_cast<std::size_t>((row * layers_ + layer) * top_k_ + choice)];
}

void RoutedExperts::assign(std::vector<int32_t> ids) {
  R3_CHECK(layers_ * top_k_ > 0 ? ids.size() % static_cast<std::size_t>(layers_ * top_k_) == 0 : ids.empty(),
           "routed experts: ", ids.size(), " ids are not whole rows of ", layers_, " x ", top_k_);
  ids_ = std::move(ids);
  margins_.clear();
}

void RoutedExperts::append(const moe::RoutingCapturer& capturer, int64_t row) {
  R3_CHECK(capturer.num_moe_layers() == layers_ && capturer.top_k() == top_k_,
           "routed experts: capture layout differs");
  capturer.append_row(row, ids_);
  capturer.append_margins(row, margins_);
}

}  // namespace r3::engine
