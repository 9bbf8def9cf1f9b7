// A routing to replay, read from a file: the `routed_experts` layout of `r3 generate --json`
// ([rows][MoE layers][top_k], or the whole JSON object holding it) or a safetensors file with
// `topk_ids` [rows, MoE layers, top_k] (as written by `r3 forward --dump`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace r3::engine {

struct RoutingReplay {
  int64_t rows = 0, layers = 0, top_k = 0;
  std::vector<int32_t> ids;  // [rows, layers, top_k]

  // Rows [first, first + count) flattened.
  std::vector<int32_t> slice(int64_t first, int64_t count) const;
};

// Throws r3::Error naming the file and the problem: unreadable, wrong layout, a layer count or
// top-k that differs from the model's, an id outside [0, num_experts), an id repeated in a row.
RoutingReplay load_routing_replay(const std::string& path, int64_t num_moe_layers, int64_t top_k,
                                  int64_t num_experts);

}  // namespace r3::engine
