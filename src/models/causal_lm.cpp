#include "models/causal_lm.h"

#include <map>

namespace r3::models {

void CausalLM::set_eplb_options(const moe::EplbOptions& options) {
  options.validate();
  if (options.active()) {
    for (moe::MoeBlock* block : moe_blocks()) {
      moe::validate_topology(options.topology, block->experts().num_logical(), block->experts().num_physical());
    }
  }
  eplb_options_ = options;
}

void validate_batch(const ForwardBatch& batch, const ModelCache& cache, const ModelInfo& info) {
  const auto n = static_cast<std::size_t>(batch.size());
  R3_CHECK(n > 0, "forward: empty batch");
  R3_CHECK(batch.positions.size() == n && batch.slots.size() == n,
           "forward: token_ids, positions and slots must have the same length");
  std::map<int32_t, int64_t> next;
  for (std::size_t t = 0; t < n; ++t) {
    const int32_t id = batch.token_ids[t];
    R3_CHECK(id >= 0 && id < info.vocab_size, "token id ", id, " is outside the vocabulary [0, ",
             info.vocab_size, ")");
    const int32_t slot = batch.slots[t];
    if (slot == ForwardBatch::kPadding) continue;
    R3_CHECK(slot >= 0 && slot < cache.max_slots(), "forward: slot ", slot, " out of range");
    auto [it, fresh] = next.try_emplace(slot, cache.length(slot));
    R3_CHECK(batch.positions[t] == it->second, "forward: slot ", slot, " expects position ", it->second,
             ", got ", batch.positions[t]);
    R3_CHECK(batch.positions[t] < cache.capacity(), "sequence of ", batch.positions[t] + 1,
             " tokens exceeds the cache capacity of ", cache.capacity());
    ++it->second;
  }
  const auto per_token = static_cast<std::size_t>(info.moe_layers.size() * info.top_k);
  R3_CHECK(batch.forced_routing.empty() || batch.forced_routing.size() == n * per_token,
           "replayed routing has ", batch.forced_routing.size(), " ids for ", n, " tokens x ",
           info.moe_layers.size(), " MoE layers x top-", info.top_k);
  R3_CHECK(batch.replayed.empty() || (batch.replayed.size() == n && !batch.forced_routing.empty()),
           "replay mask has ", batch.replayed.size(), " rows for ", n, " tokens",
           batch.forced_routing.empty() ? " and no replayed routing" : "");
  for (int64_t row : batch.logit_rows) {
    R3_CHECK(row >= 0 && row < batch.size(), "forward: logit row ", row, " out of range");
  }
}

}  // namespace r3::models
