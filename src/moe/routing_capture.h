// Collects the routed expert ids of one forward step: a buffer [tokens, num_moe_layers, top_k]
// with rows in the step's token order. The MoE layer writes its layer's column right after
// routing and before anything maps logical ids elsewhere; the engine hands rows to requests.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace r3::moe {

class RoutingCapture {
 public:
  RoutingCapture(int64_t num_moe_layers, int64_t top_k) : layers_(num_moe_layers), top_k_(top_k) {}

  // Starts a step of `tokens` rows; every layer must then record exactly once.
  void begin_step(int64_t tokens);
  // ids, weights: [tokens, top_k] logical expert ids chosen by MoE layer `moe_layer` (index
  // among MoE layers, assigned when the model was built) and their combine weights.
  void record(int64_t moe_layer, std::span<const int32_t> ids, std::span<const float> weights);
  // Checks every layer recorded this step.
  void end_step() const;

  int64_t tokens() const { return tokens_; }
  int64_t num_moe_layers() const { return layers_; }
  int64_t top_k() const { return top_k_; }
  // Row of token t: [num_moe_layers, top_k].
  std::span<const int32_t> row(int64_t t) const;
  // Combine weights of token t, same layout as row(t).
  std::span<const float> weights_row(int64_t t) const;

 private:
  int64_t layers_;
  int64_t top_k_;
  int64_t tokens_ = 0;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
  std::vector<bool> recorded_;
};

}  // namespace r3::moe
