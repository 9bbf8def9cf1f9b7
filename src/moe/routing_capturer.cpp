#include "moe/routing_capturer.h"

#include <algorithm>
#include <limits>

#include "core/check.h"

namespace r3::moe {

RoutingCapturer::RoutingCapturer(int64_t max_tokens, int64_t num_moe_layers, int64_t top_k,
                                 int64_t num_experts, bool keep_weights)
    : max_tokens_(max_tokens),
      layers_(num_moe_layers),
      top_k_(top_k),
      num_experts_(num_experts),
      keep_weights_(keep_weights),
      recorded_(static_cast<std::size_t>(num_moe_layers), false) {
  R3_CHECK(max_tokens > 0 && num_moe_layers >= 0 && top_k > 0, "capturer: bad dimensions");
  R3_CHECK(num_experts > 0 && num_experts <= 65536, "capturer: ", num_experts,
           " experts do not fit 16-bit ids");
  const auto n = static_cast<std::size_t>(max_tokens * num_moe_layers * top_k);
  if (num_experts <= 256) {
    ids_ = std::vector<uint8_t>(n);
  } else {
    ids_ = std::vector<uint16_t>(n);
  }
  if (keep_weights_) weights_.assign(n, 0.0f);
  margins_.assign(static_cast<std::size_t>(max_tokens * num_moe_layers), 0.0f);
}

std::size_t RoutingCapturer::element_size() const {
  return std::holds_alternative<std::vector<uint8_t>>(ids_) ? 1 : 2;
}


void RoutingCapturer::begin_step(int64_t tokens) {
  R3_CHECK(tokens >= 0 && tokens <= max_tokens_, "capturer: step of ", tokens,
           " tokens exceeds the buffer of ", max_tokens_);
  tokens_ = tokens;
  std::fill(recorded_.begin(), recorded_.end(), false);
}

void RoutingCapturer::end_step() const {
  for (int64_t l = 0; l < layers_; ++l) {
    R3_CHECK(recorded_[static_cast<std::size_t>(l)], "capture: MoE layer ", l,
             " recorded no routing this step");
  }
}

std::size_t RoutingCapturer::index(int64_t token, int64_t layer, int64_t choice) const {
  return static_cast<std::size_t>((token * layers_ + layer) * top_k_ + choice);
}

void RoutingCapturer::record(int64_t layer, std::span<const int32_t> ids, std::span<const float> weights,
                             std::span<const float> margins) {
  R3_CHECK(layer >= 0 && layer < layers_, "capture: MoE layer ", layer, " out of range [0, ",
           layers_, ")");
  R3_CHECK(!recorded_[static_cast<std::size_t>(layer)], "capture: MoE layer ", layer,
           " recorded twice in one step");
  R3_CHECK(static_cast<int64_t>(ids.size()) == tokens_ * top_k_ && weights.size() == ids.size(),
           "capture: layer ", layer, " gave ", ids.size(), " ids for ", tokens_, " tokens x top-",
           top_k_);
  R3_CHECK(margins.empty() || static_cast<int64_t>(margins.size()) == tokens_, "capture: layer ", layer, " gave ",
           margins.size(), " margins for ", tokens_, " tokens");
  std::visit(
      [&](auto& buffer) {
        using T = typename std::decay_t<decltype(buffer)>::value_type;
        for (int64_t t = 0; t < tokens_; ++t) {
          for (int64_t k = 0; k < top_k_; ++k) {
            const int32_t id = ids[static_cast<std::size_t>(t * top_k_ + k)];
            R3_CHECK(id >= 0 && id < num_experts_, "capture: layer ", layer, " reported expert ",
                     id, ", not a logical id in [0, ", num_experts_, ")");
            buffer[index(t, layer, k)] = static_cast<T>(id);
          }
        }
      },
      ids_);
  if (keep_weights_) {
    for (int64_t t = 0; t < tokens_; ++t) {
      for (int64_t k = 0; k < top_k_; ++k) {
        weights_[index(t, layer, k)] = weights[static_cast<std::size_t>(t * top_k_ + k)];
      }
    }
  }
  for (int64_t t = 0; t < tokens_; ++t) {
    margins_[static_cast<std::size_t>(t * layers_ + layer)] =
        margins.empty() ? std::numeric_limits<float>::quiet_NaN() : margins[static_cast<std::size_t>(t)];
  }
  recorded_[static_cast<std::size_t>(layer)] = true;
}

void RoutingCapturer::record_layers(int64_t routed, int64_t layers, int64_t tokens, int64_t top_k,
                                    std::span<const int32_t> ids, std::span<const float> weights,
                                    std::span<const float> margins) {
  if (routed != layers_ || layers != layers_) {  // a step that failed part of the way: layer by layer
    CaptureBuffer::record_layers(routed, layers, tokens, top_k, ids, weights, margins);
    return;
  }
  const auto count = static_cast<std::size_t>(tokens_ * layers_ * top_k_);
  R3_CHECK(tokens == tokens_ && top_k == top_k_ && ids.size() == count && weights.size() == count &&
               margins.size() == static_cast<std::size_t>(tokens_ * layers_),
           "capture: ", routed, " layers of ", tokens, " tokens x top-", top_k, " (", ids.size(),
           " ids) for a step of ", tokens_, " tokens x ", layers_, " layers x top-", top_k_);
  for (int64_t l = 0; l < layers_; ++l) {
    R3_CHECK(!recorded_[static_cast<std::size_t>(l)], "capture: MoE layer ", l, " recorded twice in one step");
  }
  std::visit(
      [&](auto& buffer) {
        using T = typename std::decay_t<decltype(buffer)>::value_type;
        for (std::size_t i = 0; i < count; ++i) {  // the buffer's index(t, l, k) is i
          const int32_t id = ids[i];
          R3_CHECK(id >= 0 && id < num_experts_, "capture: layer ", static_cast<int64_t>(i / top_k_) % layers_,
                   " reported expert ", id, ", not a logical id in [0, ", num_experts_, ")");
          buffer[i] = static_cast<T>(id);
        }
      },
      ids_);
  if (keep_weights_) {
    for (int64_t l = 0; l < layers_; ++l) {
      for (int64_t t = 0; t < tokens_; ++t) {
        for (int64_t k = 0; k < top_k_; ++k) {
          weights_[index(t, l, k)] = weights[static_cast<std::size_t>((l * tokens_ + t) * top_k_ + k)];
        }
      }
    }
  }
  std::copy_n(margins.begin(), margins.size(), margins_.begin());
  std::fill(recorded_.begin(), recorded_.end(), true);
}

int32_t RoutingCapturer::id(int64_t token, int64_t layer, int64_t choice) const {
  R3_CHECK(token >= 0 && token < tokens_ && layer >= 0 && layer < layers_ && choice >= 0 &&
               choice < top_k_,
           "capturer: index out of range");
  return std::visit([&](const auto& buffer) { return static_cast<int32_t>(buffer[index(token, layer, choice)]); },
                    ids_);
}

float RoutingCapturer::weight(int64_t token, int64_t layer, int64_t choice) const {
  R3_CHECK(keep_weights_, "capturer: weights were not kept");
  R3_CHECK(token >= 0 && token < tokens_, "capturer: row out of range");
  return weights_[index(token, layer, choice)];
}

float RoutingCapturer::margin(int64_t token, int64_t layer) const {
  R3_CHECK(token >= 0 && token < tokens_ && layer >= 0 && layer < layers_, "capturer: index out of range");
  return margins_[static_cast<std::size_t>(token * layers_ + layer)];
}

void RoutingCapturer::append_margins(int64_t token, std::vector<float>& out) const {
  for (int64_t l = 0; l < layers_; ++l) out.push_back(margin(token, l));
}

void RoutingCapturer::append_row(int64_t token, std::vector<int32_t>& out) const {
  for (int64_t l = 0; l < layers_; ++l) {
    for (int64_t k = 0; k < top_k_; ++k) out.push_back(id(token, l, k));
  }
}

}  // namespace r3::moe
