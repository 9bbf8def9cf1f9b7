// The tokens of one forward step: which sequence slot each belongs to and at which position.
// A sequence's tokens in a step are consecutive positions continuing its cached prefix.
#pragma once

#include <cstdint>
#include <vector>

namespace r3::models {

struct ForwardBatch {
  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int32_t> slots;  // KV cache slot of each token
  // Token rows to compute logits for (lm_head is the largest matmul); empty means every row.
  std::vector<int64_t> logit_rows;

  int64_t size() const { return static_cast<int64_t>(token_ids.size()); }

  // One sequence: `ids` at positions start, start+1, ... in `slot`.
  static ForwardBatch sequence(const std::vector<int32_t>& ids, int32_t start, int32_t slot = 0);
};

}  // namespace r3::models
