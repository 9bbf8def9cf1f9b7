// The capture buffer of one engine: [max tokens per step, num MoE layers, top_k] logical ids in
// the narrowest integer type that holds every expert id (uint8 up to 256 experts, else uint16),
// preallocated once. Rows are the step's tokens in batch order; the engine hands each request
// its rows after the step, with each row's routing margin per layer (moe/routing_rule.h; NaN
// where the path did not compute it). Optionally keeps the combine weights too (for
// `r3 forward --dump`).
#pragma once

#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "moe/capture.h"

namespace r3::moe {

class RoutingCapturer final : public CaptureBuffer {
 public:
  RoutingCapturer(int64_t max_tokens, int64_t num_moe_layers, int64_t top_k, int64_t num_experts,
                  bool keep_weights = false);

  // Called by each MoE layer's capture point, once per step.
  void record(int64_t layer, std::span<const int32_t> ids, std::span<const float> weights,
              std::span<const float> margins) override;
  // Every layer in one pass over the rows (a device step's ids come in this buffer's own
  // [tokens, layers, top_k] order); layer by layer unless all of them are routed.
  void record_layers(int64_t routed, int64_t layers, int64_t tokens, int64_t top_k, std::span<const int32_t> ids,
                     std::span<const float> weights, std::span<const float> margins) override;

  // Starts a step of `tokens` rows (<= max_tokens); every MoE layer must then record once.
  void begin_step(int64_t tokens);
  // Throws unless every layer recorded exactly once this step.
  void end_step() const;
  bool recorded(int64_t moe_layer) const { return recorded_.at(static_cast<std::size_t>(moe_layer)); }

  int64_t max_tokens() const { return max_tokens_; }
  int64_t tokens() const { return tokens_; }
  int64_t num_moe_layers() const { return layers_; }
  int64_t top_k() const { return top_k_; }
  std::size_t element_size() const;  // 1 or 2 bytes

  int32_t id(int64_t token, int64_t layer, int64_t choice) const;
  float weight(int64_t token, int64_t layer, int64_t choice) const;
  float margin(int64_t token, int64_t layer) const;
  // Appends the [layers * top_k] ids of `token` to `out`.
  void append_row(int64_t token, std::vector<int32_t>& out) const;
  // Appends the [layers] margins of `token` to `out`.
  void append_margins(int64_t token, std::vector<float>& out) const;

 private:
  std::size_t index(int64_t token, int64_t layer, int64_t choice) const;

  int64_t max_tokens_, layers_, top_k_, num_experts_;
  bool keep_weights_;
  int64_t tokens_ = 0;
  std::variant<std::vector<uint8_t>, std::vector<uint16_t>> ids_;
  std::vector<float> weights_;
  std::vector<float> margins_;  // [max_tokens, layers]
  std::vector<bool> recorded_;
};

}  // namespace r3::moe
