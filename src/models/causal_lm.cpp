#include "models/causal_lm.h"

#include <algorithm>

#include "core/check.h"

namespace r3::models {

void ModelCache::set_block_table(int64_t seq, std::span<const int32_t> blocks) {
  (void)blocks;
  R3_FAIL("this cache's blocks are fixed per sequence: no block table can be set (sequence ", seq, ")");
}

void CausalLM::set_eplb_options(const moe::EplbOptions& options) {
  options.validate();
  if (options.active()) {
    for (moe::MoeBlock* block : moe_blocks()) {
      moe::validate_topology(options.topology, block->experts().num_logical(), block->experts().num_physical());
    }
  }
  eplb_options_ = options;
}

void CausalLM::set_parameters(std::shared_ptr<const ParameterTable> table) {
  R3_CHECK(table != nullptr, "set_parameters: no table");
  parameters_ = std::move(table);
}

Tensor CausalLM::forward(backend::Context& ctx, const ForwardBatch& batch, ModelCache& cache) const {
  Tensor logits = Tensor::empty(DType::F32, {logit_row_count(batch), info().vocab_size});
  forward_into(ctx, batch, cache, logits);
  return logits;
}

void CausalLM::forward_drawn(backend::Context&, const ForwardBatch&, ModelCache&, std::span<const ops::TokenDraw>,
                             std::span<ops::DrawnToken>) const {
  R3_FAIL(info().architecture, " does not draw tokens itself: draw from forward_into's logits");
}

int64_t logit_row_count(const ForwardBatch& batch) {
  return batch.logit_rows.empty() ? batch.size() : static_cast<int64_t>(batch.logit_rows.size());
}

void check_logits_shape(const ForwardBatch& batch, const ModelInfo& info, const Tensor& logits) {
  R3_CHECK(logits.dtype() == DType::F32 && logits.shape() == Shape({logit_row_count(batch), info.vocab_size}),
           "forward: logits must be F32 [", logit_row_count(batch), ", ", info.vocab_size, "], got ",
           shape_to_string(logits.shape()));
}

void validate_batch(backend::Workspace& workspace, const ForwardBatch& batch, const ModelCache& cache,
                    const ModelInfo& info) {
  backend::Workspace::Scope scope(workspace);
  const auto n = static_cast<std::size_t>(batch.size());
  R3_CHECK(n > 0, "forward: empty batch");
  R3_CHECK(batch.positions.size() == n && batch.seqs.size() == n,
           "forward: token_ids, positions and seqs must have the same length");
  // The position each sequence's next token must have; -1: the sequence has no token yet.
  const std::span<int64_t> next = workspace.array<int64_t>(cache.max_seqs());
  std::fill(next.begin(), next.end(), -1);
  for (std::size_t t = 0; t < n; ++t) {
    const int32_t id = batch.token_ids[t];
    R3_CHECK(id >= 0 && id < info.vocab_size, "token id ", id, " is outside the vocabulary [0, ",
             info.vocab_size, ")");
    const int32_t seq = batch.seqs[t];
    if (seq == ForwardBatch::kPadding) continue;
    R3_CHECK(seq >= 0 && seq < cache.max_seqs(), "forward: seq ", seq, " out of range");
    int64_t& expected = next[static_cast<std::size_t>(seq)];
    if (expected < 0) expected = cache.length(seq);
    R3_CHECK(batch.positions[t] == expected, "forward: seq ", seq, " expects position ", expected,
             ", got ", batch.positions[t]);
    R3_CHECK(batch.positions[t] < cache.capacity(), "sequence of ", batch.positions[t] + 1,
             " tokens exceeds the cache capacity of ", cache.capacity());
    ++expected;
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
