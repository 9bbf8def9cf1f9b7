#include "moe/routing_capture.h"

#include <algorithm>

#include "core/check.h"

namespace r3::moe {

void RoutingCapture::begin_step(int64_t tokens) {
  tokens_ = tokens;
  ids_.assign(static_cast<std::size_t>(tokens * layers_ * top_k_), -1);
  weights_.assign(ids_.size(), 0.0f);
  recorded_.assign(static_cast<std::size_t>(layers_), false);
}

void RoutingCapture::record(int64_t moe_layer, std::span<const int32_t> ids,
                            std::span<const float> weights) {
  R3_CHECK(moe_layer >= 0 && moe_layer < layers_, "capture: MoE layer ", moe_layer,
           " out of range [0, ", layers_, ")");
  R3_CHECK(static_cast<int64_t>(ids.size()) == tokens_ * top_k_, "capture: layer ", moe_layer,
           " gave ", ids.size(), " ids for ", tokens_, " tokens x top-", top_k_);
  R3_CHECK(weights.size() == ids.size(), "capture: layer ", moe_layer, " gave ", weights.size(),
           " weights for ", ids.size(), " ids");
  for (int64_t t = 0; t < tokens_; ++t) {
    std::copy_n(ids.begin() + t * top_k_, top_k_,
                ids_.begin() + (t * layers_ + moe_layer) * top_k_);
    std::copy_n(weights.begin() + t * top_k_, top_k_,
                weights_.begin() + (t * layers_ + moe_layer) * top_k_);
  }
  recorded_[static_cast<std::size_t>(moe_layer)] = true;
}

void RoutingCapture::end_step() const {
  for (int64_t l = 0; l < layers_; ++l) {
    R3_CHECK(recorded_[static_cast<std::size_t>(l)], "capture: MoE layer ", l,
             " recorded no routing this step");
  }
}

std::span<const int32_t> RoutingCapture::row(int64_t t) const {
  R3_CHECK(t >= 0 && t < tokens_, "capture: row ", t, " out of range");
  return {ids_.data() + t * layers_ * top_k_, static_cast<std::size_t>(layers_ * top_k_)};
}

}  // namespace r3::moe

namespace r3::moe {

std::span<const float> RoutingCapture::weights_row(int64_t t) const {
  R3_CHECK(t >= 0 && t < tokens_, "capture: row ", t, " out of range");
  return {weights_.data() + t * layers_ * top_k_, static_cast<std::size_t>(layers_ * top_k_)};
}

}  // namespace r3::moe
