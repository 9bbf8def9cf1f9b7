#include "models/forward_batch.h"

#include <algorithm>

namespace r3::models {

std::span<const int32_t> ForwardBatch::forced_for_layer(backend::Workspace& workspace, int64_t j,
                                                        int64_t moe_layers, int64_t k) const {
  if (forced_routing.empty()) return {};
  const std::span<int32_t> out = workspace.array<int32_t>(size() * k);
  for (int64_t t = 0; t < size(); ++t) {
    std::copy_n(forced_routing.begin() + (t * moe_layers + j) * k, k, out.begin() + t * k);
  }
  return out;
}

ops::StepView ForwardBatch::view() const {
  ops::StepView v;
  v.tokens = size();
  v.token_ids = token_ids.data();
  v.positions = positions.data();
  v.seqs = seqs.data();
  for (std::size_t t = 0; t < seqs.size(); ++t) {
    if (seqs[t] != kPadding) v.max_context = std::max<int64_t>(v.max_context, positions[t] + 1);
  }
  return v;
}

std::span<const uint8_t> ForwardBatch::padding_mask(backend::Workspace& workspace) const {
  const std::span<uint8_t> mask = workspace.array<uint8_t>(static_cast<int64_t>(seqs.size()));
  for (std::size_t t = 0; t < seqs.size(); ++t) mask[t] = seqs[t] == kPadding ? 1 : 0;
  return mask;
}

ForwardBatch ForwardBatch::sequence(const std::vector<int32_t>& ids, int32_t start, int32_t seq) {
  ForwardBatch b;
  b.token_ids = ids;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    b.positions.push_back(start + static_cast<int32_t>(i));
    b.seqs.push_back(seq);
  }
  return b;
}

}  // namespace r3::models
