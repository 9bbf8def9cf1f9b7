// A routing to replay, read from a file: the `routed_experts` layout of `r3 generate --json`
// ([rows][MoE layers][top_k], or the whole JSON object holding it) or a safetensors file with
// `topk_ids` [rows, MoE layers, top_k] (as written by `r3 forward --dump`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace r3::engine {

struct RoutingReplay {
  std::string path;  // for messages
  int64_t rows = 0, layers = 0, top_k = 0;
  std::vector<int32_t> ids;  // [rows, layers, top_k]
  // What a JSON object written by `r3 generate --json` says the rows belong to: row i is the
  // routing of token i of prompt_ids + output_ids. Absent for a bare list or a safetensors file.
  std::optional<std::vector<int32_t>> prompt_ids, output_ids;

  // Rows [first, first + count) flattened.
  std::vector<int32_t> slice(int64_t first, int64_t count) const;
  // generate: the file's prompt_ids, when it has them, must be the prompt being generated from.
  void check_prompt(const std::vector<int32_t>& prompt) const;
  // forward: `ids` must start the token sequence the rows were recorded for, as far as the file
  // says what it was.
  void check_inputs(const std::vector<int32_t>& ids) const;
};

// Throws r3::Error naming the file and the problem: unreadable, wrong layout, a layer count or
// top-k that differs from the model's, an id outside [0, num_experts) (checked before any
// narrowing, naming row, layer and value), an id repeated in a row, prompt_ids / output_ids that
// are not token-id lists or do not account for the rows (prompt + output - 1).
RoutingReplay load_routing_replay(const std::string& path, int64_t num_moe_layers, int64_t top_k,
                                  int64_t num_experts);

}  // namespace r3::engine
