// What callers (engine, CLI) need to know about a loaded model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace r3::models {

struct ModelInfo {
  std::string family;
  std::string architecture;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t max_position_embeddings = 0;
  std::vector<int64_t> moe_layers;  // indices among all layers; the routed-experts layer axis
  int64_t num_experts = 0;
  int64_t top_k = 0;
  std::vector<int32_t> eos_token_ids;
};

}  // namespace r3::models
